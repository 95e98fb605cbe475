"""Read a LIST answer item by item as its body arrives, never the whole body at once.

A LIST served by the watch cache (``resourceVersion=0``) is not paginated: for
a large cluster it is hundreds of MB. Reading it whole and then decoding it
holds the bytes and every decoded item at the same time, and a full-body
``orjson.loads`` keeps all the new containers alive at once, so the cyclic
GC rescans them again and again. ``ListSplitter`` instead cuts the body into
its top-level items as chunks arrive and decodes each on its own, keeping at
most one chunk plus one unfinished item.

Finding where an item ends is the cost that matters. Scanning braces and
strings in Python runs at a tenth of orjson's speed, so the splitter guesses
instead: the items of one list are alike, and the API server writes compact
JSON, so the next item starts with ``},{"<first key>":``, a byte run that
cannot occur inside a string (an unescaped quote right after ``{``). Each
guess is checked by decoding the candidate, which is the decode we need
anyway; a candidate that ends inside the item ("unexpected end of data") is
skipped, and anything else (first item, whitespace, a different first key, an
item far larger than the others) goes to an exact, resumable scanner.

``ListBody`` wraps the splitter around a stream of body chunks for the
reflector: batches of items as they arrive, then the list's ``metadata``,
which the server may send before or after ``items``. It reads the body only
as fast as its batches are taken, so a consumer that waits for room in a
bounded queue leaves the rest of the body to TCP flow control (the kernel and
the server hold it, not this process). The API server cuts a request it has
not finished within its timeout (60 s by default), though, so after
``pace_until``'s deadline the rest of the body is read at once and held as
raw bytes (about a fifth of the decoded items' size) until it is taken.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from bridge.aiotasks import cancel_and_wait
from bridge.errors import KubeConnectionError
from bridge.kube.objects import RawObject
from bridge.kube.rawjson import IncompleteJSON

# Decodes one item's bytes; ValueError if they are not one, IncompleteJSON (or
# orjson's "unexpected end of data") if they end inside it. None: a whole item
# nobody wants (outside a shard, bridge/kube/shardfilter.py), left out.
ItemDecoder = Callable[[bytearray], RawObject | None]

__all__ = ["ListBody", "ListBodyError", "ListSplitter"]


class ListBodyError(ValueError):
    """The body is not a JSON object, or ended before it was complete."""


_STRUCT = re.compile(rb'[\[\]{}"]')
_PRIMITIVE_END = re.compile(rb"[,}\]\s]")
_WS = frozenset(b" \t\r\n")
_QUOTE, _BACKSLASH = 0x22, 0x5C
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 0x7B, 0x7D, 0x5B, 0x5D
_COMMA, _COLON = 0x2C, 0x3A
# orjson's message for input that stops inside a value: the candidate ended mid-item.
_INCOMPLETE = "unexpected end of data"


def _incomplete(e: ValueError) -> bool:
    if isinstance(e, IncompleteJSON):
        return True
    return isinstance(e, orjson.JSONDecodeError) and e.msg.startswith(_INCOMPLETE)


# An item this much larger than the largest so far (or than this floor) without a
# candidate end is not like the others: scan it exactly instead of buffering on.
_GUESS_FLOOR = 256 * 1024
_GUESS_FACTOR = 4

# Where the splitter stands in the list object.
_OPEN = 0  # before the top-level "{"
_KEY = 1  # before a key (or "}" of an empty object)
_COLON_NEXT = 2  # after a key
_VALUE = 3  # after ":"
_GENERIC = 4  # inside a value other than "items"
_AFTER = 5  # after a value: "," or "}"
_ITEMS_FIRST = 6  # after "items":[
_ITEM = 7  # inside an item
_ITEM_SEP = 8  # after an item: "," or "]"
_DONE = 9  # after the final "}"


def _string_end(buf: bytearray, pos: int) -> int:
    """Offset just past the closing quote of a string whose body starts at or before ``pos``.

    -1 when the closing quote has not arrived. The opening quote must be in
    ``buf`` (the backslash look-back stops at it).
    """
    find = buf.find
    while True:
        k = find(b'"', pos)
        if k < 0:
            return -1
        b = k - 1
        while buf[b] == _BACKSLASH:
            b -= 1
        if (k - 1 - b) % 2 == 0:  # an even run of backslashes escapes nothing
            return k + 1
        pos = k + 1


class _Scan:
    """A resumable exact scan of one JSON value: braces, brackets and strings."""

    __slots__ = ("depth", "in_string", "pos", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self.pos = start
        self.depth = 0
        self.in_string = False

    def shift(self, cut: int) -> None:
        self.start -= cut
        self.pos -= cut

    def run(self, buf: bytearray) -> int:
        """The end offset of the value once it is complete, else -1 (feed more and call again)."""
        first = buf[self.start]
        if first == _QUOTE:
            end = _string_end(buf, max(self.pos, self.start + 1))
            if end < 0:
                self.pos = len(buf)
            return end
        if first != _LBRACE and first != _LBRACKET:
            m = _PRIMITIVE_END.search(buf, self.start)
            return -1 if m is None else m.start()
        i, depth = self.pos, self.depth
        if self.in_string:
            i = _string_end(buf, i)
            if i < 0:
                self.pos = len(buf)
                return -1
            self.in_string = False
        search = _STRUCT.search
        while True:
            m = search(buf, i)
            if m is None:
                self.pos, self.depth = len(buf), depth
                return -1
            j = m.start()
            c = buf[j]
            if c == _QUOTE:
                i = _string_end(buf, j + 1)
                if i < 0:
                    self.pos, self.depth, self.in_string = len(buf), depth, True
                    return -1
            elif c == _LBRACE or c == _LBRACKET:
                depth += 1
                i = j + 1
            else:
                depth -= 1
                i = j + 1
                if depth == 0:
                    return i


class ListSplitter:
    """Cuts one LIST body (``{..., "items": [...], ...}``) into decoded items as it arrives.

    ``feed`` each chunk and take the items it completed; ``close`` at the end
    of the body returns the last ones and raises ``ListBodyError`` if the body
    was malformed or cut short. The other top-level fields (``metadata``,
    ``kind``, ``apiVersion``) are in ``envelope`` once ``close`` returned.
    """

    def __init__(self, decode: ItemDecoder = orjson.loads) -> None:
        self.envelope: dict[str, Any] = {}
        self._decode = decode
        self._buf = bytearray()
        self._pos = 0
        self._state = _OPEN
        self._key = ""
        self._empty = True  # no key seen yet: "{}" is a valid (empty) answer
        self._scan: _Scan | None = None
        self._item = 0
        # b'},{"<key>":' while items are compact and start with the same key.
        self._pattern: bytes | None = None
        self._search = 0
        self._largest = 0
        # Where the previous item ended, to tell a compact separator from one with whitespace.
        self._item_end = -2
        self._eof = False

    def feed(self, chunk: bytes | memoryview) -> list[RawObject]:
        if self._eof:
            raise ListBodyError("data after the end of the body")
        self._buf += chunk
        out: list[RawObject] = []
        self._run(out)
        self._compact()
        return out

    def close(self) -> list[RawObject]:
        self._eof = True
        out: list[RawObject] = []
        self._run(out)
        if self._state != _DONE:
            raise ListBodyError(f"body ended early ({self._where()})")
        return out

    # -- the state machine --------------------------------------------------

    def _where(self) -> str:
        if self._state in (_ITEMS_FIRST, _ITEM, _ITEM_SEP):
            return "inside items"
        if self._state == _OPEN:
            return "no JSON object"
        return f"at key {self._key!r}" if self._key else "in the list object"

    def _bad(self, what: str) -> ListBodyError:
        shown = bytes(self._buf[self._pos : self._pos + 40])
        return ListBodyError(f"{what} ({self._where()}, at {shown!r})")

    def _skip_ws(self) -> bool:
        """Move past whitespace; False when the buffer ran out."""
        buf, pos, n = self._buf, self._pos, len(self._buf)
        while pos < n and buf[pos] in _WS:
            pos += 1
        self._pos = pos
        return pos < n

    def _run(self, out: list[RawObject]) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _ITEM:
                if not self._run_item(out):
                    return
                continue
            if state == _GENERIC:
                if not self._run_generic():
                    return
                continue
            if not self._skip_ws():
                return
            c = buf[self._pos]
            if state == _ITEM_SEP:
                if c == _COMMA:
                    # Look past the comma before taking it: "[{...}," must not end the list.
                    nxt = self._pos + 1
                    while nxt < len(buf) and buf[nxt] in _WS:
                        nxt += 1
                    if nxt == len(buf):
                        return
                    if buf[nxt] != _LBRACE:
                        self._pos = nxt
                        raise self._bad("a list item is not an object")
                    self._pos = nxt
                    self._begin_item(compact=nxt == self._item_end + 1)
                elif c == _RBRACKET:
                    self._pos += 1
                    self._state = _AFTER
                else:
                    raise self._bad("expected ',' or ']' after an item")
            elif state == _ITEMS_FIRST:
                if c == _LBRACE:
                    self._begin_item(compact=False)
                elif c == _RBRACKET:
                    self._pos += 1
                    self._state = _AFTER
                else:
                    raise self._bad("a list item is not an object")
            elif state == _KEY:
                if c == _RBRACE and self._empty:
                    self._pos += 1
                    self._state = _DONE
                    continue
                if c != _QUOTE:
                    raise self._bad("expected a key")
                end = _string_end(buf, self._pos + 1)
                if end < 0:
                    return
                try:
                    self._key = orjson.loads(buf[self._pos : end])
                except orjson.JSONDecodeError as e:
                    raise self._bad(f"undecodable key: {e}") from None
                self._pos = end
                self._empty = False
                self._state = _COLON_NEXT
            elif state == _COLON_NEXT:
                if c != _COLON:
                    raise self._bad("expected ':'")
                self._pos += 1
                self._state = _VALUE
            elif state == _VALUE:
                if self._key == "items" and c == _LBRACKET:
                    self._pos += 1
                    self._state = _ITEMS_FIRST
                else:
                    self._scan = _Scan(self._pos)
                    self._state = _GENERIC
            elif state == _AFTER:
                self._pos += 1
                if c == _COMMA:
                    self._state = _KEY
                elif c == _RBRACE:
                    self._state = _DONE
                else:
                    raise self._bad("expected ',' or '}'")
            elif state == _OPEN:
                if c != _LBRACE:
                    raise self._bad("the body is not a JSON object")
                self._pos += 1
                self._state = _KEY
            else:  # _DONE
                raise self._bad("content after the list object")

    def _run_generic(self) -> bool:
        scan = self._scan
        assert scan is not None
        end = scan.run(self._buf)
        if end < 0:
            if self._eof:
                raise self._bad("body ended inside a value")
            return False
        try:
            value = orjson.loads(self._buf[scan.start : end])
        except orjson.JSONDecodeError as e:
            raise self._bad(f"undecodable value: {e}") from None
        if self._key == "items":
            if value is not None:  # "items": null is an empty list; anything else is wrong
                raise self._bad("items is not an array")
        else:
            self.envelope[self._key] = value
        self._pos = end
        self._scan = None
        self._state = _AFTER
        return True

    # -- items ----------------------------------------------------------------

    def _begin_item(self, *, compact: bool) -> None:
        buf, pos = self._buf, self._pos
        self._item = pos
        self._state = _ITEM
        self._scan = None
        self._pattern = None
        if compact and buf[pos + 1 : pos + 2] == b'"':
            key_end = _string_end(buf, pos + 2)
            if key_end > 0 and buf[key_end : key_end + 1] == b":":
                self._pattern = b"}," + bytes(buf[pos : key_end + 1])
                self._search = pos + 1
        if self._pattern is None:
            self._scan = _Scan(pos)

    def _emit(self, out: list[RawObject], start: int, end: int) -> None:
        try:
            obj = self._decode(self._buf[start:end])
        except ValueError as e:
            self._pos = start
            raise self._bad(f"undecodable item: {e}") from None
        if obj is not None:
            out.append(obj)
        if end - start > self._largest:
            self._largest = end - start
        self._item_end = end

    def _run_item(self, out: list[RawObject]) -> bool:
        """Complete as many items as the buffer holds; False when more data is needed."""
        if self._pattern is not None and not self._guess(out):
            return False
        scan = self._scan
        assert scan is not None
        end = scan.run(self._buf)
        if end < 0:
            if self._eof:
                raise self._bad("body ended inside an item")
            return False
        self._emit(out, self._item, end)
        self._pos = end
        self._scan = None
        self._state = _ITEM_SEP
        return True

    def _guess(self, out: list[RawObject]) -> bool:
        """The fast path (see the module doc): emit every item whose end a candidate proves.

        False: wait for more data. True: the exact scanner takes over the current
        item (``_pattern`` is None and ``_scan`` starts at the item).
        """
        buf = self._buf
        pattern = self._pattern
        assert pattern is not None
        find, loads = buf.find, self._decode
        item = self._item
        p = find(pattern, self._search)
        while p >= 0:
            try:
                obj = loads(buf[item : p + 1])
            except ValueError as e:
                if _incomplete(e):
                    p = find(pattern, p + 1)
                    continue
                break  # overshot an item that ended earlier, or a malformed one
            if obj is not None:
                out.append(obj)
            if p + 1 - item > self._largest:
                self._largest = p + 1 - item
            item = p + 2
            p = find(pattern, item + 1)
        else:
            self._item = self._pos = item
            self._search = max(item + 1, len(buf) - len(pattern) + 1)
            too_big = len(buf) - item > max(_GUESS_FLOOR, _GUESS_FACTOR * self._largest)
            if not (self._eof or too_big):
                return False
        self._item = self._pos = item
        self._pattern = None
        self._scan = _Scan(item)
        return True

    def _compact(self) -> None:
        """Drop the bytes already consumed; keep the unfinished item or value."""
        keep = self._pos
        if self._state == _ITEM:
            keep = self._item
        elif self._state == _GENERIC and self._scan is not None:
            keep = self._scan.start
        if keep <= 0:
            return
        del self._buf[:keep]
        self._pos -= keep
        self._item -= keep
        self._search = max(0, self._search - keep)
        self._item_end -= keep
        if self._scan is not None:
            self._scan.shift(keep)


# Socket reads can be 1 MiB: decoding a few items at a time, each handed on
# before the next is built, keeps the working set in cache (BENCHMARKS.md,
# "List decoding").
_PIECE = 16 * 1024


class _ReadAhead:
    """Body chunks pulled by a task of their own: one ahead until the deadline, all after it.

    One task owns the body's iterator, so the deadline can switch it to reading
    everything while the consumer is suspended elsewhere (waiting for room in
    the FIFO), which a timer could not do to an iterator the consumer drives.
    """

    def __init__(self, chunks: AsyncIterator[bytes], deadline: float) -> None:
        self._chunks = chunks
        self._held: deque[bytes] = deque()
        self._arrived = asyncio.Event()
        self._taken = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None
        self.draining = False
        self.held_bytes = 0
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(deadline, self._drain)
        self._task = loop.create_task(self._read(), name="list body read-ahead")

    def _drain(self) -> None:
        self.draining = True
        self._taken.set()

    async def _read(self) -> None:
        try:
            async for chunk in self._chunks:
                self._held.append(chunk)
                self.held_bytes += len(chunk)
                self._arrived.set()
                while self._held and not self.draining:
                    self._taken.clear()
                    await self._taken.wait()
        except Exception as e:  # handed to the consumer, which raises it in its own task
            self._error = e
        finally:
            self._ended = True
            self._arrived.set()

    async def next(self) -> bytes | None:
        """The next chunk, None at the end of the body."""
        while not self._held:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            self._arrived.clear()
            await self._arrived.wait()
        chunk = self._held.popleft()
        self.held_bytes -= len(chunk)
        self._taken.set()
        return chunk

    async def aclose(self) -> None:
        self._timer.cancel()
        # Awaited without swallowing a cancellation of the caller itself.
        await cancel_and_wait([self._task])


class ListBody:
    """One LIST answer read as it arrives: batches of items, then the list's ``metadata``.

    Items lack kind/apiVersion on the wire (as the API server sends them);
    they are filled in so downstream code can name the object. Body errors
    become ``KubeConnectionError``, like any answer that is not the JSON asked for.
    The body is read as the batches are taken; ``pace_until`` bounds how long
    (see the module doc). ``aclose`` before the body's stream is closed.
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        kind: str,
        api_version: str,
        what: str,
        decode: ItemDecoder = orjson.loads,
    ) -> None:
        self._chunks = chunks
        self._decode = decode
        self._kind = kind
        self._api_version = api_version
        self._what = what
        self._metadata: dict[str, Any] | None = None
        self._splitter: ListSplitter | None = None
        self._deadline: float | None = None
        self._ahead: _ReadAhead | None = None

    def pace_until(self, deadline: float) -> None:
        """From loop time ``deadline`` on, read the rest of the body at once and hold it as bytes.

        Until then the body is read only as its batches are taken. Call before iterating.
        """
        self._deadline = deadline

    @property
    def draining(self) -> bool:
        """The deadline passed before the body was read: the rest is being read at once."""
        return self._ahead is not None and self._ahead.draining

    async def aclose(self) -> None:
        if self._ahead is not None:
            await self._ahead.aclose()

    @property
    def metadata(self) -> dict[str, Any]:
        """The list's metadata; complete only once iteration has ended."""
        if self._metadata is None:
            raise RuntimeError("the list body has not been read to its end")
        return self._metadata

    @property
    def partial_metadata(self) -> dict[str, Any]:
        """The list's metadata as far as read: the API server writes it before the
        items, so it is whole from the first batch on; empty if not read yet."""
        if self._metadata is not None:
            return self._metadata
        meta = self._splitter.envelope.get("metadata") if self._splitter is not None else None
        return meta if isinstance(meta, dict) else {}

    def __aiter__(self) -> AsyncIterator[list[RawObject]]:
        return self._batches()

    def _fill(self, items: list[RawObject]) -> list[RawObject]:
        kind, api_version = self._kind, self._api_version
        for item in items:
            if "kind" not in item:
                item["kind"] = kind
                item["apiVersion"] = api_version
        return items

    async def _batches(self) -> AsyncIterator[list[RawObject]]:
        splitter = self._splitter = ListSplitter(self._decode)
        try:
            async for chunk in self._source():
                view = memoryview(chunk)
                for i in range(0, len(view), _PIECE):
                    items = splitter.feed(view[i : i + _PIECE])
                    if items:
                        yield self._fill(items)
            items = splitter.close()
        except ListBodyError as e:
            raise KubeConnectionError(f"{self._what}: answer is not a list: {e}") from e
        if items:
            yield self._fill(items)
        meta = splitter.envelope.get("metadata")
        self._metadata = meta if isinstance(meta, dict) else {}

    async def _source(self) -> AsyncIterator[bytes]:
        if self._deadline is None:
            async for chunk in self._chunks:
                yield chunk
            return
        self._ahead = ahead = _ReadAhead(self._chunks, self._deadline)
        try:
            while (held := await ahead.next()) is not None:
                yield held
        finally:
            await ahead.aclose()
