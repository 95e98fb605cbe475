"""A filter end to end: ``k8s-bridge run`` as a process, the emulator over HTTP, a real
nats-server, and a kill -9 in between.

Only pods in phase Failed reach the bus; one that recovers leaves with a
``filtered`` event; a restart after changes made while the bridge was dead
publishes exactly what changed in view, and ``check`` rejects a filter that
does not compile in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import (
    BridgeProcess,
    cli,
    jetstream_events,
    kill9,
    probe,
    published_once,
    without,
    write_config,
)
from tests.e2e.test_run_nats import pod, watermark
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FAILED = "object.status.phase == 'Failed'"


def phase(emulator: Emulator, name: str, value: str) -> dict[str, Any]:
    return emulator.patch("v1", "Pod", name, {"status": {"phase": value}}, namespace="default")


def failed(name: str) -> dict[str, Any]:
    """A pod in view from the start."""
    return {**pod(name), "status": {"phase": "Failed"}}


def config_with(tmp_path: Path, kubeconfig: Path, nats: NatsServer, expression: str) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod", "filter": expression}],
    )


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"].rsplit(".", 1)[1], e["subject"]) for e in events]


async def test_only_failed_pods_reach_the_bus_and_a_restart_is_exact(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("ok"))
    emulator.create(pod("bad"))
    phase(emulator, "bad", "Failed")
    config = config_with(tmp_path, kubeconfig, nats_control, FAILED)
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await until(lambda: _count(nats_control, 1), 20, bridge.tail_log)
        phase(emulator, "ok", "Failed")  # enters
        recovered = phase(emulator, "bad", "Running")  # leaves
        await until(lambda: _count(nats_control, 3), 20, bridge.tail_log)
        # Killed once the checkpoint took the filtered event in. (Killed before, the
        # key stays written ahead, consumers may still hold it, and its later delete
        # is published: at least once, never lost.)
        rv = int(recovered["metadata"]["resourceVersion"])
        await until(lambda: watermark(tmp_path / "state.db") >= rv, 20, bridge.tail_log)
    finally:
        kill9(bridge)
        assert bridge.proc is not None
        await bridge.proc.wait()
    events = await jetstream_events(nats_control.url)
    assert summary(events) == [
        ("added", "default/bad"),
        ("added", "default/ok"),
        ("filtered", "default/bad"),
    ]
    uid, rv = recovered["metadata"]["uid"], recovered["metadata"]["resourceVersion"]
    assert events[2]["id"] == events[2]["_msg_id"] == f"{uid}:filtered:{rv}"
    assert events[2]["data"]["object"]["status"]["phase"] == "Running"

    # While the bridge is dead: an out-of-view pod is deleted, one in view too,
    # and a new failed pod appears.
    emulator.delete("v1", "Pod", "bad", namespace="default")
    emulator.delete("v1", "Pod", "ok", namespace="default")
    emulator.create(pod("new"))
    phase(emulator, "new", "Failed")
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        await until(lambda: _count(nats_control, 5), 20, bridge.tail_log)
        # Anything extra (the out-of-view delete, a republish) would come before it.
        await probe(emulator, nats_control.url, failed("probe"), message=bridge.tail_log)
        assert await published_once(bridge, 3) == 3
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    events = without(await jetstream_events(nats_control.url), "probe")
    # Across objects there is no order (a relist announces adds before deletes).
    assert sorted(summary(events)[3:]) == [("added", "default/new"), ("deleted", "default/ok")]


async def _count(nats: NatsServer, n: int) -> bool:
    return len(await jetstream_events(nats.url)) >= n


async def test_check_and_config_validate_reject_a_filter_that_does_not_compile(
    tmp_path: Path, kubeconfig: Path, nats_control: NatsServer
) -> None:
    config = config_with(tmp_path, kubeconfig, nats_control, "object.status.phase = 'Failed'")
    for command in ("check", "run"):
        code, out, err = await cli(command, "--config", str(config))
        assert code == 2, (command, out, err)
        assert err.strip().splitlines() == [
            "config error: resources[0].filter: \"object.status.phase = 'Failed'\" does not "
            "compile: line 1, column 21: Syntax error: token recognition error at: '= '"
        ], (command, err)


async def test_replay_applies_the_filter_as_the_running_bridge_did(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    emulator.create(pod("a"))
    config = config_with(tmp_path, kubeconfig, nats_control, FAILED)
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        mid = emulator.resource_version
        phase(emulator, "a", "Failed")  # enters
        emulator.create(pod("b"))  # never in view
        emulator.delete("v1", "Pod", "b", namespace="default")
        phase(emulator, "a", "Running")  # leaves
        emulator.delete("v1", "Pod", "a", namespace="default")  # out of view: nothing
        await until(lambda: _count(nats_control, 2), 20, bridge.tail_log)
        await probe(emulator, nats_control.url, failed("probe"), message=bridge.tail_log)
    finally:
        assert await bridge.stop() == 0, bridge.tail_log()
    live = await jetstream_events(nats_control.url)
    assert summary(live) == [
        ("added", "default/a"),
        ("filtered", "default/a"),
        ("added", "default/probe"),
    ]
    rc, _, err = await cli(
        "replay", "--config", str(config), "--resource", "Pod", "--from-resource-version", str(mid)
    )
    assert rc == 0, err
    replayed = (await jetstream_events(nats_control.url))[len(live) :]
    assert [e["id"] for e in replayed] == [e["id"] for e in live]
