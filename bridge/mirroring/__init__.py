"""The readers that feed a ``bridge.Mirror`` (mirror.py) from Kafka or JetStream."""
