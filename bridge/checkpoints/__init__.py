"""Checkpoint stores: the resourceVersion watermark and object digests, kept together."""

from bridge.checkpoints.base import Checkpoint, CheckpointStore

__all__ = ["Checkpoint", "CheckpointStore"]
