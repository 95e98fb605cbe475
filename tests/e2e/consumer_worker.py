"""A ``consume(..., group=...)`` worker in a process of its own, for the kill -9 tests.

``python -m tests.e2e.consumer_worker CONFIG GROUP DB NAME [--kafka-session-ms N]``
records every event it is handed in the table ``handled`` of the SQLite file
``DB``. With ``--store sqlite`` (the default) through the connection of the
group's ``SqlitePositions`` in the same file: the record and the position
commit together (the handler's effect is exactly once), so a row twice is a
redelivery the consumer did not recognise. With ``--store bus`` the positions
are the group's own on its bus and the record is written on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import sqlite3
from typing import Any

from bridge.consumer import consume
from bridge.consuming.positions import SqlitePositions
from bridge.service.settings import load_settings

HANDLED = (
    "create table if not exists handled (seq integer primary key autoincrement,"
    " worker text, uid text, rv text, id text, change text)"
)


class DyingPositions(SqlitePositions):
    """Killed (SIGKILL, by itself) right after its ``die_after``-th flush that wrote
    something: inside the window where positions are durable and the offsets / acks
    are not, the one only the positions can recognise."""

    def __init__(self, *args: Any, die_after: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.die_after = die_after
        self.flushes = 0

    async def flush(self) -> None:
        wrote = self._in_tx
        await super().flush()
        if wrote:
            self.flushes += 1
            if self.flushes >= self.die_after:
                os.kill(os.getpid(), signal.SIGKILL)


async def main(args: argparse.Namespace) -> None:
    settings = load_settings(args.config)
    positions: SqlitePositions | None = None
    if args.store == "sqlite":
        if args.die_after_flush:
            positions = DyingPositions(args.db, group=args.group, die_after=args.die_after_flush)
        else:
            positions = SqlitePositions(args.db, group=args.group)
        await positions.open()
        record = positions.connection
    else:
        # The group's own store on its bus; the record is the handler's own, in
        # autocommit: what the at-least-once window delivers again shows as a row twice.
        record = sqlite3.connect(args.db, timeout=30, isolation_level=None)
        record.execute("pragma journal_mode=wal")
    record.execute(HANDLED)
    options: dict[str, Any] = {}
    if settings.sink.kind == "kafka":
        options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
    else:
        options = {"lease_seconds": args.lease_seconds}
    async for event in consume(
        settings,
        group=args.group,
        positions=positions,
        from_start=True,
        commit_interval=args.commit_interval,
        group_options=options,
    ):
        # A handler takes time (I/O): most kills land inside one, as they would.
        await asyncio.sleep(args.handler_seconds)
        record.execute(
            "insert into handled (worker, uid, rv, id, change) values (?, ?, ?, ?, ?)",
            (args.name, event.id.split(":", 1)[0], event.resource_version, event.id, event.change),
        )


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, on demand
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("group")
    parser.add_argument("db")
    parser.add_argument("name")
    parser.add_argument("--commit-interval", type=float, default=0.5)
    parser.add_argument("--lease-seconds", type=float, default=3.0)
    parser.add_argument("--handler-seconds", type=float, default=0.01)
    parser.add_argument("--store", choices=["sqlite", "bus"], default="sqlite")
    parser.add_argument("--die-after-flush", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
