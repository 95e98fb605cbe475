"""client-go's Reflector: keep a store in step with one resource by LIST then WATCH.

The loop (``run``) lists (or streams the list, KEP-3157), replaces the store,
then watches from the list's resourceVersion; a watch that ends cleanly is
re-opened from the last seen resourceVersion, a 410 relists, other failures
back off and relist. Semantics follow ``tools/cache/reflector.go`` and
``tools/pager/pager.go``; the statement numbers in comments refer to
docs/informer-checklist.md.

Two departures, because a bridge that retries in silence looks healthy while
it publishes nothing: a failing list/watch is logged (at its first failure,
then at most every ``warn_every`` seconds with the count since) and its state
(``connected``, ``down_for``) is kept for readiness and metrics; and a LIST the
server rejects as malformed (400, e.g. a field selector the kind does not
support) is not retried but raised as ``ListRejectedError``: the same request
can never succeed. So is a 403 before the first sync: the bridge was deployed
without the RBAC rules to list or watch this resource, which needs a person,
and a process that retried it would look alive while publishing nothing. A
403 after a sync (a rule revoked at run time) is retried, visible as
not-ready, so restoring the rule heals it without a restart.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal

from bridge.errors import (
    ApiStatusError,
    BadRequestError,
    ExpiredError,
    ForbiddenError,
    KubeConnectionError,
    KubeError,
    ListRejectedError,
    TooLargeResourceVersionError,
    TooManyRequestsError,
    WatchStalledError,
    status_error,
)
from bridge.kube.backoff import Backoff
from bridge.kube.objects import (
    INITIAL_EVENTS_END_ANNOTATION,
    WatchEvent,
)
from bridge.kube.protocols import (
    ListerWatcher,
    ListOptions,
    ReflectorStore,
    Replacement,
    WatchOptions,
)
from bridge.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Listed:
    replacement: Replacement
    resource_version: str
    pages: int
    items: int


class Phase(StrEnum):
    """Where the reflector stands: what its next attempt does."""

    RESUME = "resume"  # the store holds a checkpoint's state: take its RV and watch
    STREAM = "stream"  # a streaming list (sendInitialEvents, KEP-3157)
    LIST = "list"  # a (paginated) LIST
    WATCH = "watch"  # a watch from the last synced RV


class Happened(StrEnum):
    """What an attempt came to."""

    RESUMED = "resumed"
    LISTED = "listed"
    STREAMED = "streamed"  # the initial state streamed; the stream goes on as the watch
    STREAM_RETRY = "stream_retry"  # 429 or a refused connection: wait, stream again
    STREAM_EXPIRED = "stream_expired"  # 410: stream again at once, from ""
    STREAM_UNSUPPORTED = "stream_unsupported"  # flag ignored, or 400/422: list instead
    STREAM_FAILED = "stream_failed"  # 5xx, a broken stream: list this round
    WATCH_UNOPENED = "watch_unopened"  # busy or away at open: wait, watch again
    WATCH_ENDED = "watch_ended"  # closed, stalled, broken or throttled (``reason``)
    FAILED = "failed"  # the round failed (410, 5xx, a short watch...): back off, relist
    REJECTED = "rejected"  # a LIST that can never succeed: stop


@dataclass(frozen=True, slots=True)
class Outcome:
    happened: Happened
    error: BaseException | None = None
    reason: str = ""
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """Where ``step`` sends the reflector: ``to`` next, after a backoff if ``wait``;
    ``new_round`` counts a relist; ``stop`` raises the outcome's error."""

    to: Phase = Phase.WATCH
    wait: bool = False
    retry_after: float | None = None
    new_round: bool = False
    stop: bool = False


def step(phase: Phase, outcome: Outcome, *, streaming: bool) -> Move:
    """The transition table of the reflector, in one place (client-go's ListAndWatch;
    statement numbers of docs/informer-checklist.md). ``streaming``: whether a relist
    streams (informer.watchList, and the server still doing it)."""
    relist = Phase.STREAM if streaming else Phase.LIST
    match outcome.happened:
        case Happened.RESUMED | Happened.LISTED | Happened.STREAMED:
            return Move(Phase.WATCH)
        case Happened.STREAM_RETRY:
            return Move(Phase.STREAM, wait=True, retry_after=outcome.retry_after)
        case Happened.STREAM_EXPIRED:
            return Move(Phase.STREAM)
        case Happened.STREAM_UNSUPPORTED | Happened.STREAM_FAILED:
            return Move(Phase.LIST)  # this round (checklist 18)
        case Happened.WATCH_UNOPENED:
            return Move(Phase.WATCH, wait=True, retry_after=outcome.retry_after)  # 10
        case Happened.WATCH_ENDED:
            # Checklist 7/13: re-watch at once from the last RV; a 429 waits first.
            throttled = outcome.reason == "throttled"
            return Move(Phase.WATCH, wait=throttled, retry_after=outcome.retry_after)
        case Happened.FAILED:
            # Checklist 8/9: back off, then relist (at the last RV, or "" after a 410).
            return Move(relist, wait=True, retry_after=outcome.retry_after, new_round=True)
        case Happened.REJECTED:
            return Move(phase, stop=True)


@dataclass(frozen=True)
class ReflectorSettings:
    # LIST page size. As in client-go, a relist at a specific resourceVersion is
    # not paginated (so the watch cache can serve it) unless paginate_relists is
    # set or the first list came back paginated.
    page_size: int | None = 500
    paginate_relists: bool = False
    # Streaming lists (sendInitialEvents): "auto" tries them and falls back to
    # LIST+WATCH for good if the server does not support them.
    watch_list: Literal["auto", "on", "off"] = "auto"
    min_watch_timeout: float = 300
    max_watch_timeout: float = 600
    # A watch that delivers nothing (not even a bookmark) for this long is dead.
    idle_timeout: float = 150.0
    backoff_initial: float = 0.8
    backoff_cap: float = 30.0
    backoff_reset: float = 120.0
    # A watch that closes this soon with no events is an error, not a timeout.
    short_watch: float = 1.0
    # "auto" streaming list: a server that honours sendInitialEvents sends the
    # initial-events-end bookmark right after the last synthetic ADDED; this
    # long a silence without it means the flag was ignored.
    initial_events_quiet: float = 10.0
    # The first list reads the latest state (resourceVersion ""), never the watch
    # cache: a consumer whose cache may be ahead of the cache's RV (restored from a
    # checkpoint) must not mistake a lagging list for deletes.
    consistent_first_list: bool = False
    # A failing list/watch logs a warning at its first failure, then at most this often.
    warn_every: float = 30.0
    # A LIST's items wait for room in the FIFO, like a streaming list's, so the
    # body is read only as fast as the informer takes them and memory does not
    # grow with the list (the rest waits in TCP buffers and on the server). The
    # API server cuts a request it has not finished within its timeout (60 s by
    # default), so this long after a LIST (one page) was sent the rest of its
    # body is read at once and held as bytes until taken. None: never pace (the
    # list is decoded into the FIFO as fast as it arrives).
    list_pace_seconds: float | None = 30.0


class VeryShortWatchError(KubeError):
    """A watch closed almost at once without delivering anything (checklist 11)."""


class _InitialEventsIgnored(KubeError):
    """The server answered a streaming list like a plain watch (checklist 18)."""


_INF = math.inf


class _Watchdog:
    """Cancels the current task when ``last`` has not moved for ``timeout`` seconds.

    The reader sets ``last`` to the loop time on each event and to ``inf``
    while it waits on the store, so backpressure from a slow consumer never
    counts as a silent server. Checking lazily keeps the per-event cost to one
    float assignment, unlike rescheduling a timer per event.
    """

    def __init__(self, timeout: float, error: Callable[[], BaseException]) -> None:
        self.timeout = timeout
        self.error = error
        self.last = 0.0
        self.count = 0
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> _Watchdog:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.last = self._loop.time()
        self._handle = self._loop.call_at(self.last + self.timeout, self._check)
        return self

    def _check(self) -> None:
        now = self._loop.time()
        last = self.last
        if last == _INF:
            self._handle = self._loop.call_at(now + self.timeout, self._check)
        elif now - last >= self.timeout:
            self.fired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(last + self.timeout, self._check)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self.fired and exc_type is asyncio.CancelledError and self._task.uncancel() == 0:
            raise self.error() from exc


class Reflector:
    """Keeps ``store`` in step with what ``lw`` lists and watches, until cancelled."""

    def __init__(
        self,
        lw: ListerWatcher,
        store: ReflectorStore,
        *,
        name: str = "",
        settings: ReflectorSettings | None = None,
        resource_version: str | None = None,
        resync_period: float | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._lw = lw
        self._store = store
        self.name = name or repr(lw)
        self.settings = settings or ReflectorSettings()
        s = self.settings
        self._resync_period = resync_period
        self._rng = rng
        self._backoff = Backoff(
            initial=s.backoff_initial,
            cap=s.backoff_cap,
            reset_after=s.backoff_reset,
            rng=rng,
            clock=_loop_time,
        )
        self._start_rv = resource_version
        self._last_sync_rv = ""
        self._rv_unavailable = self.settings.consistent_first_list
        self._partial_relist = False
        self._fed = 0  # items handed to the open replacement
        self._paginated_result = False
        # None: not tried yet; False: the server does not do streaming lists.
        self._watch_list_supported: bool | None = None
        self._relist_reason = "initial"
        # The open stream a streaming list hands to the watch after it.
        self._stream: tuple[AsyncIterator[WatchEvent], AsyncExitStack] | None = None
        self._synced = False
        self.relists: collections.Counter[str] = collections.Counter()
        # LIST answers (pages) the consumer was too slow for: past
        # ``list_pace_seconds`` their rest was read at once and held as bytes.
        self.list_read_aheads = 0
        self.watch_restarts: collections.Counter[str] = collections.Counter()
        self._log = log.bind(reflector=self.name)
        # Health: whether a list/watch stream is established, and when one last was
        # (loop time); what failed last; failed attempts in all and not yet logged.
        self.connected = False
        self.last_healthy = _loop_time_or(0.0)
        self.last_error = ""
        self.failures = 0
        self._unlogged = 0
        self._last_warning = -_INF
        self._warned = False

    # -- state ------------------------------------------------------------

    @property
    def last_sync_resource_version(self) -> str:
        return self._last_sync_rv

    @property
    def is_last_sync_resource_version_unavailable(self) -> bool:
        return self._rv_unavailable

    @property
    def has_synced_once(self) -> bool:
        """True once a list (or streamed list) has replaced the store."""
        return self._synced

    def down_for(self, now: float | None = None) -> float:
        """Seconds without an established list/watch stream; 0 while one is."""
        if self.connected:
            return 0.0
        return max(0.0, (_loop_time() if now is None else now) - self.last_healthy)

    def _up(self) -> None:
        """A LIST answered or a watch opened."""
        now = _loop_time()
        if not self.connected and self._warned:
            self._log.info(
                "list/watch working again",
                failures=self._unlogged,
                down_seconds=round(now - self.last_healthy, 1),
            )
            self._unlogged = 0
        self._warned = False
        self.connected = True
        self.last_healthy = now

    def _lost(self) -> None:
        """The stream ended; not a failure by itself (the next attempt tells)."""
        if self.connected:
            self.connected = False
            self.last_healthy = _loop_time()

    def _failed(self, e: BaseException) -> None:
        """A list/watch attempt failed: logged at once, then at most every ``warn_every`` s."""
        self._lost()
        now = _loop_time()
        self.failures += 1
        self._unlogged += 1
        self.last_error = str(e) or type(e).__name__
        if now - self._last_warning < self.settings.warn_every:
            return
        self._log.warning(
            "list/watch failing",
            error=self.last_error,
            kind=type(e).__name__,
            failures=self._unlogged,
            down_seconds=round(now - self.last_healthy, 1),
        )
        self._unlogged = 0
        self._last_warning = now
        self._warned = True

    @property
    def uses_watch_list(self) -> bool:
        mode = self.settings.watch_list
        return mode == "on" or (mode == "auto" and self._watch_list_supported is not False)

    def _relist_resource_version(self) -> str:
        # Checklist 1/2/8: "0" first (watch cache), the last RV on relists, "" after a 410.
        # Also "" after a list that broke once it had fed items: those came from a
        # snapshot newer than our RV, and another API server's cache may be older
        # still; only a consistent read cannot take an object back in time.
        if self._rv_unavailable or self._partial_relist:
            return ""
        return self._last_sync_rv or "0"

    def _watch_timeout(self) -> int:
        s = self.settings
        return int(s.min_watch_timeout + self._rng() * (s.max_watch_timeout - s.min_watch_timeout))

    # -- the loop ---------------------------------------------------------

    async def run(self) -> None:
        """ListAndWatch until cancelled; failures back off and retry, except a rejected LIST.

        Each turn attempts the current phase (its I/O), applies what happened to
        the reflector's bookkeeping (health, logs, counters), and lets ``step``
        (one pure function, the whole transition table) say where to go next and
        whether to back off first. Backoff is done here, outside the phases.
        """
        self.last_healthy = _loop_time()
        resync: asyncio.Task[None] | None = None
        if self._resync_period:
            resync = asyncio.create_task(self._resync_loop(), name=f"resync {self.name}")
        try:
            phase = Phase.RESUME if self._start_rv is not None else self._relist_phase()
            if phase is not Phase.RESUME:
                self._begin_round()
            while True:
                outcome = await self._attempt(phase)
                self._apply(outcome)
                move = step(phase, outcome, streaming=self.uses_watch_list)
                if move.stop:
                    assert outcome.error is not None
                    raise outcome.error
                if move.wait:
                    await self._backoff.wait(move.retry_after)
                if move.new_round:
                    self._begin_round()
                phase = move.to
        finally:
            if self._stream is not None:
                _, held = self._stream
                self._stream = None
                await held.aclose()
            if resync is not None:
                resync.cancel()
                await asyncio.wait([resync])

    def _relist_phase(self) -> Phase:
        return Phase.STREAM if self.uses_watch_list else Phase.LIST

    def _begin_round(self) -> None:
        """A list or streamed list begins (not a resume): counted by why it was due."""
        self.relists[self._relist_reason] += 1
        self._relist_reason = "error"

    async def _resync_loop(self) -> None:
        assert self._resync_period
        while True:
            await asyncio.sleep(self._resync_period)
            if self._synced:
                try:
                    await self._store.resync()
                except Exception as e:  # a store bug must not stop the reflector
                    self._log.error("resync failed", error=str(e))

    async def _attempt(self, phase: Phase) -> Outcome:
        """The phase's I/O; what happened, failures included, as an ``Outcome``."""
        try:
            if phase is Phase.RESUME:
                # Resuming from a checkpoint: the store already holds that state.
                self._last_sync_rv, self._start_rv = self._start_rv or "", None
                return Outcome(Happened.RESUMED)
            if phase is Phase.STREAM:
                return await self._stream_list()
            if phase is Phase.LIST:
                try:
                    await self._list()
                except BadRequestError as e:
                    raise ListRejectedError(f"the API server rejected the LIST: {e}") from e
                return Outcome(Happened.LISTED)
            return await self._watch_once()
        except ListRejectedError as e:
            return Outcome(Happened.REJECTED, e)
        except ForbiddenError as e:
            if self._synced:
                return Outcome(Happened.FAILED, e, retry_after=e.retry_after)
            rejected = ListRejectedError(
                f"the API server forbids it: {e} (the RBAC rules must allow list and watch)"
            )
            rejected.__cause__ = e
            return Outcome(Happened.REJECTED, rejected)
        except KubeError as e:
            retry_after = e.retry_after if isinstance(e, ApiStatusError) else None
            return Outcome(Happened.FAILED, e, retry_after=retry_after)

    def _apply(self, outcome: Outcome) -> None:
        """What an outcome changes in the reflector's bookkeeping: health, logs, counters."""
        e = outcome.error
        match outcome.happened:
            case Happened.FAILED:
                assert e is not None
                self._relist_reason = _relist_reason(e)
                if isinstance(e, ExpiredError | TooLargeResourceVersionError):
                    # Checklist 8: a compacted RV is routine; the relist heals it.
                    self._lost()
                    self._log.info("relisting", error=str(e))
                else:
                    self._failed(e)
            case Happened.REJECTED:
                assert e is not None
                self._failed(e)
            case Happened.STREAM_RETRY:
                assert e is not None
                self._failed(e)
                self.watch_restarts["watch_list_" + _restart_reason(e)] += 1
            case Happened.STREAM_EXPIRED:
                self._rv_unavailable = True
            case Happened.STREAM_UNSUPPORTED:
                if self.settings.watch_list == "auto":
                    self._watch_list_supported = False
                self._log.info("streaming list unavailable, listing", error=str(e))
            case Happened.STREAM_FAILED:
                # A 5xx or a broken stream says nothing about support: list this round.
                self._log.warning("streaming list failed, listing this time", error=str(e))
            case Happened.WATCH_UNOPENED:
                assert e is not None
                self._failed(e)
                self.watch_restarts[_restart_reason(e)] += 1
            case Happened.WATCH_ENDED:
                self.watch_restarts[outcome.reason] += 1
            case _:
                pass

    # -- LIST -------------------------------------------------------------

    async def _list(self) -> None:
        s = self.settings
        rv = self._relist_resource_version()
        page_size = s.page_size
        if not (s.paginate_relists or self._paginated_result) and rv not in ("", "0"):
            page_size = None  # Checklist 4: a specific RV is served whole from the watch cache.
        try:
            listed = await self._paged_list(rv, page_size)
        except (ExpiredError, TooLargeResourceVersionError):
            # Checklist 2: that RV is gone (or not yet there): list the latest instead.
            self._rv_unavailable = True
            listed = await self._paged_list("", page_size)
        self._up()
        if rv == "0" and listed.pages > 1:
            # The watch cache did not serve "0": keep paginating later relists.
            self._paginated_result = True
        self._rv_unavailable = False
        # No await from here on: a checkpoint taken between the tombstones and the
        # new RV would record the RV without the deletes it implies.
        self._commit(listed.replacement, listed.resource_version)
        # One line per list (rare: the first sync, relists), so how a resource was
        # listed (LIST pages or a streaming list) shows in the log.
        self._log.info(
            "listed",
            mode="list",
            items=listed.items,
            pages=listed.pages,
            resource_version=listed.resource_version,
        )

    def _begin_replace(self, paced: bool = False) -> Replacement:
        self._fed = 0
        return self._store.begin_replace(paced)

    def _begin_list_replace(self) -> Replacement:
        # Paced only where the body's read can be bounded by the server's timeout.
        return self._begin_replace(paced=self.settings.list_pace_seconds is not None)

    def _commit(self, replacement: Replacement, resource_version: str) -> None:
        replacement.commit(resource_version)
        self._last_sync_rv = resource_version
        self._partial_relist = False
        self._synced = True

    def _abandon(self, replacement: Replacement) -> None:
        replacement.abort()
        if self._fed:
            self._partial_relist = True

    async def _paged_list(self, rv: str, limit: int | None) -> _Listed:
        """client-go's pager, its pages fed to one replacement as they arrive; 410 on
        page >= 2 → one full list. The replacement is left open for ``_list`` to commit."""
        options = ListOptions(resource_version=rv, limit=limit)
        replacement = self._begin_list_replace()
        list_rv: str | None = None
        pages = 0
        try:
            while True:
                try:
                    meta = await self._list_page(options, replacement)
                except ExpiredError:
                    if not options.continue_token:
                        raise
                    # Checklist 3: the continue token expired mid-way: restart as one full
                    # list. What the pages fed stays (each a real state); the new replacement
                    # decides what vanished.
                    self._abandon(replacement)
                    replacement = self._begin_list_replace()
                    meta = await self._list_page(ListOptions(resource_version=rv), replacement)
                    return _Listed(
                        replacement, str(meta.get("resourceVersion", "")), pages + 1, self._fed
                    )
                pages += 1
                cont = meta.get("continue")
                if list_rv is None:
                    list_rv = str(meta.get("resourceVersion", ""))
                if not cont:
                    return _Listed(replacement, list_rv, pages, self._fed)
                # Continuation pages carry the snapshot in the token; RV must not be repeated.
                options = ListOptions(limit=limit, continue_token=str(cont))
        except BaseException:
            self._abandon(replacement)
            raise

    async def _list_page(self, options: ListOptions, replacement: Replacement) -> dict[str, Any]:
        """One LIST request, its items handed to ``replacement`` as they are decoded."""
        add = replacement.add
        pace = self.settings.list_pace_seconds
        # The server's request timeout runs from the request, not from the first byte.
        deadline = None if pace is None else _loop_time() + pace
        async with self._lw.list_stream(options) as page:
            if deadline is not None:
                page.pace_until(deadline)
            async for batch in page:
                self._fed += len(batch)
                for obj in batch:
                    await add(obj)
            if page.draining:
                self.list_read_aheads += 1
                self._log.info(
                    "LIST outlasted its pacing deadline; its rest was read ahead and held as bytes",
                    list_pace_seconds=pace,
                    hint="a streaming list (informer.watchList) or smaller pages avoid this",
                )
            return page.metadata

    # -- streaming list (KEP-3157) ----------------------------------------

    async def _stream_list(self) -> Outcome:
        """One streaming list attempt (checklist 16-18): the initial state into a
        replacement, committed at the initial-events-end bookmark; its stream is
        kept open for the watch that follows.

        As in client-go, a failed attempt falls back to LIST+WATCH for this round
        only, except that 429 and a refused connection wait and stream again, and
        a 410 streams again from "". Only a server that does not do streaming
        lists (it ignores the flag, or rejects it with 400/422) makes "auto" give
        them up for good (``step`` holds these rules; here each failure is named).
        """
        auto = self.settings.watch_list == "auto"
        rv = "" if (self._rv_unavailable or self._partial_relist) else self._last_sync_rv
        options = WatchOptions(
            resource_version=rv,
            timeout_seconds=self._watch_timeout(),
            allow_watch_bookmarks=True,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
        )
        attempt = AsyncExitStack()
        # A stream may wait for a slow consumer: the bus paces the initial state.
        replacement = self._begin_replace(paced=True)
        opened = False
        try:
            events = await attempt.enter_async_context(self._lw.watch(options))
            opened = True
            self._up()
            bookmark_rv = await self._initial_events(events, auto, replacement)
        except BaseException as e:
            self._abandon(replacement)
            await attempt.aclose()
            if isinstance(e, TooManyRequestsError) or (
                isinstance(e, KubeConnectionError) and not opened
            ):
                return Outcome(
                    Happened.STREAM_RETRY, e, retry_after=getattr(e, "retry_after", None)
                )
            if isinstance(e, ExpiredError | TooLargeResourceVersionError):
                return Outcome(Happened.STREAM_EXPIRED, e)
            if isinstance(e, _InitialEventsIgnored) or (
                isinstance(e, ApiStatusError) and e.code in (400, 422)
            ):
                return Outcome(Happened.STREAM_UNSUPPORTED, e)
            if isinstance(e, KubeError):
                return Outcome(Happened.STREAM_FAILED, e)
            raise
        self._stream = (events, attempt)
        self._watch_list_supported = True
        self._rv_unavailable = False
        # Checklist 16: the replacement ends at the bookmark's RV; go on with this stream.
        self._commit(replacement, bookmark_rv)
        self._log.info("listed", mode="watch-list", items=self._fed, resource_version=bookmark_rv)
        return Outcome(Happened.STREAMED)

    async def _initial_events(
        self, events: AsyncIterator[WatchEvent], auto: bool, replacement: Replacement
    ) -> str:
        """Hand the initial events to ``replacement``; the initial-events-end bookmark's RV."""
        s = self.settings
        if auto:
            quiet = min(s.initial_events_quiet, s.idle_timeout)
            watchdog = _Watchdog(
                quiet, lambda: _InitialEventsIgnored("no initial-events-end bookmark")
            )
        else:
            watchdog = _Watchdog(
                s.idle_timeout, lambda: WatchStalledError("streaming list stalled")
            )
        add = replacement.add
        loop_time = asyncio.get_running_loop().time
        async with watchdog:
            async for event in events:
                kind = event.get("type")
                obj = event.get("object") or {}
                # Handing over may let a slow consumer run: not the server's silence.
                watchdog.last = _INF
                # Checklist 17: no RV moves from synthetic ADDED events; only the bookmark's counts.
                if kind == "ADDED":
                    self._fed += 1
                    await add(obj)
                elif kind == "BOOKMARK":
                    md = obj.get("metadata") or {}
                    if (md.get("annotations") or {}).get(INITIAL_EVENTS_END_ANNOTATION) == "true":
                        return str(md.get("resourceVersion", ""))
                    if auto:
                        raise _InitialEventsIgnored("plain bookmark before initial-events-end")
                elif kind == "ERROR":
                    raise status_error(obj)
                elif auto:
                    # Live changes before the end marker: the server streamed a plain watch.
                    raise _InitialEventsIgnored(f"{kind} before initial-events-end")
                elif kind == "MODIFIED":
                    self._fed += 1
                    await add(obj)
                elif kind == "DELETED":
                    replacement.discard(obj)
                watchdog.last = loop_time()
        raise _InitialEventsIgnored("stream ended before initial-events-end")

    # -- WATCH ------------------------------------------------------------

    async def _watch_once(self) -> Outcome:
        """One watch, from the last RV (or the stream a streaming list left open),
        consumed until it ends; how it ended is the outcome."""
        s = self.settings
        loop = asyncio.get_running_loop()
        start = loop.time()
        propagate = True
        if self._stream is not None:
            (events, stack), self._stream = self._stream, None
        else:
            rv = self._last_sync_rv
            # Synthetic ADDED events of a watch from ""/"0" come in no RV order.
            propagate = rv not in ("", "0")
            options = WatchOptions(
                resource_version=rv,
                timeout_seconds=self._watch_timeout(),
                allow_watch_bookmarks=True,
            )
            stack = AsyncExitStack()
            try:
                events = await stack.enter_async_context(self._lw.watch(options))
            except (KubeConnectionError, TooManyRequestsError) as e:
                # Checklist 10: the server is busy or away; our RV is still good.
                await stack.aclose()
                return Outcome(
                    Happened.WATCH_UNOPENED, e, retry_after=getattr(e, "retry_after", None)
                )
            except BaseException:
                # Anything else (410, 5xx, 403...) ends the round (checklist 9).
                await stack.aclose()
                raise
            self._up()  # opened
        watchdog = _Watchdog(s.idle_timeout, lambda: WatchStalledError("watch silent"))
        reason = "closed"
        retry_after: float | None = None
        try:
            async with watchdog:
                await self._consume(events, propagate, watchdog)
        except WatchStalledError:
            # Checklist 13: a silent connection; the RV is still good.
            reason = "stalled"
        except KubeConnectionError as e:
            reason = "broken"
            self._log.info("watch broke", error=str(e))
        except TooManyRequestsError as e:
            reason = "throttled"
            retry_after = e.retry_after
        finally:
            await stack.aclose()
        if reason != "closed":
            self._lost()
        if watchdog.count == 0 and loop.time() - start < s.short_watch and reason != "stalled":
            raise VeryShortWatchError(
                f"watch closed after {loop.time() - start:.3f}s with no events"
            )
        return Outcome(Happened.WATCH_ENDED, reason=reason, retry_after=retry_after)

    async def _consume(
        self, events: AsyncIterator[WatchEvent], propagate: bool, watchdog: _Watchdog
    ) -> None:
        """The hot loop: one store call per event, RV bookkeeping, nothing else."""
        store = self._store
        add, update, delete = store.add, store.update, store.delete
        loop_time = asyncio.get_running_loop().time
        n = 0
        try:
            async for event in events:
                kind = event.get("type")
                obj: Any = event.get("object")
                watchdog.last = _INF
                if kind == "MODIFIED":
                    await update(obj)
                elif kind == "ADDED":
                    await add(obj)
                elif kind == "DELETED":
                    await delete(obj)
                elif kind == "BOOKMARK":
                    pass  # Checklist 6: only the RV moves.
                elif kind == "ERROR":
                    # Checklist 8: a 410 here ends the round; the relist is at the last RV.
                    raise status_error(obj if isinstance(obj, dict) else {})
                else:
                    watchdog.last = loop_time()
                    self._log.warning("unknown watch event type", type=kind)
                    continue
                watchdog.last = loop_time()
                n += 1
                if propagate or kind != "ADDED":
                    propagate = True
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self._last_sync_rv = rv
        finally:
            watchdog.count = n


def _loop_time() -> float:
    # The loop's clock, so fake-time test loops drive the backoff reset too.
    return asyncio.get_running_loop().time()


def _loop_time_or(default: float) -> float:
    try:
        return _loop_time()
    except RuntimeError:  # built outside a loop; run() sets the start time
        return default


def _restart_reason(e: BaseException) -> str:
    if isinstance(e, TooManyRequestsError):
        return "throttled"
    if isinstance(e, WatchStalledError):
        return "stalled"
    return "connection"


def _relist_reason(e: BaseException) -> str:
    if isinstance(e, ExpiredError | TooLargeResourceVersionError):
        return "expired"
    if isinstance(e, VeryShortWatchError):
        return "short_watch"
    if isinstance(e, TooManyRequestsError):
        return "throttled"
    if isinstance(e, KubeConnectionError):
        return "connection"
    return "error"
