"""An in-memory ``ListerWatcher`` that plays a script: the reflector's test twin.

Each LIST answer and each WATCH stream is queued in advance. A watch script is
a sequence of steps: a ``WatchEvent`` dict is delivered, an exception is
raised mid-stream, ``Pause(seconds)`` waits, ``HANG`` waits forever (a silent
connection). When a stream's steps run out it ends cleanly, like a server
timeout. With nothing queued, LIST raises and WATCH waits until more is queued.
Every call is recorded with its options, and open streams are counted, so
tests can assert what the reflector asked and that it closed what it opened.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from bridge.errors import KubeConnectionError
from bridge.kube.objects import (
    INITIAL_EVENTS_END_ANNOTATION,
    ListResponse,
    RawObject,
    WatchEvent,
    namespace_key,
)
from bridge.kube.protocols import ListOptions, ListStream, WatchOptions


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class BrokenList:
    """A LIST answer whose body breaks with ``error`` after ``items`` were read."""

    items: Sequence[RawObject]
    error: BaseException


HANG = Pause(float("inf"))

WatchStep = WatchEvent | BaseException | Pause
WatchScript = BaseException | Sequence[WatchStep]


@dataclass
class Call:
    verb: str  # "list" | "watch"
    options: Any
    at: float


@dataclass(repr=False)
class ScriptedListerWatcher:
    lists: deque[ListResponse | BrokenList | BaseException | Pause] = field(default_factory=deque)
    watches: deque[WatchScript] = field(default_factory=deque)
    calls: list[Call] = field(default_factory=list)
    open_streams: int = 0
    delivered: int = 0

    def __post_init__(self) -> None:
        self._more = asyncio.Event()

    def __repr__(self) -> str:
        return "ScriptedListerWatcher"

    # -- scripting --------------------------------------------------------

    def add_list(self, *answers: ListResponse | BrokenList | BaseException | Pause) -> None:
        self.lists.extend(answers)

    def add_watch(self, *scripts: WatchScript) -> None:
        self.watches.extend(scripts)
        self._more.set()

    def list_calls(self) -> list[ListOptions]:
        return [c.options for c in self.calls if c.verb == "list"]

    def watch_calls(self) -> list[WatchOptions]:
        return [c.options for c in self.calls if c.verb == "watch"]

    # -- ListerWatcher ----------------------------------------------------

    async def list(self, options: ListOptions) -> ListResponse:
        answer = await self._list_answer(options)
        if isinstance(answer, BrokenList):
            raise answer.error
        return answer

    @asynccontextmanager
    async def list_stream(self, options: ListOptions) -> AsyncIterator[ListStream]:
        """The scripted answer, one item per batch with a turn of the loop between."""
        yield _ScriptedListStream(await self._list_answer(options))

    async def _list_answer(self, options: ListOptions) -> ListResponse | BrokenList:
        self.calls.append(Call("list", options, asyncio.get_running_loop().time()))
        await asyncio.sleep(0)
        if not self.lists:
            raise KubeConnectionError("script: no LIST answer queued")
        answer = self.lists.popleft()
        while isinstance(answer, Pause):
            await _pause(answer)
            if not self.lists:
                raise KubeConnectionError("script: no LIST answer queued")
            answer = self.lists.popleft()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @asynccontextmanager
    async def watch(self, options: WatchOptions) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        self.calls.append(Call("watch", options, asyncio.get_running_loop().time()))
        while not self.watches:
            self._more.clear()
            await self._more.wait()
        script = self.watches.popleft()
        if isinstance(script, BaseException):
            raise script
        self.open_streams += 1
        try:
            yield self._play(script)
        finally:
            self.open_streams -= 1

    async def _play(self, steps: Iterable[WatchStep]) -> AsyncIterator[WatchEvent]:
        for step in steps:
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, Pause):
                await _pause(step)
                continue
            await asyncio.sleep(0)
            self.delivered += 1
            yield step


class _ScriptedListStream:
    def __init__(self, answer: ListResponse | BrokenList) -> None:
        self._answer = answer
        self._done = False
        self.deadline: float | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        assert self._done, "metadata read before the items"
        assert not isinstance(self._answer, BrokenList)
        return dict(self._answer.get("metadata") or {})

    def pace_until(self, deadline: float) -> None:
        """Nothing to read ahead: the scripted answer is in memory already."""
        self.deadline = deadline

    @property
    def draining(self) -> bool:
        return False

    def __aiter__(self) -> AsyncIterator[list[RawObject]]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[RawObject]]:
        answer = self._answer
        items = answer.items if isinstance(answer, BrokenList) else answer.get("items") or ()
        for item in items:
            yield [item]
            await asyncio.sleep(0)
        if isinstance(answer, BrokenList):
            raise answer.error
        self._done = True


async def _pause(p: Pause) -> None:
    if p.seconds == float("inf"):
        await asyncio.Event().wait()
    await asyncio.sleep(p.seconds)


# -- building payloads ----------------------------------------------------


def pod(name: str, rv: int | str, namespace: str = "default", **extra: Any) -> RawObject:
    obj: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": str(rv),
        },
    }
    obj.update(extra)
    return obj


def event(kind: str, obj: RawObject) -> WatchEvent:
    return {"type": kind, "object": obj}


def bookmark(rv: int | str, *, initial_events_end: bool = False) -> WatchEvent:
    md: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_events_end:
        md["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": md}}


def error_event(code: int, reason: str, message: str = "") -> WatchEvent:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message or reason,
    }
    return {"type": "ERROR", "object": status}


def list_response(
    items: Sequence[RawObject], rv: int | str, *, cont: str | None = None
) -> ListResponse:
    md: dict[str, Any] = {"resourceVersion": str(rv)}
    if cont:
        md["continue"] = cont
    return {"kind": "PodList", "apiVersion": "v1", "metadata": md, "items": list(items)}


@dataclass
class RecordingStore:
    """A ``ReflectorStore`` that records every call, for reflector tests.

    A streamed replace is recorded like ``replace`` when committed; an aborted
    one only in ``aborted`` (what it had been handed).
    """

    ops: list[tuple[str, Any]] = field(default_factory=list)
    aborted: list[list[str]] = field(default_factory=list)

    async def add(self, obj: RawObject) -> None:
        self.ops.append(("add", _short(obj)))

    async def update(self, obj: RawObject) -> None:
        self.ops.append(("update", _short(obj)))

    async def delete(self, obj: RawObject) -> None:
        self.ops.append(("delete", _short(obj)))

    async def replace(self, items: list[RawObject], resource_version: str) -> None:
        self.ops.append(("replace", ([_short(i) for i in items], resource_version)))

    def begin_replace(self, paced: bool = False) -> _RecordingReplacement:
        return _RecordingReplacement(self)

    async def resync(self) -> None:
        self.ops.append(("resync", None))


class _RecordingReplacement:
    def __init__(self, store: RecordingStore) -> None:
        self._store = store
        self._items: dict[str, str] = {}

    async def add(self, obj: RawObject) -> None:
        self._items[namespace_key(obj)] = _short(obj)

    def discard(self, obj: RawObject) -> None:
        self._items.pop(namespace_key(obj), None)

    def commit(self, resource_version: str) -> None:
        self._store.ops.append(("replace", (list(self._items.values()), resource_version)))

    def abort(self) -> None:
        self._store.aborted.append(list(self._items.values()))


def _short(obj: RawObject) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('name')}@{md.get('resourceVersion')}"
