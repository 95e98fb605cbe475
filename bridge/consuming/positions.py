"""What a consumer group has handled, per object: ``uid → last handled resourceVersion``.

The bus keeps per-object order (one Kafka key → one partition, one NATS
subject → one stream, in resourceVersion order), so an event whose
resourceVersion is not newer than the last one handled for its uid is a
redelivery. That is exact where a set of recent ids is not (it forgets), and
it is small: one row per object, not one per event.

resourceVersions are etcd revisions, compared as integers per uid, as the
bridge does (bridge/delivery). A delete is the end of a uid (Kubernetes never
reuses one): after it, every event of that uid is a redelivery. A delete seen
only through a relist carries the last known resourceVersion, not a newer one,
so a delete is new exactly when the uid is not already deleted, whatever its
resourceVersion. A ``filtered`` event (the object left the resource's filter)
is an ordinary position: the object may enter again later, at a newer version.

Stores (``PositionStore``):

- ``MemoryPositions``: for tests and for one process that may forget.
- ``SqlitePositions``: a file; workers of one host may share it. Its
  connection is open to the caller: what the handler writes through
  ``positions.connection`` commits in the same transaction as the positions,
  so the handler's effects and "handled" are one (exactly-once effects).
- ``KafkaTopicPositions`` (bridge/consuming/kafka_positions.py) and
  ``NatsKvPositions`` (bridge/consuming/nats_positions.py): owned by the group
  on its bus, the defaults of ``consume(..., group=...)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from bridge.errors import SinkUnavailableError

if TYPE_CHECKING:
    from bridge.ground.envelope import ReceivedEvent


@dataclass(frozen=True, slots=True)
class Position:
    """The last handled resourceVersion of one uid, and whether the uid is deleted."""

    resource_version: int
    deleted: bool = False


def event_uid(event: ReceivedEvent) -> str:
    """The object's uid: the first part of the event id (``{uid}:…``), which every
    change, delete, filtered and snapshot event has, truncated ones too."""
    return event.id.split(":", 1)[0]


def rv_of(event: ReceivedEvent) -> int | None:
    try:
        return int(event.resource_version)
    except ValueError:
        return None


def is_new(position: Position | None, event: ReceivedEvent) -> bool:
    """Whether ``event`` is past what ``position`` says was handled (see the module doc)."""
    if position is None:
        return True
    if position.deleted:
        return False
    if event.change == "deleted":
        return True
    rv = rv_of(event)
    # Not an integer: not a kube resourceVersion, cannot be ordered; never drop it.
    return rv is None or rv > position.resource_version


def advanced(position: Position | None, event: ReceivedEvent) -> Position:
    """The position after handling ``event``."""
    rv = rv_of(event) or 0
    before = position.resource_version if position else 0
    return Position(max(rv, before), deleted=event.change == "deleted")


class PositionStore(Protocol):
    """Where a group keeps its positions. ``record`` may buffer; after ``flush``
    returns, every recorded position survives a crash of this process."""

    async def open(self) -> None: ...

    async def get(self, uid: str) -> Position | None: ...

    def record(self, uid: str, position: Position, partition: int) -> None:
        """``partition``: the bus partition the uid's events are on (0 on NATS),
        so a store can load only what an assignment needs."""

    async def flush(self) -> None: ...

    def unhandled(self) -> None:
        """The event of the last ``get`` was handed out and will not be recorded (the
        consumer closes while the caller holds it): undo what the handler wrote."""

    async def assigned(self, partitions: Iterable[int]) -> None:
        """The consumer now owns ``partitions`` (after a rebalance, a takeover):
        positions another worker flushed must be visible from now on."""

    async def close(self) -> None: ...


class MemoryPositions:
    """Positions in a dict: exact within one process, gone with it."""

    def __init__(self) -> None:
        self.positions: dict[str, Position] = {}

    async def open(self) -> None:
        pass

    async def get(self, uid: str) -> Position | None:
        return self.positions.get(uid)

    def record(self, uid: str, position: Position, partition: int) -> None:
        self.positions[uid] = position

    async def flush(self) -> None:
        pass

    def unhandled(self) -> None:
        pass

    async def assigned(self, partitions: Iterable[int]) -> None:
        pass

    async def close(self) -> None:
        pass


class SqlitePositions:
    """Positions in a SQLite file (WAL), under ``group``.

    A transaction is open from the first ``get`` after a ``flush`` until the
    next ``flush``: what the handler writes through ``connection`` meanwhile
    commits with the positions, or not at all (a crash rolls both back, and the
    events come again as new). Workers on one host may share the file: a
    worker's transaction takes the write lock (``BEGIN IMMEDIATE``), so the
    other waits (``busy_timeout``) rather than failing. ``synchronous=NORMAL``:
    a commit survives the process being killed, not a power cut.
    """

    def __init__(self, path: str | Path, *, group: str = "", busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.group = group
        self.busy_timeout = busy_timeout
        self._con: sqlite3.Connection | None = None
        self._in_tx = False
        self._savepoint = False  # one per event handed out, released when it is recorded

    @property
    def connection(self) -> sqlite3.Connection:
        """The store's connection, inside the open transaction once an event is handed out."""
        if self._con is None:
            raise RuntimeError("SqlitePositions is not open")
        return self._con

    async def open(self) -> None:
        if self._con is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: the store says where transactions begin and end.
        con = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        con.execute("pragma journal_mode=wal")
        con.execute("pragma synchronous=normal")
        con.execute(
            "create table if not exists positions (grp text not null, uid text not null,"
            " resource_version integer not null, deleted integer not null,"
            " primary key (grp, uid)) without rowid"
        )
        self._con = con

    def begin(self) -> None:
        if not self._in_tx:
            self.connection.execute("begin immediate")
            self._in_tx = True

    async def get(self, uid: str) -> Position | None:
        # Opened here, before the event is handed out: the handler writes inside it,
        # after a savepoint that a consumer closed mid-handler rolls back to.
        self.begin()
        if self._savepoint:
            self.connection.execute("release ev")  # the previous event was skipped
        self.connection.execute("savepoint ev")
        self._savepoint = True
        row = self.connection.execute(
            "select resource_version, deleted from positions where grp = ? and uid = ?",
            (self.group, uid),
        ).fetchone()
        return Position(int(row[0]), bool(row[1])) if row else None

    def record(self, uid: str, position: Position, partition: int) -> None:
        self.begin()
        self.connection.execute(
            "insert into positions (grp, uid, resource_version, deleted) values (?, ?, ?, ?)"
            " on conflict (grp, uid) do update set resource_version = excluded.resource_version,"
            " deleted = excluded.deleted",
            (self.group, uid, position.resource_version, int(position.deleted)),
        )
        if self._savepoint:
            self.connection.execute("release ev")
            self._savepoint = False

    def unhandled(self) -> None:
        if self._savepoint:
            self.connection.execute("rollback to ev")
            self.connection.execute("release ev")
            self._savepoint = False

    async def flush(self) -> None:
        if self._savepoint:
            self.connection.execute("release ev")  # a skipped event: nothing written
            self._savepoint = False
        if self._in_tx:
            self.connection.execute("commit")
            self._in_tx = False

    async def assigned(self, partitions: Iterable[int]) -> None:
        pass  # every read goes to the file: nothing cached to reload

    async def close(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            if self._in_tx:
                con.execute("rollback")  # not flushed: not handled, comes again
            self._in_tx = self._savepoint = False
            con.close()

    def all(self) -> dict[str, Position]:
        """Every position of the group (for tests and inspection)."""
        rows = self.connection.execute(
            "select uid, resource_version, deleted from positions where grp = ?", (self.group,)
        )
        return {uid: Position(int(rv), bool(d)) for uid, rv, d in rows}


class BusPositions:
    """What the stores on the group's bus share: the positions read whole (``_read``)
    at open and at every assignment, recorded in memory, and those recorded since
    the last flush written back (``_write``) at ``flush``; what could not be
    written stays for the next one."""

    # The bus's errors that mean "not now"; and where, for the message.
    _unavailable: tuple[type[BaseException], ...] = ()
    _where = ""

    def __init__(self) -> None:
        self._positions: dict[str, Position] = {}
        self._pending: dict[str, Position] = {}

    async def _read(self) -> dict[str, Position]:
        raise NotImplementedError

    async def _write(self, pending: dict[str, Position]) -> None:
        raise NotImplementedError

    async def _load(self) -> None:
        # What was recorded here and not yet flushed stands over what the bus holds.
        self._positions = await self._read() | self._pending

    async def get(self, uid: str) -> Position | None:
        return self._positions.get(uid)

    def record(self, uid: str, position: Position, partition: int) -> None:
        self._positions[uid] = self._pending[uid] = position

    async def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            await self._write(pending)
        except self._unavailable as e:
            self._pending = pending | self._pending
            raise SinkUnavailableError(f"{self._where}: {e!r}") from e

    def unhandled(self) -> None:
        pass  # nothing is written for an event before it is recorded

    async def assigned(self, partitions: Iterable[int]) -> None:
        await self._load()
