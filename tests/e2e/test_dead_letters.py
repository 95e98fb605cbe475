"""``poisonPolicy: deadLetter`` on real Apache Kafka and a real nats-server.

The bridge runs as a process against the emulator. Events the bus refuses for good
go to the dead-letter destination, whole, or cut to that destination's limit (said
in ``deadletter_cut``), with headers saying why; the main stream gets the truncated
copy (same id), so consumers still see the change. The oracle is an independent
consumer (aiokafka, read_committed under exactlyOnce; nats-py) of both streams.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from bridge.emulator import Emulator
from tests.doubles.contract import assert_valid
from tests.e2e.bridge_process import BridgeProcess, kill9, until, write_config
from tests.fixtures.nats import NatsServer, free_port, wait_for_port
from tests.real.kafkabus import read_topic

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

MAIN_LIMIT = 20_000  # the main topic's max.message.bytes / stream's max_msg_size
REQUEST_LIMIT = 200_000  # sink.kafka.maxRequestSize / the NATS server's max_payload


def pod(name: str, blob: int = 0) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"app": "web"}}
    if blob:
        md["annotations"] = {"blob": "x" * blob}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


def poison_counts(metrics: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "k8s_bridge_poison_events_total" and s.value:
                out[s.labels["outcome"]] = int(s.value)
    return out


async def counted(bridge: BridgeProcess, want: dict[str, int]) -> None:
    seen: dict[str, int] = {}

    async def reached() -> bool:
        nonlocal seen
        seen = poison_counts(await bridge.metrics())
        return seen == want

    await until(reached, 20, lambda: f"poison counts {seen}")


def check_letter(value: bytes, headers: dict[str, str], event: dict[str, Any], cut: bool) -> None:
    """A dead letter against the main stream's truncated copy of its event."""
    assert headers["ce_id"] == event["id"] and headers["ce_subject"] == event["subject"]
    size = int(headers["deadletter_size"])
    if cut:
        assert int(headers["deadletter_cut"]) == len(value) < size, headers
        return
    assert "deadletter_cut" not in headers and len(value) == size
    whole = orjson.loads(value)
    assert whole["id"] == event["id"] and "truncated" not in whole["data"]
    blob = whole["data"]["object"]["metadata"]["annotations"]["blob"]
    assert len(blob) > MAIN_LIMIT


# -- Kafka --------------------------------------------------------------------------


async def kafka_topics(bootstrap: str, main: str, dead: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                # Small: the broker refuses "huge".
                NewTopic(main, 1, 1, topic_configs={"max.message.bytes": str(MAIN_LIMIT)}),
                NewTopic(dead, 1, 1),
            ]
        )
    finally:
        await admin.close()


def kafka_config(
    tmp_path: Path, kubeconfig: Path, bootstrap: str, exactly_once: bool, policy: str = "deadLetter"
) -> Path:
    tag = uuid.uuid4().hex[:8]
    kafka: dict[str, Any] = {
        "bootstrapServers": [bootstrap],
        "topic": f"main-{tag}",
        "deadLetterTopic": f"dead-{tag}",
        "maxRequestSize": REQUEST_LIMIT,
    }
    checkpoint: dict[str, Any] = {"kind": "sqlite", "path": str(tmp_path / "state.db")}
    if exactly_once:
        kafka |= {"exactlyOnce": True, "transactionalIdPrefix": f"dl-{tag}"}
        checkpoint = {"kind": "kafka", "kafka": {"topic": f"cp-{tag}"}}
    checkpoint["flushInterval"] = 0.1
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "kafka", "poisonPolicy": policy, "kafka": kafka},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint=checkpoint,
    )


def topics_of(config: Path) -> tuple[str, str]:
    kafka = yaml.safe_load(config.read_text())["sink"]["kafka"]
    return kafka["topic"], kafka["deadLetterTopic"]


async def kafka_streams(
    bootstrap: str, main: str, dead: str
) -> tuple[list[dict[str, Any]], list[tuple[bytes, dict[str, str]]]]:
    """Both topics as a read_committed consumer sees them (the same as read_uncommitted
    without transactions)."""
    events = [
        orjson.loads(r.value or b"")
        for r in await read_topic(bootstrap, main, isolation_level="read_committed")
    ]
    letters = [
        (r.value or b"", {k: v.decode() for k, v in r.headers})
        for r in await read_topic(bootstrap, dead, isolation_level="read_committed")
    ]
    return events, letters


@pytest.mark.parametrize("exactly_once", [False, True], ids=["plain", "exactly-once"])
async def test_kafka_dead_letters_hold_the_refused_events_and_the_topic_their_truncated_copies(
    exactly_once: bool, tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    config = kafka_config(tmp_path, kubeconfig, kafka_broker, exactly_once)
    main, dead = topics_of(config)
    await kafka_topics(kafka_broker, main, dead)
    emulator.create(pod("before"))
    huge = emulator.create(pod("huge", 2 * MAIN_LIMIT))  # refused by the topic
    giant = emulator.create(pod("giant", REQUEST_LIMIT + 10_000))  # refused by the bridge
    emulator.create(pod("after"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        events: list[dict[str, Any]] = []
        letters: list[tuple[bytes, dict[str, str]]] = []

        async def arrived() -> bool:
            nonlocal events, letters
            events, letters = await kafka_streams(kafka_broker, main, dead)
            return len(events) >= 4 and len(letters) >= 2

        await until(
            arrived,
            60,
            lambda: f"{len(events)} events, {len(letters)} dead letters: {bridge.tail_log()}",
        )
        await counted(bridge, {"dead_lettered": 2})
    finally:
        await bridge.stop()
    log = bridge.log.read_text()
    for e in events:
        assert_valid(e)  # truncated copies keep to the published schema
    by_name = {e["subject"]: e for e in events}
    assert sorted(by_name) == ["default/after", "default/before", "default/giant", "default/huge"]
    assert len(events) == 4, [e["id"] for e in events]  # each change once
    for name, obj in (("huge", huge), ("giant", giant)):
        e = by_name[f"default/{name}"]
        assert e["data"]["truncated"] is True and "annotations" not in e["data"]["object"]
        assert e["id"] == f"{obj['metadata']['uid']}:{obj['metadata']['resourceVersion']}"
    # The first list comes in name order: giant before huge.
    assert [h["ce_subject"] for _, h in letters] == ["default/giant", "default/huge"]
    (giant_value, giant_h), (huge_value, huge_h) = letters
    check_letter(huge_value, huge_h, by_name["default/huge"], cut=False)
    assert "message.max.bytes" in huge_h["deadletter_reason"], huge_h
    check_letter(giant_value, giant_h, by_name["default/giant"], cut=True)
    assert "maxRequestSize" in giant_h["deadletter_reason"], giant_h
    assert len(giant_value) <= REQUEST_LIMIT
    lines = [x for x in log.splitlines() if "the bus refused an event for good" in x]
    assert len(lines) == 2 and all("dead_lettered" in x for x in lines), lines


@pytest.mark.parametrize(
    ("policy", "exactly_once"),
    [("deadLetter", True), ("truncate", True), ("deadLetter", False)],
    ids=["deadLetter-exactly-once", "truncate-exactly-once", "deadLetter-plain"],
)
async def test_kafka_poisoned_events_hold_through_kill9(
    policy: str,
    exactly_once: bool,
    tmp_path: Path,
    kubeconfig: Path,
    emulator: Emulator,
    kafka_broker: str,
) -> None:
    """Killed at seeded random moments while refused events keep coming, restarted.
    Exactly-once: every refused change has exactly one truncated copy and (deadLetter)
    one dead letter, as a read_committed consumer sees them (the copy, the dead letter
    and the object's checkpoint row commit together). Plain (the documented bound): at
    least once, never a copy without its dead letter nor a dead letter without its copy
    once the restart settled, a repeat carrying the same ``ce_id``."""
    config = kafka_config(tmp_path, kubeconfig, kafka_broker, exactly_once, policy=policy)
    main, dead = topics_of(config)
    await kafka_topics(kafka_broker, main, dead)
    rng = random.Random(main)
    emulator.create(pod("p", 2 * MAIN_LIMIT))
    last = ""

    async def churn(stop: asyncio.Event) -> None:
        nonlocal last
        n = 0
        while not stop.is_set():
            n += 1
            patch = {"metadata": {"labels": {"n": str(n)}}}
            obj = emulator.patch("v1", "Pod", "p", patch, namespace="default")
            last = f"{obj['metadata']['uid']}:{obj['metadata']['resourceVersion']}"
            await asyncio.sleep(0.01)

    for _ in range(4):
        bridge = BridgeProcess(config)
        await bridge.start()
        await bridge.wait_ready(60)
        stop = asyncio.Event()
        task = asyncio.create_task(churn(stop))
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        kill9(bridge)
        stop.set()
        await task
        assert bridge.proc is not None
        await bridge.proc.wait()
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        events: list[dict[str, Any]] = []
        letters: list[tuple[bytes, dict[str, str]]] = []

        async def settled() -> bool:
            nonlocal events, letters
            events, letters = await kafka_streams(kafka_broker, main, dead)
            return last in {e["id"] for e in events}

        await until(settled, 60, lambda: f"{len(events)} events: {bridge.tail_log()}")
    finally:
        await bridge.stop()
    event_ids = [e["id"] for e in events]
    letter_ids = [h["ce_id"] for _, h in letters]
    assert all(e["data"]["truncated"] is True for e in events)
    if not exactly_once:
        # A dead letter goes before its copy: never a copy without its dead letter.
        assert set(event_ids) <= set(letter_ids) and last in event_ids

        # A dead letter without its copy: killed between the two, and the object
        # changed before the restart, which publishes its later state (to both).
        def rv(event_id: str) -> int:
            return int(event_id.rpartition(":")[2])

        alone = set(letter_ids) - set(event_ids)
        assert all(rv(i) < rv(last) for i in alone), (alone, last)
        assert len(set(event_ids)) > 20, event_ids
        return
    # Each published change once on both, the same changes on both, in order.
    assert len(event_ids) == len(set(event_ids)), sorted(event_ids)
    assert letter_ids == (event_ids if policy == "deadLetter" else [])
    assert all(e["data"]["truncated"] is True for e in events)
    assert len(event_ids) > 20, event_ids


# -- NATS ---------------------------------------------------------------------------


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server whose max_payload is REQUEST_LIMIT (a config file: no flag sets it)."""
    server = NatsServer(tmp_path / "js", port=free_port())
    conf = tmp_path / "nats.conf"
    conf.write_text(f"max_payload: {REQUEST_LIMIT}\n")
    proc = subprocess.Popen(
        [
            *(server.binary, "-js", "-a", "127.0.0.1", "-p", str(server.port)),
            *("-sd", str(server.store_dir), "-c", str(conf)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(server.port, up=True)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def stream_messages(url: str, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await js.get_msg(stream, seq)
            out.append((msg.data or b"", dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


async def test_nats_dead_letters_hold_the_refused_events_and_the_stream_their_truncated_copies(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, small_nats: NatsServer
) -> None:
    url = small_nats.url
    # The main stream stores at most MAIN_LIMIT bytes a message: JetStream refuses
    # "huge"; "giant" is over the server's max_payload: the bridge refuses it.
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name="K8S", subjects=["k8s.>"], max_msg_size=MAIN_LIMIT)
    finally:
        await nc.close()
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={
            "kind": "nats",
            "poisonPolicy": "deadLetter",
            "nats": {"servers": [url], "deadLetterSubject": "deadletters.k8s"},
        },
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
    )
    emulator.create(pod("before"))
    emulator.create(pod("huge", 2 * MAIN_LIMIT))
    emulator.create(pod("giant", REQUEST_LIMIT + 10_000))
    emulator.create(pod("after"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(60)
        events: list[dict[str, Any]] = []
        letters: list[tuple[bytes, dict[str, str]]] = []

        async def arrived() -> bool:
            nonlocal events, letters
            events = [orjson.loads(v) for v, _ in await stream_messages(url, "K8S")]
            try:
                letters = await stream_messages(url, "K8S_DEAD_LETTERS")
            except nats.js.errors.NotFoundError:
                return False
            return len(events) >= 4 and len(letters) >= 2

        await until(
            arrived,
            60,
            lambda: f"{len(events)} events, {len(letters)} dead letters: {bridge.tail_log()}",
        )
        await counted(bridge, {"dead_lettered": 2})
    finally:
        await bridge.stop()
    for e in events:
        assert_valid(e)
    by_name = {e["subject"]: e for e in events}
    assert len(events) == 4 and sorted(by_name) == [
        "default/after",
        "default/before",
        "default/giant",
        "default/huge",
    ]
    assert by_name["default/huge"]["data"]["truncated"] is True
    assert by_name["default/giant"]["data"]["truncated"] is True
    # The first list comes in name order: giant before huge.
    assert [h["ce_subject"] for _, h in letters] == ["default/giant", "default/huge"]
    (giant_value, giant_h), (huge_value, huge_h) = letters
    check_letter(huge_value, huge_h, by_name["default/huge"], cut=False)
    assert "JetStream refused it" in huge_h["deadletter_reason"], huge_h
    assert huge_h["Nats-Msg-Id"] == by_name["default/huge"]["id"] + ":deadletter"
    check_letter(giant_value, giant_h, by_name["default/giant"], cut=True)
    assert "max_payload" in giant_h["deadletter_reason"], giant_h
