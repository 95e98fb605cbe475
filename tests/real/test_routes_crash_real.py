"""kill -9 at random moments with two routes, on a real kube-apiserver and Apache Kafka.

The crash property of tests/real/test_crash_property_real.py, with
``sink.routing: all`` and two routes: ``every`` (``when: true``) and ``even``
(Pods whose name ends in an even digit), each its own topic. The oracle is
aiokafka's consumer (``read_committed`` with exactly-once), per route:

- each route holds the property on its own objects: every state published is a
  real one, in order per object, every delete of an object that reached the
  route is there, every live object's current state is its last event there;
- the default topic gets nothing (every event matched a route);
- with ``sink.kafka.exactlyOnce`` no id twice on either route, and ``even`` is
  exactly ``every`` restricted to the even Pods: the two routes of a batch
  commit in one transaction, so a kill cannot leave one route without what the
  other has.

Against JetStream the same kills: each route's copies carry ``Nats-Msg-Id``
``{id}@{route}``, so no id twice on a route, and each route holds the property.

The seed is in every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import copy
import os
import random
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.e2e.bridge_process import BridgeProcess, jetstream_events, kill9
from tests.e2e.crash_world import (
    World,
    check_property,
    crash_rounds,
    kafka_checkpoint_settled,
    kafka_events,
    seed,
    sqlite_settled,
)
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.realkafka import KafkaBroker
from tests.real.eos_world import OpenTransactions, make_topics
from tests.real.test_crash_property_real import INITIAL, ROUNDS, config, real_target

pytestmark = [pytest.mark.timeout(360)]

Body = dict[str, Any]
EVEN = "object.metadata.name.matches('[02468]$')"


def is_even(name: str) -> bool:
    return name[-1] in "02468"


def topics(tag: str) -> tuple[str, str, str]:
    return f"routed-{tag}", f"routed-every-{tag}", f"routed-even-{tag}"


def routed_sink(bootstrap: str, tag: str, **kafka: Any) -> Body:
    default, every, even = topics(tag)
    return {
        "kind": "kafka",
        "kafka": {"bootstrapServers": [bootstrap], "topic": default, **kafka},
        "routing": "all",
        "routes": [
            {"name": "every", "when": "true", "topic": every},
            {"name": "even", "when": EVEN, "topic": even},
        ],
    }


def even_world(world: World) -> World:
    """The World as route ``even`` sees it: only its Pods are live there."""
    view = copy.copy(world)
    view.live = {name: uid for name, uid in world.live.items() if is_even(name)}
    return view


def name_of(e: Body) -> str:
    return str(e["subject"]).split("/", 1)[1]


async def check_routes(
    world: World, bootstrap: str, tag: str, s: int, isolation_level: str
) -> tuple[list[Body], list[Body]]:
    default, every_topic, even_topic = topics(tag)
    every = await kafka_events(bootstrap, every_topic, isolation_level=isolation_level)
    even = await kafka_events(bootstrap, even_topic, isolation_level=isolation_level)
    check_property(world, every, s, f"route every ({isolation_level})")
    check_property(even_world(world), even, s, f"route even ({isolation_level})")
    odd = [e["id"] for e in even if not is_even(name_of(e))]
    assert not odd, f"odd Pods on route even: {odd[:5]} (CRASH_SEED={s})"
    # Nothing went to the default topic: the broker (auto-creating topics) never made it.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        assert default not in await admin.list_topics(), f"default topic used (CRASH_SEED={s})"
    finally:
        await admin.close()
    return every, even


async def test_kill9_with_two_routes_each_route_keeps_the_property(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    s = seed()
    ns = kube_namespace
    tag = uuid.uuid4().hex[:8]
    world = await crash_rounds(
        real_target(kube_cluster, ns, random.Random(s + 1)),
        config(tmp_path, kube_cluster, ns, routed_sink(real_kafka.bootstrap, tag)),
        random.Random(s),
        ROUNDS,
        sqlite_settled(tmp_path / "state.db", f"core/v1/pods@{ns}"),
        initial=INITIAL,
        seed=s,
    )
    # Each route on its own, as without routing. Not "the same ids on both": at least
    # once, a kill after one route took a batch and before the other did leaves that
    # state only where it landed, when the object moved on while the bridge was down
    # (the restart publishes the newer state), as it leaves it nowhere without routes.
    await check_routes(world, real_kafka.bootstrap, tag, s, "read_uncommitted")


async def test_kill9_with_two_routes_and_exactly_once_nothing_twice_and_routes_agree(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, real_kafka: KafkaBroker
) -> None:
    s = seed()
    ns = kube_namespace
    tag = uuid.uuid4().hex[:8]
    sink = routed_sink(
        real_kafka.bootstrap, tag, exactlyOnce=True, transactionalIdPrefix=f"routed-{tag}"
    )
    cp_topic = f"routed-cp-{tag}"
    checkpoint = {"kind": "kafka", "kafka": {"topic": cp_topic}, "commitInterval": 1.0}
    _, every_topic, even_topic = topics(tag)
    # One partition each, made before the bridge starts, so the probe knows them.
    await make_topics(real_kafka.bootstrap, every_topic, cp_topic)
    await make_topics(real_kafka.bootstrap, even_topic, f"routed-unused-{tag}")
    rng = random.Random(s)
    caught: list[bool] = []
    async with OpenTransactions(real_kafka.bootstrap, [even_topic]) as probe:

        async def kill_with_route_even_open(bridge: BridgeProcess, world: World) -> None:
            """Stop the bridge at instants until a transaction is open on route even's
            topic, then kill -9 it: the moment where a route committed apart from the
            other would be lost or doubled."""
            assert bridge.proc is not None
            for _ in range(100):
                os.kill(bridge.proc.pid, signal.SIGSTOP)
                if await probe.open_on():
                    caught.append(True)
                    break
                os.kill(bridge.proc.pid, signal.SIGCONT)
                await world.churn(rng.uniform(0.005, 0.05))
            kill9(bridge)

        world = await crash_rounds(
            real_target(kube_cluster, ns, random.Random(s + 1)),
            config(tmp_path, kube_cluster, ns, sink, checkpoint),
            rng,
            ROUNDS,
            kafka_checkpoint_settled(real_kafka.bootstrap, cp_topic, f"core/v1/pods@{ns}"),
            initial=INITIAL,
            seed=s,
            kill=kill_with_route_even_open,
        )
    assert len(caught) >= ROUNDS // 2, f"only {len(caught)} kills inside (CRASH_SEED={s})"
    every, even = await check_routes(world, real_kafka.bootstrap, tag, s, "read_committed")
    for route, evs in (("every", every), ("even", even)):
        twice = [i for i, n in Counter(e["id"] for e in evs).items() if n > 1]
        assert not twice, f"{len(twice)} ids twice on route {route}: {twice[:5]} (CRASH_SEED={s})"
    # Exactly once on both: route even is route every restricted to the even Pods, in order.
    want = [e["id"] for e in every if is_even(name_of(e))]
    got = [e["id"] for e in even]
    assert sorted(got) == sorted(want), (
        f"routes differ: {len(set(want) - set(got))} missing on even,"
        f" {len(set(got) - set(want))} extra (CRASH_SEED={s})"
    )
    print(
        f"seed {s}: {ROUNDS} kills, {len(caught)} inside a transaction open on route even;"
        f" {len(every)} events on every, {len(even)} on even"
    )


async def test_kill9_with_two_routes_against_jetstream_each_route_keeps_every_copy_once(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    """The same kills against JetStream: each route's copies carry ``{id}@{route}``, so
    the duplicate window keeps one copy per route and drops every redelivery."""
    s = seed()
    ns = kube_namespace
    stream = "R" + uuid.uuid4().hex[:8]
    sink = {
        "kind": "nats",
        "nats": {
            "servers": [nats_control.url],
            "stream": stream,
            "subjects": [f"{stream}.>"],
        },
        "routing": "all",
        "routes": [
            {"name": "every", "when": "true", "subjectPrefix": f"{stream}.every"},
            {"name": "even", "when": EVEN, "subjectPrefix": f"{stream}.even"},
        ],
    }
    world = await crash_rounds(
        real_target(kube_cluster, ns, random.Random(s + 1)),
        config(tmp_path, kube_cluster, ns, sink),
        random.Random(s),
        ROUNDS,
        sqlite_settled(tmp_path / "state.db", f"core/v1/pods@{ns}"),
        initial=INITIAL,
        seed=s,
    )
    events = await jetstream_events(nats_control.url, stream)
    on: dict[str, list[Body]] = {"every": [], "even": []}
    for e in events:
        route = e["_subject"].split(".")[1]
        assert e["_msg_id"] == f"{e['id']}@{route}", f"{e['_msg_id']} (CRASH_SEED={s})"
        on[route].append(e)
    for route, evs in on.items():
        ids = [e["id"] for e in evs]
        assert len(ids) == len(set(ids)), f"an id twice on route {route} (CRASH_SEED={s})"
    check_property(world, on["every"], s, "jetstream route every")
    check_property(even_world(world), on["even"], s, "jetstream route even")
    odd = [e["id"] for e in on["even"] if not is_even(name_of(e))]
    assert not odd, f"odd Pods on route even: {odd[:5]} (CRASH_SEED={s})"
