"""kill -9 of a group consumer at random instants: every change handled, none twice.

A bridge process publishes Pod churn (creates, updates, deletes, names reused)
from the API emulator to a real Apache Kafka topic of three partitions, or to
a real JetStream stream. Consumer processes (tests/e2e/consumer_worker.py) of
one group record each event they are handed, in the same SQLite transaction
as the group's positions; they are killed with SIGKILL at random instants
(``random.uniform`` after their start, not at convenient points) and started
again, one worker or two in one group (each kill and start is a rebalance on
Kafka, a lease takeover on JetStream). When the bridge has settled, a last
round of workers runs until it caught up; then what they handled, per uid, is
exactly the oracle's changes in order: the topic read whole by aiokafka's own
read_committed consumer (Kafka), the stream read message by message
(JetStream), with redeliveries of the bus left out the same way (the first
of an id; on one object, only a newer resourceVersion, or the delete).

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import sys
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bridge.emulator import Emulator
from bridge.ground.envelope import ReceivedEvent
from tests.e2e.bridge_process import BridgeProcess, jetstream_events, kafka_sink, write_config
from tests.e2e.crash_world import Target, World, kafka_events, seed, sqlite_settled
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ROUNDS = 6
INITIAL = 40


class Worker:
    """One consumer_worker process; ``start`` again after ``kill9``."""

    def __init__(
        self, config: Path, group: str, db: Path, name: str, store: str, *extra: str
    ) -> None:
        self.args = [str(config), group, str(db), name, "--store", store, *extra]
        self.name = name
        self.log = config.parent / f"worker-{name}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.e2e.consumer_worker", *self.args,
                stdout=asyncio.subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    async def kill9(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"worker {self.name} exited {self.proc.returncode}:\n{tail}")


def expected_per_uid(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The changes a consumer must handle, per uid, in bus order: the oracle's events
    with the bus's own redeliveries left out (an id seen before, or not newer)."""
    # Written out here rather than imported from bridge.consuming: the oracle must not
    # change with the code under test.
    last_rv: dict[str, int] = {}
    deleted: set[str] = set()
    out: dict[str, list[str]] = defaultdict(list)
    for doc in events:
        e = ReceivedEvent.parse(doc["_raw"]) if "_raw" in doc else doc["_event"]
        if e.type == "io.k8s.bridge.heartbeat":
            continue
        uid = e.id.split(":", 1)[0]
        if uid in deleted:
            continue
        if e.change == "deleted":
            deleted.add(uid)
        elif int(e.resource_version) <= last_rv.get(uid, 0):
            continue
        last_rv[uid] = max(last_rv.get(uid, 0), int(e.resource_version))
        out[uid].append(e.id)
    return out


def handled_per_uid(db: Path) -> dict[str, list[str]]:
    con = sqlite3.connect(db, timeout=30)
    try:
        rows = con.execute("select uid, id from handled order by seq").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()
    out: dict[str, list[str]] = defaultdict(list)
    for uid, event_id in rows:
        out[uid].append(event_id)
    return out


async def run_crash_rounds(
    tmp_path: Path,
    emulator: Emulator,
    sink: dict[str, Any],
    workers_n: int,
    oracle: Any,
    s: int,
    store: str = "sqlite",
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    rng = random.Random(s)
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"),
        sink=sink,
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint={"kind": "sqlite", "path": str(tmp_path / "state.db"), "flushInterval": 0.2},
    )
    world = World(
        Target(emulator, "default", lambda: "", settled_rv=lambda: emulator.resource_version),
        rng,
    )
    for _ in range(INITIAL):
        world.create()
    db = tmp_path / "consumer.db"
    group = "crash-" + uuid.uuid4().hex[:6]
    workers = [Worker(config, group, db, f"w{i}", store) for i in range(workers_n)]
    bridge = BridgeProcess(config)
    await bridge.start()
    stop = asyncio.Event()

    async def churn() -> None:
        while not stop.is_set():
            world.step()
            await asyncio.sleep(1 / 60)

    churner = asyncio.create_task(churn())
    try:
        await bridge.wait_ready(60)
        for w in workers:
            await w.start()
        for r in range(ROUNDS):
            victim = rng.choice(workers)
            # A random instant of the victim's life: starting, joining, reading, handling.
            await asyncio.sleep(rng.uniform(0.2, 3.0))
            world.log.append(f"round {r}: kill -9 {victim.name}")
            await victim.kill9()
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0.0, 1.0))
            await victim.start()
        stop.set()
        await churner
        settled = sqlite_settled(tmp_path / "state.db")
        await until(
            lambda: settled(world),
            30,
            lambda: f"bridge not settled (CRASH_SEED={s}):\n{bridge.tail_log()}",
        )
        expected = expected_per_uid(await oracle())

        def caught_up() -> bool:
            for w in workers:
                w.check_alive()
            handled = handled_per_uid(db)
            return all(set(handled.get(u, ())) >= set(ids) for u, ids in expected.items())

        try:
            await until(caught_up, 45)
        except AssertionError:
            pass  # the comparison below says what differs
        return expected, handled_per_uid(db)
    finally:
        stop.set()
        if not churner.done():
            churner.cancel()
        await asyncio.gather(churner, return_exceptions=True)
        for w in workers:
            await w.kill9()
        assert await bridge.stop() == 0, bridge.tail_log()


def check(expected: dict[str, list[str]], handled: dict[str, list[str]], s: int, bus: str) -> None:
    where = f"(CRASH_SEED={s}, {bus}, {sum(map(len, expected.values()))} changes)"
    assert sum(map(len, expected.values())) > 100, f"too little churn {where}"
    for uid, ids in handled.items():
        assert len(ids) == len(set(ids)), f"{uid} handled twice: {ids} {where}"
    missing = {u: [i for i in ids if i not in handled.get(u, [])] for u, ids in expected.items()}
    missing = {u: ids for u, ids in missing.items() if ids}
    assert not missing, f"never handled: {dict(list(missing.items())[:5])} {where}"
    for uid, ids in handled.items():
        assert ids == expected.get(uid), f"{uid}: handled {ids}, bus {expected.get(uid)} {where}"


def check_at_least_once(
    expected: dict[str, list[str]], handled: dict[str, list[str]], s: int, bus: str
) -> int:
    """Nothing skipped, nothing invented, per uid in order except where a crash made the
    group read a stretch again (its positions not flushed yet). Returns the repeats."""
    where = f"(CRASH_SEED={s}, {bus}, {sum(map(len, expected.values()))} changes)"
    repeats = 0
    for uid, ids in expected.items():
        got = handled.get(uid, [])
        assert set(got) == set(ids), f"{uid}: handled {got}, bus {ids} {where}"
        top = -1
        for event_id in got:
            i = ids.index(event_id)
            assert i <= top + 1, f"{uid}: {event_id} handled before {ids[top + 1]} {where}"
            repeats += i <= top
            top = max(top, i)
    return repeats


async def partitioned_topic(
    kafka_broker: str,
) -> tuple[str, Callable[[], Awaitable[list[dict[str, Any]]]]]:
    """A fresh topic of three partitions (two workers share them, a rebalance moves
    them), and its oracle: every event as aiokafka's read_committed consumer reads it."""
    topic = "consume-crash-" + uuid.uuid4().hex[:8]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()

    async def oracle() -> list[dict[str, Any]]:
        return [
            {"_event": ReceivedEvent.parse(_raw(e))}
            for e in await kafka_events(kafka_broker, topic, isolation_level="read_committed")
        ]

    return topic, oracle


@pytest.mark.parametrize("workers", [1, 2])
async def test_consumer_kill9_against_kafka(
    tmp_path: Path, emulator: Emulator, kafka_broker: str, workers: int
) -> None:
    s = seed()
    topic, oracle = await partitioned_topic(kafka_broker)
    expected, handled = await run_crash_rounds(
        tmp_path, emulator, kafka_sink(kafka_broker, topic), workers, oracle, s
    )
    check(expected, handled, s, f"kafka, {workers} worker(s)")


@pytest.mark.parametrize("workers", [1, 2])
async def test_consumer_kill9_against_jetstream(
    tmp_path: Path, emulator: Emulator, nats_control: NatsServer, workers: int
) -> None:
    s = seed()

    async def oracle() -> list[dict[str, Any]]:
        return await jetstream_events(nats_control.url)

    expected, handled = await run_crash_rounds(
        tmp_path,
        emulator,
        {"kind": "nats", "nats": {"servers": [nats_control.url]}},
        workers,
        oracle,
        s,
    )
    check(expected, handled, s, f"jetstream, {workers} worker(s)")


def _raw(doc: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(doc)


async def test_consumer_kill9_with_positions_on_the_bus(
    tmp_path: Path, emulator: Emulator, kafka_broker: str
) -> None:
    """The group's own stores (a compacted topic on Kafka): nothing is skipped across
    kills and rebalances; what is handled twice is only what the at-least-once window
    (handled, positions not yet flushed) allows (docs/consuming.md)."""
    s = seed()
    topic, oracle = await partitioned_topic(kafka_broker)
    expected, handled = await run_crash_rounds(
        tmp_path, emulator, kafka_sink(kafka_broker, topic), 2, oracle, s, store="bus"
    )
    check_at_least_once(expected, handled, s, "kafka, positions topic, 2 workers")


async def test_consumer_kill9_with_positions_in_nats_kv(
    tmp_path: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """As above, on JetStream with the positions in the group's KV bucket."""
    s = seed()

    async def oracle() -> list[dict[str, Any]]:
        return await jetstream_events(nats_control.url)

    sink = {"kind": "nats", "nats": {"servers": [nats_control.url]}}
    expected, handled = await run_crash_rounds(tmp_path, emulator, sink, 2, oracle, s, store="bus")
    check_at_least_once(expected, handled, s, "jetstream, positions in KV, 2 workers")


@pytest.mark.parametrize("bus", ["kafka", "jetstream"])
async def test_a_consumer_killed_between_positions_and_acks_recognises_the_redelivery(
    tmp_path: Path, emulator: Emulator, request: pytest.FixtureRequest, bus: str
) -> None:
    """The window that only positions cover, hit on purpose: the worker kills itself
    right after a flush of its positions, before the offsets are committed (the acks
    sent). Its successor reads those events again and must recognise every one."""
    if bus == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker")
        topic = "consume-window-" + uuid.uuid4().hex[:8]
        sink = kafka_sink(bootstrap, topic)

        async def oracle() -> list[dict[str, Any]]:
            return [
                {"_event": ReceivedEvent.parse(_raw(e))}
                for e in await kafka_events(bootstrap, topic, isolation_level="read_committed")
            ]
    else:
        url = request.getfixturevalue("nats_control").url
        sink = {"kind": "nats", "nats": {"servers": [url]}}

        async def oracle() -> list[dict[str, Any]]:
            return await jetstream_events(url)

    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"),
        sink=sink,
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint={"kind": "sqlite", "path": str(tmp_path / "state.db"), "flushInterval": 0.2},
    )
    world = World(
        Target(emulator, "default", lambda: "", settled_rv=lambda: emulator.resource_version),
        random.Random(seed()),
    )
    db = tmp_path / "consumer.db"
    group = "window-" + uuid.uuid4().hex[:6]
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        for _ in range(40):
            world.create()
        for _ in range(120):  # while the bridge watches: several changes per object
            world.step()
            await asyncio.sleep(0.005)
        settled = sqlite_settled(tmp_path / "state.db")
        await until(lambda: settled(world), 30, bridge.tail_log)
        expected = expected_per_uid(await oracle())
        dying = Worker(config, group, db, "dying", "sqlite", "--die-after-flush", "2")
        await dying.start()
        assert dying.proc is not None
        try:
            code = await asyncio.wait_for(dying.proc.wait(), 30)
        finally:
            await dying.kill9()
        assert code == -9, dying.log.read_text()[-2000:]
        survivor = Worker(config, group, db, "survivor", "sqlite")
        await survivor.start()
        try:
            await until(lambda: handled_per_uid(db) == expected, 45)
        except AssertionError:
            pass  # the comparison below says what differs
        finally:
            await survivor.kill9()
        check(expected, handled_per_uid(db), 0, f"{bus}, killed between positions and acks")
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
