"""k8s-bridge: Kubernetes object changes, once and in order, onto Kafka or NATS JetStream."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typed for callers; imported lazily at run time (below)
    from bridge.mirroring.mirror import Mirror

__all__ = ["Mirror", "__version__"]


def __getattr__(name: str) -> object:
    # ``bridge.Mirror`` without importing the service for ``import bridge``.
    if name == "Mirror":
        from bridge.mirroring.mirror import Mirror

        return Mirror
    raise AttributeError(name)
