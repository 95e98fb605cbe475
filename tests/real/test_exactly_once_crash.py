"""Exactly-once under kill -9 inside open transactions, in the shape users run it:
several resources (four pipelines, four transactional producers sharing the
checkpoint partition) on kube-apiserver + etcd and Apache Kafka, no NATS.

Each round the bridge runs under churn and is then killed. Most kills are
*proved* to land inside an open transaction: the bridge is stopped (SIGSTOP)
at a random instant, and killed only if a topic's last stable offset stands
behind its high watermark then; otherwise it runs on a little and is tried
again. While it is down objects change and are deleted, and sometimes etcd is
compacted. The judge is aiokafka's ``read_committed`` consumer, never the
bridge's reader: every state the API server served is on the bus exactly once,
in order per object, every delete once, and a state is missing only where a
LIST (the first sync, a 410 relist) passed over it
(tests/real/eos_world.py says how that is told).

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import os
import random
import signal
import uuid
from pathlib import Path

import pytest

from tests.e2e.bridge_process import BridgeProcess, kill9, write_config
from tests.e2e.crash_world import seed
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realkafka import KafkaBroker
from tests.fixtures.waiting import until
from tests.real.eos_world import (
    EosWorld,
    OpenTransactions,
    check_every_change_once,
    fingerprints_match,
    kinds,
    listed_at,
    live_caught_up,
    make_topics,
    read_committed,
    relists_by_choice,
    resources,
)

pytestmark = [pytest.mark.timeout(420)]

INITIAL = 1200
ROUNDS = 6
RATE = 40.0


async def started(bridge: BridgeProcess, world: EosWorld) -> None:
    """Churn until the bridge answers on its health port."""
    for _ in range(300):
        if (await bridge.readyz())[0]:
            return
        assert bridge.proc is not None and bridge.proc.returncode is None, bridge.tail_log()
        await world.churn(0.2, RATE)
    raise AssertionError(f"bridge not listening:\n{bridge.tail_log()}")


async def kill_inside_a_transaction(
    bridge: BridgeProcess, probe: OpenTransactions, world: EosWorld, rng: random.Random
) -> list[str]:
    """Stop the bridge at random instants until a transaction is open on the events
    topic (or, failing that for long, on any), then kill -9 it; returns the topics
    with a transaction open at the kill ([] if none was caught)."""
    assert bridge.proc is not None
    pid = bridge.proc.pid
    for attempt in range(120):
        os.kill(pid, signal.SIGSTOP)
        open_on = await probe.open_on()
        if probe.topics[0] in open_on or (open_on and attempt >= 60):
            kill9(bridge)
            return open_on
        os.kill(pid, signal.SIGCONT)
        await world.churn(rng.uniform(0.01, 0.25), RATE)
    kill9(bridge)
    return []


async def test_kill9_inside_open_transactions_publishes_every_change_once(
    tmp_path: Path, kube_cluster: KubeCluster, real_kafka: KafkaBroker
) -> None:
    s = seed()
    rng = random.Random(s)
    ns, ns2 = kube_cluster.namespace("eos"), kube_cluster.namespace("eos")
    world = EosWorld(kube_cluster, kinds(ns, ns2), random.Random(s + 1))
    tag = uuid.uuid4().hex[:8]
    topic, cp_topic = f"eos-{tag}", f"eos-cp-{tag}"
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kube_cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        resources=resources(world.kinds),
        sink={
            "kind": "kafka",
            "kafka": {
                "bootstrapServers": [real_kafka.bootstrap],
                "topic": topic,
                "exactlyOnce": True,
                "transactionalIdPrefix": f"eos-{tag}",
            },
        },
        checkpoint={"kind": "kafka", "kafka": {"topic": cp_topic}, "commitInterval": 1.0},
    )
    await make_topics(real_kafka.bootstrap, topic, cp_topic)
    for _ in range(INITIAL):
        world.create()
    where = f"(CRASH_SEED={s})"
    inside: list[list[str]] = []
    bridge = BridgeProcess(config)
    async with OpenTransactions(real_kafka.bootstrap, [topic, cp_topic]) as probe:
        for r in range(ROUNDS):
            bridge = BridgeProcess(config)
            await bridge.start()
            await started(bridge, world)
            if r:  # the first kill lands in the first sync, every producer in a transaction
                await world.churn(rng.uniform(0.2, 3.0), RATE)
            open_on: list[str] = []
            if not r or rng.random() < 0.8:
                open_on = await kill_inside_a_transaction(bridge, probe, world, rng)
                inside.append(open_on)
            else:  # and now and then at a plain random instant
                kill9(bridge)
            assert bridge.proc is not None
            await bridge.proc.wait()
            world.log.append(f"r{r} killed, transactions open on {open_on}")
            for _ in range(rng.randrange(40)):
                world.step()
            if rng.random() < 0.4:
                world.log.append(f"r{r} compacted etcd at {kube_cluster.compact()}")
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(90)
        await world.churn(0.5, RATE)

        async def caught_up() -> bool:
            return live_caught_up(world, await read_committed(real_kafka.bootstrap, topic))

        await until(caught_up, 90, lambda: f"not caught up {where}:\n{bridge.tail_log()}")
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    events = await read_committed(real_kafka.bootstrap, topic)
    assert not relists_by_choice([bridge.log]), where
    verdict = check_every_change_once(world, events, listed_at([bridge.log]), where)
    assert not fingerprints_match(world, events), where
    proved = sum(1 for t in inside if t)
    assert proved >= ROUNDS // 2, f"only {proved} of {ROUNDS} kills inside a transaction {where}"
    print(
        f"seed {s}: {ROUNDS} kills, {proved} inside an open transaction; {world.changes}"
        f" changes, {verdict.states} states, {verdict.checked} published once,"
        f" {verdict.collapsed} passed over by a LIST; {verdict.events} events; {world.log}"
    )
