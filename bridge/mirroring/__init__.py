"""The readers that feed a ``bridge.mirror.Mirror`` from Kafka or JetStream."""
