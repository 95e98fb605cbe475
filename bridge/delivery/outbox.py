"""The outbox of one resource: what was decided, what the bus has taken, what is safe to checkpoint.

A synchronous core (no asyncio inside): the pipeline's async parts only move
batches between it, the sink and the checkpoint store, so every guarantee is a
property of plain method calls and is tested as such (tests/unit/test_outbox.py).

The life of an event::

    decide ──▶ queue ──take──▶ written ahead ──▶ published ──acknowledged──▶ certain
               (memory)        (checkpoint: UNCERTAIN row)                  (checkpoint: CERTAIN row
                                                                             at the next commit)

Invariants:

- **Write-ahead.** ``take`` hands out a batch together with the checkpoint rows
  that must be stored *before* the batch may be sent: per key, the state the
  bus may hold once the batch lands (``UNCERTAIN`` upsert or ``DELETING``), plus
  the uids of earlier incarnations whose delete is still unacknowledged
  (``prior``). A crash at any instant therefore leaves no event on the bus whose
  object the checkpoint does not know; a restart treats those keys as
  uncertain (see bridge/delivery/resume.py).
- **The watermark never passes an unacknowledged event.** A watermark
  candidate is a reflector resourceVersion observed together with the FIFO's
  ``queued_total``; it becomes a *mark* once the informer has processed that
  many items (every event those items produced has a sequence number ≤ the
  mark's), and the committed watermark moves to the newest mark whose events
  are all acknowledged. Marks are taken while changes keep coming, so the
  watermark advances under churn that never pauses.
- **Digests describe what was published.** A key with an unacknowledged event
  (or a restart's uncertain state not yet resolved) is never committed as
  certain; the checkpoint holds its write-ahead row until the ack.
- **Order.** Batches leave in decision order and are acknowledged in that
  order (one publish at a time per resource), so per-object order holds.
- **Announcements change nothing.** ``announce`` queues a re-announcement of
  a key's current state (a snapshot signal, bridge/delivery/snapshot.py) in the same
  order as decisions, but it writes nothing ahead, opens no key and dirties
  none: the state it announces is already what the checkpoint knows (or what
  an earlier decision of the key wrote ahead), so a crash while announcements
  are in flight leaves the checkpoint exactly as it was, and the restart
  republishes nothing for them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from bridge.ground.digest import DELETING, GONE, UNCERTAIN, Digest
from bridge.ground.envelope import Event


@dataclass(slots=True)
class Entry:
    """One decided event. ``digest`` is the key's state after it (None for a delete)."""

    seq: int
    key: str
    uid: str
    event: Event
    digest: Digest | None
    # A re-announcement (``Outbox.announce``): ordered like the rest, written ahead never.
    announcement: bool = False


@dataclass(slots=True)
class Batch:
    """Events to publish together, and the rows to write ahead before sending them."""

    entries: list[Entry]
    ahead: list[Digest]

    @property
    def last_seq(self) -> int:
        return self.entries[-1].seq

    @property
    def events(self) -> list[Event]:
        return [e.event for e in self.entries]

    def settled_rows(self, refused: Collection[int] = ()) -> tuple[list[Digest], list[str]]:
        """The write-ahead rows as they stand once the batch is on the bus: (upserts,
        deletes), for a store written in one transaction with the batch itself.

        A key's state after its last event is then certain, a deleted key is
        ``GONE`` at its delete's resourceVersion (until a commit behind the bus,
        with a watermark past it, removes the row), and its earlier incarnations'
        deletes are on the bus too (batches commit in order). A restart's unresolved state stays as written ahead. A key whose
        last event the bus refused (``refused``: indices into ``entries``) keeps
        the row it had: the poison policy decides what becomes of it.
        """
        final: dict[str, tuple[int, Entry]] = {}
        for i, e in enumerate(self.entries):
            if not e.announcement:
                final[e.key] = (i, e)
        upserts: list[Digest] = []
        deletes: list[str] = []
        for row in self.ahead:
            i, e = final[row.key]
            if i in refused:
                continue
            d = e.digest
            if d is not None and row.state == UNCERTAIN and row.uid == d.uid:
                upserts.append(Digest(row.key, d.uid, d.resource_version, d.fingerprint))
            elif d is None and row.state == DELETING and row.uid == e.uid:
                upserts.append(Digest(row.key, row.uid, row.resource_version, "", GONE))
            else:
                upserts.append(row)
        return upserts, deletes

    def row_after(self, i: int) -> Digest | None:
        """The checkpoint row of ``entries[i]``'s key once that event (refused, then
        published by the poison policy on its own, in a transaction) is on the bus and
        the key's later events of this batch are not: its state after ``entries[i]``
        as ``settled_rows`` would say it. None: an announcement, which changes no row."""
        e = self.entries[i]
        if e.announcement:
            return None
        row = next(r for r in self.ahead if r.key == e.key)
        d = e.digest
        if d is not None and row.state == UNCERTAIN and row.uid == d.uid:
            return Digest(row.key, d.uid, d.resource_version, d.fingerprint)
        if d is None and row.state == DELETING and row.uid == e.uid:
            return Digest(row.key, row.uid, e.event.resource_version, "", GONE)
        return row


class CommitStep(NamedTuple):
    """One store call of a commit: its rows, and the watermark if it is the last."""

    watermark: str | None
    upserts: list[Digest]
    deletes: list[str]


# The rows of some keys as they stand now, for a commit of this watermark: (upserts,
# deletes).
RowsOf = Callable[[Sequence[str], str], tuple[list[Digest], list[str]]]


class Commit:
    """One checkpoint step: the watermark and the keys that became certain (or gone).

    It names its keys; their rows are read from the cache only as the store
    takes them, a step of keys at a time (``steps``). Read at once, a commit
    after a list or a burst (tens of thousands of keys) held every digest and
    its row's encoding together, and the store's one long transaction made
    every write-ahead behind it wait, so decided events piled up to
    ``max_pending`` meanwhile. A key decided again between two steps has an
    event on its way when its step is read, so that step leaves its write-ahead
    row alone (``Outbox.rows``). The watermark rides with the last step, once
    every row before it is stored.
    """

    __slots__ = ("_rows_of", "generation", "keys", "observed_at", "watermark")

    def __init__(
        self,
        watermark: str,
        keys: list[str],
        generation: int,
        observed_at: float | None,
        rows_of: RowsOf,
    ) -> None:
        self.watermark = watermark
        self.keys = keys
        # The outbox's dirty generation when it named its keys: a key changed
        # meanwhile has a later one and stays dirty.
        self.generation = generation
        self.observed_at = observed_at
        self._rows_of = rows_of

    def steps(self, size: int) -> Iterator[CommitStep]:
        """At most ``size`` keys per step, each step's rows read when it is reached;
        the last carries the watermark (a commit of no keys is that step alone).

        Deletes wait for the last step: a row removed before the watermark passes
        its delete would leave a watch resumed from the old watermark to replay
        the object as new. Their rows are read again then (a key decided since
        has its write-ahead row, which stays).
        """
        keys, n = self.keys, len(self.keys)
        held: list[str] = []
        for start in range(0, n, size):
            upserts, deletes = self._rows_of(keys[start : start + size], self.watermark)
            if start + size < n:
                held.extend(deletes)
                yield CommitStep(None, upserts, [])
                continue
            if held:
                again, gone = self._rows_of(held, self.watermark)
                upserts.extend(again)
                deletes = gone + deletes
            yield CommitStep(self.watermark, upserts, deletes)
        if not n:
            yield CommitStep(self.watermark, [], [])


@dataclass(slots=True)
class _Open:
    """A key with events not yet acknowledged."""

    last_seq: int = 0
    # (seq, uid) of delete events not yet acknowledged, oldest first.
    deletes: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Mark:
    bound: int  # queued_total (pending marks) or last event seq (resolved marks)
    rv: str
    at: float


class Outbox:
    """The synchronous core of one resource's delivery (see the module docstring).

    ``digest_of(key)`` reads the key's current state from the informer's cache
    (the one store of per-object state): the outbox keeps no copy of it, only
    the state of keys whose events are on their way.
    """

    def __init__(
        self,
        digest_of: Callable[[str], Digest | None],
        *,
        watermark: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._digest_of = digest_of
        self._clock = clock
        self._queue: deque[Entry] = deque()
        self._next_seq = 1
        self._unacked_bytes = 0
        self.taken_seq = 0  # every seq ≤ this was handed out by ``take``
        self.acked_seq = 0  # every seq ≤ this was acknowledged by the bus
        self._open: dict[str, _Open] = {}
        # Keys whose state changed since the last commit, with a generation.
        self._dirty: dict[str, int] = {}
        self._generation = 0
        # Uncertain keys from a restart, until a decision resolves them.
        self.uncertain: dict[str, Digest] = {}
        self._observed: deque[_Mark] = deque()  # bound = queued_total
        self._marks: deque[_Mark] = deque()  # bound = event seq
        # The last delete decided for a key, (uid, resourceVersion), while its row is in
        # the checkpoint: a row is removed only by a commit whose watermark passed the
        # delete (``rows``), because a watch resumed from an older watermark replays
        # the object's earlier states, which the row tells from news.
        self._deleted: dict[str, tuple[str, str]] = {}
        # Deleted keys whose row a commit kept as GONE: released by the first commit
        # whose watermark passes their delete.
        self._held: set[str] = set()
        # Dirty keys whose events the bus has all acknowledged, newest last: the next
        # write-ahead carries their certain rows (``acknowledged_rows``).
        self._acked_keys: list[str] = []
        self._last_observed_rv = watermark
        self.committed_watermark = watermark
        self._committing_since: float | None = None
        # (last seq, when taken) of each batch taken and not yet acknowledged, oldest
        # first: what ``oldest_unacked_age`` reads (the stall metric and readiness).
        self._taken_at: deque[tuple[int, float]] = deque()

    # -- state --------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Decided, not yet taken."""
        return len(self._queue)

    @property
    def dirty(self) -> int:
        """Keys whose state changed since the last commit (some may wait for an ack)."""
        return len(self._dirty)

    @property
    def unacknowledged(self) -> int:
        """Decided and not yet acknowledged (queued, written ahead or in flight)."""
        return self._next_seq - 1 - self.acked_seq

    @property
    def unacknowledged_bytes(self) -> int:
        """The encoded size of the unacknowledged events (those sealed when decided)."""
        return self._unacked_bytes

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def is_open(self, key: str) -> bool:
        return key in self._open or key in self.uncertain

    def lag(self) -> float:
        """Seconds since the oldest reflector position the committed watermark does not cover."""
        oldest = [m[0].at for m in (self._observed, self._marks) if m]
        if self._committing_since is not None:
            oldest.append(self._committing_since)
        return max(0.0, self._clock() - min(oldest)) if oldest else 0.0

    def oldest_unacked_age(self) -> float:
        """Seconds since the oldest batch not yet acknowledged was taken for delivery
        (written ahead, then handed to the sink); 0 when every taken batch is
        acknowledged. Batches leave and are acknowledged in order, so the oldest is
        the first of ``_taken_at``: one clock reading per batch, none per event."""
        taken = self._taken_at
        return max(0.0, self._clock() - taken[0][1]) if taken else 0.0

    # -- deciding -----------------------------------------------------------

    def decide(self, key: str, uid: str, event: Event, digest: Digest | None) -> Entry:
        """Queue ``event`` for ``key``; ``digest`` None means it deletes ``uid``."""
        seq = self._next_seq
        self._next_seq += 1
        entry = Entry(seq, key, uid, event, digest)
        self._queue.append(entry)
        self._unacked_bytes += len(event.encoded)
        state = self._open.get(key)
        if state is None:
            state = self._open[key] = _Open()
        state.last_seq = seq
        if digest is None:
            state.deletes.append((seq, uid))
            self._deleted[key] = (uid, event.resource_version)
        elif self._deleted:
            self._deleted.pop(key, None)
            self._held.discard(key)
        self.touch(key)
        return entry

    def announce(self, key: str, uid: str, event: Event) -> Entry:
        """Queue ``event``, which re-announces the current state of ``key`` (already
        known to the checkpoint), behind everything decided so far.

        Nothing is written ahead for it and the key is neither opened nor dirtied:
        it changes no state the checkpoint holds, so a crash before its ack needs
        no repair. Events of ``key`` decided later still leave after it.
        """
        seq = self._next_seq
        self._next_seq += 1
        entry = Entry(seq, key, uid, event, None, announcement=True)
        self._queue.append(entry)
        self._unacked_bytes += len(event.encoded)
        return entry

    def touch(self, key: str) -> None:
        """The cached state of ``key`` changed (also without an event): commit it next time."""
        self._generation += 1
        self._dirty[key] = self._generation

    def restore_uncertain(self, digests: Iterable[Digest]) -> None:
        """Keys that a previous run wrote ahead but never saw acknowledged."""
        for d in digests:
            self.uncertain[d.key] = d

    def restore_gone(self, digests: Iterable[Digest]) -> None:
        """GONE rows of a previous run whose delete the watermark has not passed: kept
        until a commit's watermark does (their objects' earlier states may be replayed
        meanwhile, see bridge/delivery/resume.py)."""
        for d in digests:
            self._deleted[d.key] = (d.uid, d.resource_version)
            self._held.add(d.key)

    def resolve(self, key: str) -> Digest | None:
        """Take the restart's uncertain state of ``key`` (None if it has none)."""
        return self.uncertain.pop(key, None)

    # -- the watermark --------------------------------------------------------

    def observe(self, queued_total: int, resource_version: str) -> None:
        """The reflector stood at ``resource_version`` once ``queued_total`` items were queued."""
        if not resource_version or resource_version == self._last_observed_rv:
            return
        self._last_observed_rv = resource_version
        self._observed.append(_Mark(queued_total, resource_version, self._clock()))

    def progress(self, processed_total: int) -> None:
        """The informer has processed ``processed_total`` items, and decided their events."""
        observed = self._observed
        while observed and observed[0].bound <= processed_total:
            mark = observed.popleft()
            self._marks.append(_Mark(self.last_seq, mark.rv, mark.at))

    # -- publishing ---------------------------------------------------------

    def take(self, limit: int) -> Batch | None:
        """The next batch (at most ``limit`` events) and its write-ahead rows."""
        if not self._queue:
            return None
        queue = self._queue
        entries = [queue.popleft() for _ in range(min(limit, len(queue)))]
        last = entries[-1].seq
        self.taken_seq = last
        self._taken_at.append((last, self._clock()))
        final: dict[str, Entry] = {}
        for e in entries:
            if not e.announcement:  # an announcement adds nothing the bus may newly hold
                final[e.key] = e
        ahead = []
        uncertain, opened = self.uncertain, self._open
        for key, e in final.items():
            deletes = opened[key].deletes
            unresolved = uncertain.get(key) if uncertain else None
            if unresolved is not None:
                # A restart's re-sent delete of an earlier uid: the key's uncertain
                # state from the previous run may still be on the bus and must stay
                # known until a decision resolves it.
                uid, rv, fp, state = (
                    unresolved.uid,
                    unresolved.resource_version,
                    unresolved.fingerprint,
                    unresolved.state,
                )
            elif e.digest is None:
                uid, rv, fp, state = e.uid, e.event.resource_version, "", DELETING
            else:
                d = e.digest
                uid, rv, fp, state = d.uid, d.resource_version, d.fingerprint, UNCERTAIN
            prior = ""
            if deletes:
                gone = [u for seq, u in deletes if seq <= last and u != uid]
                prior = ",".join(dict.fromkeys(gone))
            ahead.append(Digest(key, uid, rv, fp, state, prior))
        return Batch(entries, ahead)

    def acknowledged(self, batch: Batch) -> None:
        """The bus took ``batch`` (or the poison policy settled its refused events)."""
        first = batch.entries[0].seq
        if first != self.acked_seq + 1:
            raise RuntimeError(
                f"outbox: batch {first}..{batch.last_seq} acknowledged out of order"
                f" (acknowledged up to {self.acked_seq})"
            )
        acked = self.acked_seq = batch.last_seq
        self._unacked_bytes -= sum([len(e.event.encoded) for e in batch.entries])
        for key in {e.key for e in batch.entries}:
            state = self._open.get(key)
            if state is None:
                continue
            if state.deletes:
                state.deletes = [d for d in state.deletes if d[0] > acked]
            if state.last_seq <= acked:
                del self._open[key]
                self._acked_keys.append(key)
        taken = self._taken_at
        while taken and taken[0][0] <= acked:
            taken.popleft()

    # -- checkpointing --------------------------------------------------------

    def acknowledged_rows(self, limit: int) -> tuple[list[Digest], list[str], int]:
        """Certain rows of keys the bus acknowledged since their last commit, at most
        ``limit``, for the next write-ahead to carry: (rows, their keys, the dirty
        generation read), and ``settled`` once stored.

        A write-ahead is stored before every batch anyway; carrying these rows with it
        keeps what a crash leaves uncertain to the events not yet acknowledged plus
        the batch acknowledged last, where a commit on its own cadence (a second, or
        thousands of keys) left a whole first sync's acknowledged events uncertain,
        to be published again after a kill. A deleted key is left to the commit,
        which knows whether the watermark passed its delete.
        """
        rows: list[Digest] = []
        keys: list[str] = []
        acked, dirty, opened, uncertain = self._acked_keys, self._dirty, self._open, self.uncertain
        while acked and len(keys) < limit:
            key = acked.pop()
            if key in opened or key in uncertain or key not in dirty:
                continue
            d = self._digest_of(key)
            if d is not None:
                rows.append(d)
                keys.append(key)
        return rows, keys, self._generation

    def settled(self, keys: Iterable[str], generation: int) -> None:
        """The rows ``acknowledged_rows`` gave at ``generation`` are stored."""
        dirty = self._dirty
        for key in keys:
            if dirty.get(key, generation + 1) <= generation:
                del dirty[key]

    def checkpoint(self) -> Commit | None:
        """What the next commit writes, or None when the checkpoint is up to date."""
        watermark, at = self.committed_watermark, None
        marks = self._marks
        while marks and marks[0].bound <= self.acked_seq:
            mark = marks.popleft()
            watermark, at = mark.rv, mark.at
        opened, uncertain = self._open, self.uncertain
        # A key with events on their way keeps its write-ahead row until the ack.
        keys = [k for k in self._dirty if k not in opened and k not in uncertain]
        if self._held and watermark != self.committed_watermark:
            deleted = self._deleted
            keys += [
                k for k in self._held if k not in self._dirty and _passed(deleted[k][1], watermark)
            ]
        if watermark == self.committed_watermark and not keys:
            return None
        self._committing_since = at
        return Commit(watermark, keys, self._generation, at, self.rows)

    def rows(
        self, keys: Sequence[str], watermark: str | None = None
    ) -> tuple[list[Digest], list[str]]:
        """The checkpoint rows of ``keys`` as they stand now, for a commit of
        ``watermark``: (upserts, deletes).

        A key with events on their way (decided since its commit named it) is
        left out: its write-ahead row stands until the ack, and the key, touched
        by that decision, stays dirty for the next commit. A deleted key whose
        delete the watermark has not passed keeps a ``GONE`` row (None: no
        watermark to keep it for).
        """
        upserts: list[Digest] = []
        deletes: list[str] = []
        opened, uncertain, digest_of = self._open, self.uncertain, self._digest_of
        deleted = self._deleted
        for key in keys:
            if key in opened or key in uncertain:
                continue
            digest = digest_of(key)
            if digest is not None:
                upserts.append(digest)
                continue
            gone = deleted.get(key) if watermark is not None else None
            if gone is not None and not _passed(gone[1], watermark or ""):
                upserts.append(Digest(key, gone[0], gone[1], "", GONE))
            else:
                deletes.append(key)
        return upserts, deletes

    def committed(self, commit: Commit) -> None:
        self.committed_watermark = watermark = commit.watermark
        self._committing_since = None
        dirty, read_at = self._dirty, commit.generation
        deleted, held = self._deleted, self._held
        for key in commit.keys:
            if dirty.get(key, read_at + 1) <= read_at:
                del dirty[key]
            elif key in dirty:
                continue  # decided again meanwhile: the next commit says what it is
            gone = deleted.get(key)
            if gone is None or key in self._open:
                continue
            if self._digest_of(key) is not None or _passed(gone[1], watermark):
                del deleted[key]  # its row was removed
                held.discard(key)
            else:
                held.add(key)  # its GONE row stays until a watermark passes the delete
        if self._acked_keys:
            self._acked_keys = [k for k in self._acked_keys if k in dirty]

    def commit_failed(self, commit: Commit) -> None:
        """The store refused ``commit``: its marks and keys are offered again next time."""
        self._committing_since = None
        if commit.observed_at is not None and commit.watermark != self.committed_watermark:
            self._marks.appendleft(_Mark(0, commit.watermark, commit.observed_at))


def _passed(resource_version: str, watermark: str) -> bool:
    """The watermark is at or past ``resource_version``: a watch resumed from it replays
    nothing of the change made there. Not integers (no etcd behind): True, as nothing
    better can be said."""
    if not watermark:
        return False
    try:
        return int(watermark) >= int(resource_version)
    except ValueError:
        return True
