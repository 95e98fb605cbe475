"""The seams of the informer machinery.

``ListerWatcher`` is what a Reflector reads from (the API server, or a test
double); ``ReflectorStore`` is what it writes into (a FIFO). The methods of the
store are coroutines so that a full queue can make the reflector wait: that
is how backpressure from a slow sink reaches the watch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.kube.objects import ListResponse, RawObject, WatchEvent


@dataclass(frozen=True, slots=True)
class ListOptions:
    resource_version: str | None = None
    resource_version_match: str | None = None  # "Exact" | "NotOlderThan" | None
    limit: int | None = None
    continue_token: str | None = None
    timeout_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class WatchOptions:
    resource_version: str | None = None
    timeout_seconds: int | None = None
    allow_watch_bookmarks: bool = True
    send_initial_events: bool | None = None
    resource_version_match: str | None = None


class ListStream(Protocol):
    """One LIST answer (one page) read as it arrives."""

    def __aiter__(self) -> AsyncIterator[list[RawObject]]:
        """Batches of items in the server's order; raises ``KubeError`` if the body breaks."""
        ...

    @property
    def metadata(self) -> dict[str, Any]:
        """The list's metadata (resourceVersion, continue); complete once iteration ended."""
        ...

    @property
    def draining(self) -> bool:
        """The ``pace_until`` deadline passed before the body was read: the rest was
        (or is being) read at once."""
        ...

    def pace_until(self, deadline: float) -> None:
        """Read the body only as fast as its batches are taken until loop time ``deadline``,
        then the rest at once (held undecoded), so the server's request timeout never
        cuts a read paced by a slow consumer. Without it the body is read as taken."""
        ...


class ListerWatcher(Protocol):
    """client-go's ListerWatcher for one resource in one scope (cluster or namespace)."""

    async def list(self, options: ListOptions) -> ListResponse:
        """One LIST request (one page when ``limit`` is set). Raises ``KubeError``."""
        ...

    def list_stream(self, options: ListOptions) -> AbstractAsyncContextManager[ListStream]:
        """The same request, its items handed over as they arrive instead of all at once.

        Opening raises ``ApiStatusError`` for an HTTP error status.
        """
        ...

    def watch(
        self, options: WatchOptions
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Open a WATCH; the context yields decoded events until the server closes.

        Opening raises ``ApiStatusError`` for an HTTP error status; iteration raises
        ``KubeConnectionError`` if the stream breaks. ERROR events are yielded as
        they came (the reflector translates them).
        """
        ...


class Replacement(Protocol):
    """A relist handed to the store item by item, as the list arrives.

    The items are the store's to pass on at once; what vanished (client-go's
    tombstones) can only be known after the last item, so ``commit`` decides
    that. ``abort`` (the list broke) keeps what was handed in and decides
    nothing: a later replacement will.
    """

    async def add(self, obj: RawObject) -> None: ...

    def discard(self, obj: RawObject) -> None:
        """An object handed in earlier is gone before the list ended (a streamed list's DELETED)."""
        ...

    def commit(self, resource_version: str) -> None: ...

    def abort(self) -> None: ...


class ReflectorStore(Protocol):
    """What a Reflector writes into: client-go's ``Store`` as seen by the reflector."""

    async def add(self, obj: RawObject) -> None: ...

    async def update(self, obj: RawObject) -> None: ...

    async def delete(self, obj: RawObject) -> None: ...

    async def replace(self, items: list[RawObject], resource_version: str) -> None:
        """The whole list at once (client-go's ``Replace``)."""
        ...

    def begin_replace(self, paced: bool = False) -> Replacement:
        """The same as ``replace``, fed item by item; one at a time. ``paced``: each
        item may wait for the consumer (a streaming list, or a LIST whose body is
        read ahead after a deadline: ``ListStream.pace_until``)."""
        ...

    async def resync(self) -> None: ...
