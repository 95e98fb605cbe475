"""A compact map of key to a fixed-width packed state: the slim cache's storage.

A dict of ``str`` to ``bytes`` costs ~200 B per key at 100k keys: two objects
per entry (the key string and the packed value, 80-90 B each with their
headers) plus the dict's entry and index. Most of that is per-object
overhead, so this table amortises it: keys are spread over buckets by hash,
and each bucket is *one* ``bytes`` object holding its few keys and values,

    count (2 bytes, little-endian) | \\0 key1 \\0 key2 ... \\0 keyN \\0 | value1 ... valueN

so a key costs its UTF-8 bytes, one separator and its value, plus a share of
a bucket's header: ~90 B per key at 100k keys, none of it visible to the
cyclic GC.

A lookup hashes the key (which picks the bucket; a key string caches its
hash), finds ``\\0 key \\0`` with ``bytes.find`` inside the key section (the
separators make every match a whole key), and counts the separators before
the match to get the value's index: a few C calls, no per-key Python loop.
A write rebuilds the one bucket, a few hundred bytes. Buckets grow fourfold
once they average eight keys, so moving keys on growth costs a third of a
move per key over the table's life.

Keys holding ``\\0`` cannot be told apart from two keys, and keys that are not
valid UTF-8 cannot be encoded: ``put`` refuses them, and ``storable`` says in
advance which keys the table takes.
Kubernetes object keys (``namespace/name``) always qualify; the caller keeps
any other key elsewhere.

Iteration order is by bucket, not by insertion, as with client-go's map.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["PackedTable", "storable"]

_SEP = 0
_MIN_BUCKETS = 64
_LOAD = 8  # keys per bucket, on average, before the table grows
_GROWTH = 4
# A bucket's first bytes by its count of keys, for the common counts.
_HEADERS = [bytes((n & 0xFF, n >> 8, _SEP)) for n in range(64)]


def storable(key: str) -> bool:
    """True if the table can hold ``key``: no NUL, encodable as UTF-8."""
    if "\0" in key:
        return False
    if key.isascii():
        return True
    try:
        key.encode()
    except UnicodeEncodeError:
        return False
    return True


class PackedTable:
    """``key -> value`` for values of exactly ``width`` bytes, packed into buckets."""

    __slots__ = ("_buckets", "_last", "_len", "_mask", "_width")

    def __init__(self, width: int) -> None:
        self._width = width
        self._buckets: list[bytes | None] = [None] * _MIN_BUCKETS
        self._mask = _MIN_BUCKETS - 1
        self._len = 0
        # The last key looked up, its bucket's index and bytes and its value's
        # offset (-1: absent): an informer reads a key's old state and then
        # writes its new one, and the write then skips the search.
        self._last: tuple[str, int, bytes | None, int] | None = None

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: object) -> bool:
        # ``get`` without the value: no count of separators, no slice (asked once
        # per key of every checkpoint commit).
        if not isinstance(key, str) or not storable(key):
            return False
        bucket = self._buckets[hash(key) & self._mask]
        if bucket is None:
            return False
        end = len(bucket) - (bucket[0] | bucket[1] << 8) * self._width
        return bucket.find(f"\0{key}\0".encode(), 2, end) >= 0

    # -- lookups ------------------------------------------------------------------

    def _locate(self, key: str) -> tuple[int, bytes | None, int]:
        """The bucket's index, its bytes and the value's offset in them (-1: absent);
        index -1 for a key the table cannot hold. Only storable keys are remembered."""
        last = self._last
        if last is not None and last[0] == key and self._buckets[last[1]] is last[2]:
            return last[1], last[2], last[3]
        if not storable(key):
            return -1, None, -1
        index = hash(key) & self._mask
        bucket = self._buckets[index]
        offset = -1
        if bucket is not None:
            end = len(bucket) - (bucket[0] | bucket[1] << 8) * self._width
            found = bucket.find(f"\0{key}\0".encode(), 2, end)
            if found >= 0:
                offset = end + bucket.count(_SEP, 2, found) * self._width
        self._last = (key, index, bucket, offset)
        return index, bucket, offset

    def get(self, key: str) -> bytes | None:
        # ``_locate`` inlined: this runs several times per event.
        if not storable(key):
            return None  # never remembered: a write of it must be refused
        index = hash(key) & self._mask
        bucket = self._buckets[index]
        if bucket is None:
            self._last = (key, index, bucket, -1)
            return None
        width = self._width
        end = len(bucket) - (bucket[0] | bucket[1] << 8) * width
        found = bucket.find(f"\0{key}\0".encode(), 2, end)
        if found < 0:
            self._last = (key, index, bucket, -1)
            return None
        offset = end + bucket.count(_SEP, 2, found) * width
        self._last = (key, index, bucket, offset)
        return bucket[offset : offset + width]

    # -- writes -------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key``; False (and nothing stored) if the table
        cannot hold this key: one with a NUL, or one UTF-8 cannot encode."""
        width = self._width
        if len(value) != width:
            raise ValueError(f"value of {len(value)} bytes in a table of {width}-byte values")
        index, bucket, offset = self._locate(key)
        if index < 0:
            return False
        if offset >= 0:
            assert bucket is not None
            new = bucket[:offset] + value + bucket[offset + width :]
            self._buckets[index] = new
            self._last = (key, index, new, offset)
            return True
        if bucket is None:
            new = b"\x01\x00\x00" + key.encode() + b"\x00" + value
        else:
            count = bucket[0] | bucket[1] << 8
            end = len(bucket) - count * width
            count += 1
            new = b"".join(
                (
                    bytes((count & 0xFF, count >> 8)),
                    bucket[2:end],
                    key.encode(),
                    b"\x00",
                    bucket[end:],
                    value,
                )
            )
        self._buckets[index] = new
        self._last = (key, index, new, len(new) - width)
        self._len += 1
        if self._len > _LOAD * len(self._buckets):
            self._resize(len(self._buckets) * _GROWTH)
        return True

    def pop(self, key: str) -> bytes | None:
        """Remove ``key``; its value, or None if it was not there."""
        index, bucket, offset = self._locate(key)
        self._last = None
        if offset < 0:
            return None
        assert bucket is not None
        width = self._width
        value = bucket[offset : offset + width]
        self._len -= 1
        keys, end = self._split(bucket)
        if len(keys) == 1:
            self._buckets[index] = None
            return value
        del keys[(offset - end) // width]
        values = [bucket[end:offset], bucket[offset + width :]]
        self._buckets[index] = _joined(b"\x00".join(keys), len(keys), values)
        return value

    def clear(self) -> None:
        self._buckets = [None] * _MIN_BUCKETS
        self._mask = _MIN_BUCKETS - 1
        self._len = 0
        self._last = None

    def load(self, pairs: Iterable[tuple[str, bytes]], expected: int = 0) -> None:
        """Add many pairs at once, sized for ``expected`` keys up front. Into an empty
        table each bucket is built once. Keys must be storable; a key given twice
        keeps its last value."""
        if self._len:
            size = len(self._buckets)
            while size * _LOAD < expected:
                size *= _GROWTH
            if size != len(self._buckets):
                self._resize(size)
            for key, value in pairs:
                self.put(key, value)
            return
        width = self._width
        keys: list[str] = []
        values: list[bytes] = []
        for key, value in pairs:
            if len(value) != width:
                raise ValueError(f"value of {len(value)} bytes in a table of {width}-byte values")
            keys.append(key)
            values.append(value)
        self._build(keys, values, distinct=False)

    def load_columns(self, keys: list[str], values: list[bytes]) -> None:
        """``load`` from two columns, ``values[i]`` being ``keys[i]``'s: a restart's
        checkpoint as the store reads it, without a pair per key. The keys must be
        storable and distinct (a checkpoint's are)."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys and {len(values)} values")
        width = self._width
        if values and (len(values[0]) != width or len(set(map(len, values))) != 1):
            raise ValueError(f"values of other lengths in a table of {width}-byte values")
        if self._len:
            self.load(zip(keys, values, strict=True), self._len + len(keys))
            return
        self._build(keys, values, distinct=True)

    def _build(self, keys: list[str], values: list[bytes], *, distinct: bool) -> None:
        """Become the table of these keys and values (the table is empty): each bucket
        built once, from one list holding its keys and values in turn.

        The loop a restart runs a million times: the hashing mapped in C, one list
        per bucket (a second for the values cost ~0.3 s more at a million keys).
        """
        size = len(self._buckets)
        while size * _LOAD < len(keys):
            size *= _GROWTH
        mask = size - 1
        groups: list[list[str | bytes] | None] = [None] * size
        for index, key, value in zip(map(mask.__and__, map(hash, keys)), keys, values, strict=True):
            group = groups[index]
            if group is None:
                groups[index] = [key, value]
            else:
                group.append(key)
                group.append(value)
        buckets: list[bytes | None] = [None] * size
        count = 0
        join = b"".join
        for index, group in enumerate(groups):
            if group is None:
                continue
            ks: list[str] = group[0::2]  # type: ignore[assignment]
            vs: list[bytes] = group[1::2]  # type: ignore[assignment]
            if not distinct and len(ks) > 1 and len(set(ks)) < len(ks):
                last = dict(zip(ks, vs, strict=True))  # a key given twice: its last value
                ks, vs = list(last), list(last.values())
            n = len(ks)
            header = _HEADERS[n] if n < len(_HEADERS) else bytes((n & 0xFF, n >> 8, _SEP))
            buckets[index] = join((header, "\0".join(ks).encode(), b"\x00", *vs))
            groups[index] = None  # freed as built: the groups and the buckets never both whole
            count += n
        self._buckets, self._mask, self._len, self._last = buckets, mask, count, None

    # -- iteration ------------------------------------------------------------------

    def _split(self, bucket: bytes) -> tuple[list[bytes], int]:
        """One bucket's keys (UTF-8, in order) and the offset where its values start."""
        end = len(bucket) - (bucket[0] | bucket[1] << 8) * self._width
        return bucket[3 : end - 1].split(b"\x00"), end

    def _entries(self, bucket: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(key's UTF-8, value)`` for each key of one bucket."""
        width = self._width
        keys, end = self._split(bucket)
        for i, raw in enumerate(keys):
            yield raw, bucket[end + i * width : end + (i + 1) * width]

    def keys(self) -> Iterator[str]:
        for bucket in self._buckets:
            if bucket is not None:
                for raw in self._split(bucket)[0]:
                    yield raw.decode()

    def items(self) -> Iterator[tuple[str, bytes]]:
        for bucket in self._buckets:
            if bucket is not None:
                for raw, value in self._entries(bucket):
                    yield raw.decode(), value

    __iter__ = keys

    # -- growth ---------------------------------------------------------------------

    def _resize(self, size: int) -> None:
        """Spread every key over ``size`` buckets, a multiple of the current count.

        Bucket ``i``'s keys can only move to ``i + k * old_size``, so each bucket
        is split where it stands, one at a time: what the growth holds beyond the
        new table is one bucket's keys, not a copy of the whole table.
        """
        buckets = self._buckets
        old_size = len(buckets)
        # Extended in place: a bucket replaced by its split is freed at once.
        buckets.extend([None] * (size - old_size))
        mask = size - 1
        for i in range(old_size):
            bucket = buckets[i]
            if bucket is None:
                continue
            split: dict[int, tuple[list[bytes], list[bytes]]] = {}
            for raw, value in self._entries(bucket):
                index = hash(raw.decode()) & mask
                group = split.get(index)
                if group is None:
                    split[index] = ([raw], [value])
                else:
                    group[0].append(raw)
                    group[1].append(value)
            if len(split) == 1 and i in split:
                continue
            buckets[i] = None
            for index, (ks, vs) in split.items():
                buckets[index] = _joined(b"\x00".join(ks), len(ks), vs)
        self._mask = mask
        self._last = None


def _joined(keys: bytes, count: int, values: list[bytes]) -> bytes:
    """One bucket's bytes, from its keys joined by NULs and their values in order."""
    return b"".join((bytes((count & 0xFF, count >> 8, _SEP)), keys, b"\x00", *values))
