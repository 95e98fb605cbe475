"""Positions of a consumer group: which events are redeliveries, and the SQLite store's
transaction (the handler's writes commit with the positions, or not at all)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bridge.consuming.positions import Position, SqlitePositions, advanced, event_uid, is_new
from bridge.ground.envelope import ReceivedEvent


def ev(change: str, rv: int | str, uid: str = "u1") -> ReceivedEvent:
    eid = {"deleted": f"{uid}:deleted", "filtered": f"{uid}:filtered:{rv}",
           "snapshot": f"{uid}:{rv}:snapshot:s1"}.get(change, f"{uid}:{rv}")  # fmt: skip
    doc = {"id": eid, "type": f"io.k8s.core.v1.Pod.{change}", "source": "s"}
    return ReceivedEvent.parse(orjson.dumps(doc | {"resourceversion": str(rv)}))


@pytest.mark.parametrize(
    ("position", "event", "new"),
    [
        (None, ev("added", 5), True),
        (Position(5), ev("modified", 6), True),
        (Position(5), ev("modified", 5), False),  # the same version again
        (Position(10), ev("modified", 9), False),  # compared as integers, not strings
        (Position(5), ev("deleted", 5), True),  # a tombstone's rv is the last known one
        (Position(5, deleted=True), ev("deleted", 5), False),
        (Position(5, deleted=True), ev("modified", 9), False),  # a uid never comes back
        (Position(5), ev("filtered", 7), True),
        (Position(7), ev("added", 9), True),  # back into view after filtered at 7
        (Position(7), ev("snapshot", 7), False),  # a re-statement of what was handled
        (Position(7), ev("modified", "x"), True),  # not orderable: never dropped
    ],
)
def test_a_redelivery_is_an_event_not_newer_than_the_position(
    position: Position | None, event: ReceivedEvent, new: bool
) -> None:
    assert is_new(position, event) is new


def test_positions_advance_and_a_delete_ends_the_uid() -> None:
    p = advanced(None, ev("added", 5))
    assert p == Position(5)
    assert advanced(p, ev("deleted", 5)) == Position(5, deleted=True)
    assert event_uid(ev("filtered", 3, uid="abc")) == "abc"


async def test_sqlite_commits_the_handlers_writes_with_the_positions(tmp_path: Path) -> None:
    store = SqlitePositions(tmp_path / "p.db", group="g")
    await store.open()
    store.connection.execute("create table handled (id text)")
    # Handed out, handled, recorded: the handler's row and the position commit together.
    assert await store.get("u1") is None
    store.connection.execute("insert into handled values ('u1:5')")
    store.record("u1", Position(5), 0)
    # Handed out and not handled (the consumer closes while the caller holds it).
    assert await store.get("u2") is None
    store.connection.execute("insert into handled values ('u2:7')")
    store.unhandled()
    await store.flush()
    await store.close()

    again = SqlitePositions(tmp_path / "p.db", group="g")
    await again.open()
    assert again.all() == {"u1": Position(5)}
    assert again.connection.execute("select id from handled").fetchall() == [("u1:5",)]
    # A crash before the flush (close without it) loses both, never one of them.
    await again.get("u3")
    again.connection.execute("insert into handled values ('u3:1')")
    again.record("u3", Position(1), 0)
    await again.close()
    last = SqlitePositions(tmp_path / "p.db", group="g")
    await last.open()
    assert "u3" not in last.all()
    assert ("u3:1",) not in last.connection.execute("select id from handled").fetchall()
    await last.close()
