"""Server-side sharded LIST and WATCH (KEP-5866, gate ``ShardedListAndWatch``).

A shard is a slice ``[start, end)`` of the 64-bit FNV-1a hash space of one
metadata field (the uid or the namespace). The API server hashes the field of
each object and sends only those in the slice when the request carries
``shardSelector=shardRange(object.metadata.uid, '0x…', '0x…')``; it echoes the
applied selector in the list's ``metadata.shardInfo.selector``. A server that
does not (the gate off, or older than 1.36) sends everything, and the client
filters with the same function, so what is published is the same either way.

The field never changes for an object, so an object never moves between shards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

ShardField = Literal["uid", "namespace"]
SHARD_FIELDS: tuple[ShardField, ...] = get_args(ShardField)
FIELD_PATHS: dict[ShardField, str] = {
    "uid": "object.metadata.uid",
    "namespace": "object.metadata.namespace",
}
HASH_SPACE = 1 << 64

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = HASH_SPACE - 1


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a, the hash of k8s.io/apimachinery/pkg/sharding.HashField."""
    h = _FNV64_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return h


def hash_field(value: str) -> int:
    """The hash the API server compares against a range, for a uid or namespace string."""
    return fnv1a64(value.encode())


def _hex(value: int) -> str:
    # The server's parser wants exactly 16 digits, but for 2**64 (17 digits).
    return f"0x{value:016x}"


@dataclass(frozen=True, slots=True)
class ShardRange:
    """One shard: hashes of ``field`` in ``[start, end)``."""

    field: ShardField
    start: int  # inclusive
    end: int  # exclusive, <= 2**64

    def __post_init__(self) -> None:
        if self.field not in FIELD_PATHS:
            raise ValueError(f"shard field {self.field!r} is not one of {', '.join(FIELD_PATHS)}")
        if not 0 <= self.start < self.end <= HASH_SPACE:
            raise ValueError(
                f"shard range [{self.start:#x}, {self.end:#x}) is empty or outside [0, 2**64)"
            )

    def selector(self) -> str:
        """The ``shardSelector`` query value, written as the server echoes it back
        (apimachinery's ``shardSelector.String()``), so the echo compares equal."""
        path = FIELD_PATHS[self.field]
        return f"shardRange({path}, '{_hex(self.start)}', '{_hex(self.end)}')"

    def contains_hash(self, h: int) -> bool:
        return self.start <= h < self.end

    def contains(self, value: str) -> bool:
        """``value``: the object's uid or namespace (empty for a cluster-scoped object)."""
        return self.start <= fnv1a64(value.encode()) < self.end

    def contains_object(self, metadata: Mapping[str, Any]) -> bool:
        """The server's decision for an object with this ``metadata`` (a missing
        field hashes as the empty string, as the Go accessor returns it)."""
        value = metadata.get(self.field) or ""
        return self.contains(value)

    def overlaps(self, other: ShardRange) -> bool:
        return self.field == other.field and self.start < other.end and other.start < self.end

    def label(self) -> str:
        """Short name for metrics, logs and resource ids: ``uid:0000-8000`` (the top
        16 bits of each bound; ``10000`` is 2**64), exact bounds in ``selector()``."""
        return f"{self.field}:{self.start >> 48:04x}-{self.end >> 48:04x}"

    def __str__(self) -> str:
        return self.label()


def shard_range(shards: int, index: int, field: ShardField) -> ShardRange:
    """Shard ``index`` of ``shards`` equal slices, as the API documentation splits
    them (2 shards: ``[0, 0x8000000000000000)``, ``[0x8000000000000000, 2**64)``)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    if not 0 <= index < shards:
        raise ValueError(f"shard index must be in [0, {shards}), got {index}")
    return ShardRange(field, index * HASH_SPACE // shards, (index + 1) * HASH_SPACE // shards)


def shard_ranges(shards: int, field: ShardField) -> list[ShardRange]:
    """All ``shards`` slices, in order: they cover the hash space once."""
    return [shard_range(shards, i, field) for i in range(shards)]


_ONE_RANGE = re.compile(
    r"""\s*shardRange\(\s*object\.metadata\.(uid|namespace)\s*,"""
    r"""\s*(['"])(0x[0-9a-f]{1,17})\2\s*,\s*(['"])(0x[0-9a-f]{1,17})\4\s*\)\s*"""
)


def parse_selector(selector: str) -> ShardRange | None:
    """The one range of a selector (in any CEL spelling of one ``shardRange`` call), or
    None for anything else (several ranges joined with ``||``, another field)."""
    m = _ONE_RANGE.fullmatch(selector)
    if m is None:
        return None
    try:
        return ShardRange(cast(ShardField, m.group(1)), int(m.group(3), 16), int(m.group(5), 16))
    except ValueError:
        return None
