"""kill -9 at random moments, change and compact while down, restart: the promise holds.

The property (delivery-core issue, point 3) is checked by tests/e2e/crash_world.py
against what the test did to the API emulator and what the bus holds after many
rounds: every delete of an object that reached the bus is published; every
live object's current state is its last event; nothing else is published.

The kill moments, the changes and the compactions are random; the seed is in
every failure message (``CRASH_SEED=… pytest …`` replays a run).
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import jetstream_events, kafka_sink, write_config
from tests.e2e.crash_world import (
    Target,
    check_property,
    crash_rounds,
    kafka_events,
    nats_kv_settled,
    seed,
    sqlite_settled,
)
from tests.fixtures.nats import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def emulated(emulator: Emulator) -> Target:
    def compact() -> str:
        emulator.chaos.compact()
        return "compacted"

    return Target(emulator, "default", compact, settled_rv=lambda: emulator.resource_version)


def CHECKPOINT(tmp_path: Path) -> dict[str, Any]:
    # The default cadence: a second of acknowledged events not yet committed as certain.
    return {"kind": "sqlite", "path": str(tmp_path / "state.db"), "flushInterval": 1.0}


async def test_kill9_at_random_moments_against_jetstream(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    s = seed()
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint=CHECKPOINT(tmp_path),
    )
    world = await crash_rounds(
        emulated(emulator),
        config,
        random.Random(s),
        8,
        sqlite_settled(tmp_path / "state.db"),
        seed=s,
    )
    events = await jetstream_events(nats_control.url)
    ids = [e["id"] for e in events]
    # The duplicate window drops every redelivery: ids are stable across crashes.
    assert len(ids) == len(set(ids)), f"an id reached the stream twice (CRASH_SEED={s})"
    check_property(world, events, s, "jetstream")


async def test_kill9_at_random_moments_with_checkpoints_in_nats_kv(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """The same property with the checkpoint in a JetStream KV bucket (no disk)."""
    s = seed()
    bucket = "crash-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint={"kind": "nats-kv", "bucket": bucket, "flushInterval": 1.0},
    )
    world = await crash_rounds(
        emulated(emulator),
        config,
        random.Random(s),
        6,
        nats_kv_settled(nats_control.url, bucket),
        seed=s,
    )
    events = await jetstream_events(nats_control.url)
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), f"an id reached the stream twice (CRASH_SEED={s})"
    check_property(world, events, s, "jetstream+nats-kv")


async def test_kill9_at_random_moments_against_kafka(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str
) -> None:
    s = seed()
    topic = "crash-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink=kafka_sink(kafka_broker, topic),
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        checkpoint=CHECKPOINT(tmp_path),
    )
    world = await crash_rounds(
        emulated(emulator),
        config,
        random.Random(s),
        5,
        sqlite_settled(tmp_path / "state.db"),
        seed=s,
    )
    events = await kafka_events(kafka_broker, topic)
    check_property(world, events, s, "kafka")
