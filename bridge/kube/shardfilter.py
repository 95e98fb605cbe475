"""The client side of a shard: trust the server's echo, or filter with the same hash.

A ListWatch with a shard sends ``shardSelector`` everywhere. A LIST page whose
``metadata.shardInfo.selector`` echoes it was filtered by the server. Anything
else (a page without the echo, every watch event, since no watch carries an
echo) is checked here, as early as the raw-JSON path allows: an object that
is not yet known to be in the shard is first *peeked* at (msgspec reads only
``metadata.uid``/``metadata.namespace`` and skips the rest without building
it, about a quarter of the cost of decoding it), and one outside the shard is
never decoded. Where the server is known to apply the selector, the watch's
objects are decoded first and checked after (their metadata is parsed anyway),
so an honoured shard pays only a cached lookup per event.

Deletes and updates of objects outside the shard never reach the informer:
they could not be in its cache, since the object never changes shard (its uid
and namespace are fixed). Bookmarks and ERROR events always pass.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from bridge.kube.liststream import ItemDecoder, ListBody
from bridge.kube.objects import RawObject, WatchEvent
from bridge.kube.sharding import ShardRange, parse_selector
from bridge.logging import get_logger

log = get_logger(__name__)

_OBJECT_EVENTS = frozenset(("ADDED", "MODIFIED", "DELETED"))

# What the watch decoder hands back for an object outside the shard (never decoded);
# ``ShardFilter.watch`` drops it before anyone sees it.
DROPPED_EVENT: WatchEvent = {"type": "", "object": {}}


class _PeekMeta(msgspec.Struct, frozen=True):
    uid: str = ""
    namespace: str = ""


_NO_META = _PeekMeta()


class _PeekObject(msgspec.Struct):
    metadata: _PeekMeta = _NO_META


class _PeekLine(msgspec.Struct):
    type: str
    object: _PeekObject


_peek_object = msgspec.json.Decoder(_PeekObject).decode
_peek_line = msgspec.json.Decoder(_PeekLine).decode
_PEEK_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)


class ShardFilter:
    """The echo check and the filter of one ListWatch, and what they found."""

    __slots__ = (
        "_cache",
        "_field",
        "_warned",
        "dropped",
        "honoured",
        "namespace",
        "resource",
        "shard",
    )

    # value -> in shard, so an object's updates hash it once; bounded (a namespace
    # shard has few distinct values, a uid shard one per object).
    _CACHE_MAX = 1 << 16

    def __init__(self, shard: ShardRange, *, resource: str, namespace: str | None) -> None:
        self.shard = shard
        self.resource = resource
        self.namespace = namespace
        self._field = shard.field
        self._cache: dict[str, bool] = {}
        self.honoured: bool | None = None
        self.dropped = 0
        self._warned = False

    # -- what the server said -------------------------------------------------------

    def echoed(self, metadata: Any) -> bool:
        """Whether a LIST's ``metadata`` echoes this shard's selector (in any spelling
        of the same range: the server writes its own)."""
        info = metadata.get("shardInfo") if isinstance(metadata, dict) else None
        echo = info.get("selector") if isinstance(info, dict) else None
        if not isinstance(echo, str):
            return False
        return echo == self.shard.selector() or parse_selector(echo) == self.shard

    def judge(self, metadata: Any) -> bool:
        """Whether this LIST answer (its ``metadata``) echoes our selector: the server
        filtered it. Remembered as ``honoured``; the first no warns, once."""
        honoured = self.echoed(metadata)
        self._verdict(honoured)
        return honoured

    def _verdict(self, honoured: bool) -> None:
        self.honoured = honoured
        if honoured or self._warned:
            return
        self._warned = True
        log.warning(
            "the API server ignores shardSelector; filtering on the client "
            "(feature gate ShardedListAndWatch off, or a server older than 1.36)",
            resource=self.resource,
            namespace=self.namespace,
            shard=self.shard.label(),
        )

    # -- the filter --------------------------------------------------------------------

    def contains_value(self, value: str) -> bool:
        inside = self._cache.get(value)
        if inside is None:
            if len(self._cache) >= self._CACHE_MAX:
                self._cache.clear()
            inside = self._cache[value] = self.shard.contains(value)
        return inside

    def contains(self, obj: RawObject) -> bool:
        md = obj.get("metadata")
        value = md.get(self._field) if isinstance(md, dict) else None
        return self.contains_value(value if isinstance(value, str) else "")

    def keep(self, items: list[RawObject]) -> list[RawObject]:
        """Whole objects (a LIST parsed at once) in the shard."""
        kept = [o for o in items if self.contains(o)]
        self.dropped += len(items) - len(kept)
        return kept

    def item_decoder(
        self, decode: ItemDecoder, metadata: Callable[[], dict[str, Any]]
    ) -> ItemDecoder:
        """``decode`` for the items of one LIST body, leaving out (None) those outside
        the shard unless the body's ``metadata`` (written before its items) echoes
        the selector."""
        trusted: bool | None = None
        field = self._field

        def item(data: bytearray) -> RawObject | None:
            nonlocal trusted
            if trusted is None:
                trusted = self.echoed(metadata())
            if trusted:
                return decode(data)
            try:
                md = _peek_object(data).metadata
            except _PEEK_ERRORS:
                # Incomplete (the splitter's guess) or not shaped as an object: the
                # decoder says which, as it would have; a whole object is checked after.
                obj = decode(data)
                if obj is None or self.contains(obj):
                    return obj
            else:
                if self.contains_value(getattr(md, field)):
                    return decode(data)
            self.dropped += 1
            return None

        return item

    def watch_decoder(self, decode: Callable[[bytes], WatchEvent]) -> Callable[[bytes], Any]:
        """``decode`` for the lines of a watch, dropping objects outside the shard."""
        field = self._field

        def line(data: bytes) -> WatchEvent:
            if self.honoured:
                # Filtered by the server: the metadata is parsed anyway, check after.
                event = decode(data)
                if event.get("type") in _OBJECT_EVENTS and not self.contains(event["object"]):
                    return self._outside()
                return event
            try:
                peeked = _peek_line(data)
            except _PEEK_ERRORS:
                event = decode(data)
                if event.get("type") in _OBJECT_EVENTS and not self.contains(event["object"]):
                    return self._outside()
                return event
            if peeked.type in _OBJECT_EVENTS and not self.contains_value(
                getattr(peeked.object.metadata, field)
            ):
                return self._outside()
            return decode(data)

        return line

    def _outside(self) -> WatchEvent:
        self.dropped += 1
        # The server sent what the selector excludes: it did not apply it.
        self._verdict(False)
        return DROPPED_EVENT

    async def watch(self, events: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
        async for event in events:
            if event is not DROPPED_EVENT:
                yield event


class ShardedListBody:
    """A LIST answer of a shard, its items decoded through ``ShardFilter.item_decoder``."""

    def __init__(self, body: ListBody, f: ShardFilter) -> None:
        self._body = body
        self._filter = f

    @property
    def metadata(self) -> dict[str, Any]:
        return self._body.metadata

    @property
    def draining(self) -> bool:
        return self._body.draining

    def pace_until(self, deadline: float) -> None:
        self._body.pace_until(deadline)

    def __aiter__(self) -> AsyncIterator[list[RawObject]]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[RawObject]]:
        async for batch in self._body:
            yield batch
        self._filter.judge(self._body.metadata)
