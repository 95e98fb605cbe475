"""A write-ahead row precedes every send: when the sink is handed an event, the
checkpoint already holds its object as the bus may hold it once the event lands
(``UNCERTAIN``, or ``DELETING`` for a delete), so a crash at any instant after the
send leaves no event on the bus whose object the checkpoint does not know."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.emulator import Emulator
from bridge.ground.digest import DELETING, UNCERTAIN, Digest
from bridge.ground.envelope import Event
from tests.doubles.memory_sink import MemorySink
from tests.fixtures.pipeline import Harness, pod
from tests.fixtures.waiting import until

pytestmark = pytest.mark.integration

RID = "core/v1/pods"


class StoreTakingTurns(MemoryCheckpointStore):
    """Gives the event loop a turn in each commit, as a store doing I/O does: whatever
    is not ordered after the write-ahead may run before it lands."""

    async def commit(
        self,
        resource_id: str,
        resource_version: str | None,
        upserts: Iterable[Digest],
        deletes: Iterable[str],
    ) -> None:
        await asyncio.sleep(0.002)
        await super().commit(resource_id, resource_version, upserts, deletes)


class WitnessSink(MemorySink):
    """Notes each event whose object the checkpoint did not hold written ahead when
    the event was handed to the bus."""

    def __init__(self, checkpoints: MemoryCheckpointStore) -> None:
        super().__init__()
        self._checkpoints = checkpoints
        self.unknown: list[str] = []

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        cp = await self._checkpoints.load(RID)
        rows = cp.digests if cp is not None else {}
        for e in events:
            row = rows.get(e.subject)
            # The row holds the key's last state in the batch (a change and then
            # the delete of one object leave it DELETING), never a certain one.
            if row is None or row.state not in (UNCERTAIN, DELETING):
                self.unknown.append(f"{e.type.rpartition('.')[2]} {e.subject}")
        return await super().publish(events)


async def test_every_event_is_written_ahead_before_the_sink_gets_it(
    harness: Harness, emulator: Emulator
) -> None:
    harness.checkpoints = StoreTakingTurns()
    sink = harness.sink = WitnessSink(harness.checkpoints)
    for i in range(5):
        emulator.create(pod(f"w{i}"))
    async with harness.running() as p:
        await until(lambda: len(sink.events) == 5)
        for i in range(5):
            emulator.patch("v1", "Pod", f"w{i}", {"spec": {"nodeName": "n1"}}, namespace="default")
        emulator.delete("v1", "Pod", "w0", namespace="default")
        await until(lambda: len(sink.events) == 11)
        assert p.sink_healthy
    assert sink.unknown == []
