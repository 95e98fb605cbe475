"""k8s-bridge: Kubernetes object changes, once and in order, onto Kafka or NATS JetStream."""

__version__ = "0.1.0"
