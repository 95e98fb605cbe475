"""BridgeApp in-process against the emulator over HTTP: what /readyz and /metrics tell a platform.

/readyz is what a Kubernetes readiness probe (and a rollout) sees: 503 with
the reasons until every informer has synced, 503 naming the sink while the
bus refuses events, 200 otherwise. A bus, transactional producers or a
checkpoint store that cannot be reached at start keep it 503 and are retried
until they can. A kind the API server does not serve stops start-up with one
error naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.emulator import Emulator
from bridge.errors import UnknownKindError
from bridge.logging import capture_logs
from bridge.service.app import BridgeApp
from bridge.service.settings import Settings, load_settings
from tests.doubles.memory_sink import MemorySink, MemoryTransactions
from tests.e2e.bridge_process import jetstream_events
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


def settings_for(kubeconfig: Path, **overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "cluster": {"kubeconfig": str(kubeconfig), "name": "it"},
        "resources": [
            {"apiVersion": "v1", "kind": "Pod"},
            {"apiVersion": "example.com/v1", "kind": "Widget"},
        ],
        "sink": {"kind": "stdout"},
        "checkpoint": {"kind": "memory", "commitInterval": 0.05},
        "server": {"host": "127.0.0.1", "port": 0},
    }
    raw.update(overrides)
    return load_settings(None, raw, env={})


def pods_on_a_stopped_nats(
    kubeconfig: Path, emulator: Emulator, nats: NatsServer, **overrides: Any
) -> Settings:
    """Pod "a" to publish to a NATS server that is down when the bridge starts."""
    emulator.create(pod("a"))
    nats.stop()
    return settings_for(
        kubeconfig,
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        sink={"kind": "nats", "nats": {"servers": [nats.url]}},
        **overrides,
    )


class Running:
    """An app running in a task, with its health server's address."""

    def __init__(self, app: BridgeApp) -> None:
        self.app = app
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.app.run(self.stop), name="bridge-app")
        await until(lambda: self._listening(), 10, lambda: "health server did not start")

    def _listening(self) -> bool:
        if self.task is not None and self.task.done():
            self.task.result()  # surface a start-up failure
        health = self.app.health
        return health is not None and health.listening

    async def get(self, path: str) -> tuple[int, str]:
        assert self.app.health is not None
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.app.health.url + path) as r,
        ):
            return r.status, await r.text()

    async def readyz(self) -> tuple[int, str]:
        return await self.get("/readyz")

    async def shutdown(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 15)


@contextlib.asynccontextmanager
async def running(app: BridgeApp) -> AsyncIterator[Running]:
    r = Running(app)
    try:
        await r.start()
        yield r
    finally:
        await r.shutdown()


async def status_is(r: Running, code: int) -> bool:
    return (await r.readyz())[0] == code


async def test_not_ready_until_informers_synced_then_ready(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """Checklist: HasSynced gates readiness. A stalled streaming list keeps the informers unsynced."""
    emulator.create(pod("a"))
    emulator.chaos.stall_watches()
    sink = MemorySink()
    settings = settings_for(kubeconfig, informer={"watchList": "on"})
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    async with running(app) as r:
        await until(lambda: app.pipelines, 10, lambda: "pipelines did not start")

        # Both informers are inside their (stalled) streaming lists: an informer that
        # reported synced before the list ends would by now.
        def watched() -> set[str]:
            return {q.path.rpartition("/")[2] for q in emulator.requests if q.query.get("watch")}

        await until(lambda: watched() >= {"pods", "widgets"}, 10, lambda: "no watch-lists")
        code, body = await r.readyz()
        assert code == 503, body
        assert "v1/pods: not synced" in body and "example.com/v1/widgets: not synced" in body
        assert sink.events == []
        emulator.chaos.resume_watches()
        await until(lambda: status_is(r, 200), 15, lambda: "not ready after resume")
        await until(lambda: len(sink.events) == 1, 5)
    assert [e.subject for e in sink.events] == ["default/a"]


async def test_api_errors_at_start_keep_not_ready_then_ready(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """The first API requests fail with 500: the bridge stays up, not ready, naming the API,
    retries, and becomes ready (a transient control-plane error is no reason to crash-loop)."""
    emulator.create(pod("a"))
    emulator.chaos.fail_next(3, status=500)
    sink = MemorySink()
    app = BridgeApp(settings_for(kubeconfig), sink=sink, checkpoints=MemoryCheckpointStore())
    async with running(app) as r:
        seen: list[tuple[int, str]] = []

        async def names_the_api() -> bool:
            seen.append(await r.readyz())
            return "api: " in seen[-1][1]

        # Until the first request has failed the body names what is still starting
        # (on a busy machine, the sink): the API's line comes once discovery failed.
        await until(names_the_api, 10, lambda: f"the API never named: {seen[-3:]}")
        assert all(code == 503 for code, _ in seen), seen
        await until(lambda: status_is(r, 200), 20, lambda: "never ready")
        await until(lambda: len(sink.events) == 1, 5)
    failed = [q for q in emulator.requests[:3]]
    assert all(q.method == "GET" for q in failed)
    assert [e.subject for e in sink.events] == ["default/a"]


async def test_sink_refusing_events_makes_not_ready_naming_the_sink_then_ready(
    kubeconfig: Path, emulator: Emulator
) -> None:
    sink = MemorySink()
    settings = settings_for(kubeconfig)
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    async with running(app) as r:
        await until(lambda: status_is(r, 200), 15, lambda: "never ready")
        sink.available = False
        emulator.create(pod("while-down"))
        await until(lambda: status_is(r, 503), 10, lambda: "still ready with the sink down")
        _, body = await r.readyz()
        assert "v1/pods: sink unreachable" in body, body
        # Only the pipeline with pending events is paused.
        assert "widgets" not in body, body
        assert sink.events == []
        sink.available = True
        await until(lambda: status_is(r, 200), 15, lambda: "not ready after the sink came back")
        assert [e.subject for e in sink.events] == ["default/while-down"]


async def test_a_bus_that_answers_nothing_shows_as_a_stall_then_recovers(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """A publish that neither lands nor fails (a leader election) is no error the sink
    sees: the oldest unacknowledged event's age grows on /metrics, and past
    health.stallSeconds /readyz says 503 naming the resource, until the bus answers."""
    sink = MemorySink()
    settings = settings_for(kubeconfig, health={"stallSeconds": 1.5})
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    gauge = 'k8s_bridge_oldest_unacked_age_seconds{resource="v1/pods"}'

    async def age(r: Running) -> float:
        _, text = await r.get("/metrics")
        line = next((x for x in text.splitlines() if x.startswith(gauge)), None)
        return float(line.rsplit(" ", 1)[1]) if line else -1.0

    async with running(app) as r:
        await until(lambda: status_is(r, 200), 15, lambda: "never ready")
        sink.hold()
        emulator.create(pod("held"))
        await until(lambda: status_is(r, 503), 10, lambda: "still ready with the bus silent")
        _, body = await r.readyz()
        assert "v1/pods: the bus has not acknowledged an event for" in body, body
        assert "widgets" not in body, body
        # The gauge is carried over once a second (bridge/service/observer.py).
        ages = [await age(r)]

        async def grew() -> bool:
            ages.append(await age(r))
            return ages[-1] >= ages[0] + 1.0

        await until(grew, 5, lambda: f"the age did not grow while held: {ages}")
        assert ages[-1] >= 1.5, ages
        sink.release()
        await until(lambda: status_is(r, 200), 15, lambda: "not ready after the bus answered")

        async def zero() -> bool:
            return await age(r) == 0.0

        await until(zero, 5, lambda: "the age did not return to 0")
        assert [e.subject for e in sink.events] == ["default/held"]


async def test_metrics_show_published_events_and_cache_objects(
    kubeconfig: Path, emulator: Emulator
) -> None:
    for name in ("a", "b", "c"):
        emulator.create(pod(name))
    sink = MemorySink()
    app = BridgeApp(settings_for(kubeconfig), sink=sink, checkpoints=MemoryCheckpointStore())
    async with running(app) as r:
        await until(lambda: status_is(r, 200), 15)
        emulator.delete("v1", "Pod", "c", namespace="default")
        await until(lambda: len(sink.events) == 4, 10)

        async def flushed() -> bool:
            _, text = await r.get("/metrics")
            return 'k8s_bridge_cache_objects{resource="v1/pods"} 2.0' in text

        await until(flushed, 5, lambda: "cache_objects never reached 2")
        code, text = await r.get("/metrics")
    assert code == 200
    assert 'k8s_bridge_events_published_total{resource="v1/pods",type="added"} 3.0' in text
    assert 'k8s_bridge_events_published_total{resource="v1/pods",type="deleted"} 1.0' in text
    assert "k8s_bridge_ready 1.0" in text
    assert "k8s_bridge_leader" in text


async def test_unknown_kind_at_start_raises_naming_the_kind(
    kubeconfig: Path, emulator: Emulator
) -> None:
    settings = settings_for(
        kubeconfig,
        resources=[
            {"apiVersion": "v1", "kind": "Pod"},
            {"apiVersion": "example.com/v1", "kind": "Gizmo"},
        ],
    )
    sink = MemorySink()
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    with pytest.raises(UnknownKindError, match="Gizmo") as info:
        await asyncio.wait_for(app.run(asyncio.Event()), 10)
    assert "example.com/v1" in str(info.value)
    assert app.pipelines == [] and sink.events == []


async def test_a_bus_that_goes_away_while_nothing_is_published_turns_readiness_503(
    kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """No events flow, so no publish fails: the periodic probe notices, and recovers."""
    settings = settings_for(
        kubeconfig, sink={"kind": "nats", "nats": {"servers": [nats_control.url]}}
    )
    app = BridgeApp(settings, checkpoints=MemoryCheckpointStore())
    app.sink_probe_interval = 0.2
    async with running(app) as r:
        await until(lambda: status_is(r, 200), 15)
        nats_control.stop()
        await until(lambda: status_is(r, 503), 5)
        _, text = await r.readyz()
        assert "sink nats: does not answer a ping" in text
        nats_control.start()
        await until(lambda: status_is(r, 200), 15)


async def test_the_app_leaves_the_process_alone_and_calls_its_after_sync_step_once(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """Process tuning is ``k8s-bridge run``'s (bridge/service/tuning.py): an app built
    anywhere else runs on the interpreter's settings, and only calls the after-sync
    step it is given, once the first sync's events have landed."""
    emulator.create(pod("a"))
    switch, threshold = sys.getswitchinterval(), gc.get_threshold()
    sink = MemorySink()
    calls: list[tuple[int, float, tuple[int, int, int], int]] = []
    called = asyncio.Event()

    def after_first_sync() -> None:
        calls.append(
            (len(sink.events), sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count())
        )
        called.set()

    app = BridgeApp(
        settings_for(kubeconfig),
        sink=sink,
        checkpoints=MemoryCheckpointStore(),
        after_first_sync=after_first_sync,
    )
    async with running(app):
        await asyncio.wait_for(called.wait(), 15)
    assert calls == [(1, switch, threshold, 0)]
    assert (sys.getswitchinterval(), gc.get_threshold()) == (switch, threshold)


def warned(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == event and line["log_level"] == "warning"]


async def test_a_bus_unreachable_at_start_is_retried_not_ready_until_it_answers(
    kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """A bus still starting when the bridge does (both rolled out together) is no
    reason to crash-loop: not ready naming the sink, a warning per attempt, and
    the first sync published once the bus answers."""
    settings = pods_on_a_stopped_nats(kubeconfig, emulator, nats_control)
    app = BridgeApp(settings, checkpoints=MemoryCheckpointStore())
    with capture_logs() as logs:
        async with running(app) as r:
            code, body = await r.readyz()
            assert code == 503 and "sink nats: not connected" in body, body
            await until(
                lambda: len(warned(logs, "sink unreachable; retrying")) >= 2, 15, lambda: f"{logs}"
            )
            assert (await r.readyz())[0] == 503
            nats_control.start()
            await until(lambda: status_is(r, 200), 20, lambda: "not ready after the bus came up")
            events = await jetstream_events(nats_control.url)
    assert [e["subject"] for e in events] == ["default/a"]
    first = warned(logs, "sink unreachable; retrying")[0]
    assert first["sink"] == "nats" and nats_control.url in first["error"], first


async def test_transactional_producers_that_cannot_start_are_retried_not_ready(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """Exactly-once: the producers (which fence a previous holder) must start before
    any pipeline reads its checkpoint; while they cannot, the bridge is not ready,
    naming the sink, and retries until they do."""
    emulator.create(pod("a"))
    sink = MemorySink()
    sink.transactions = transactions = MemoryTransactions(sink)
    transactions.available = False
    settings = settings_for(kubeconfig, resources=[{"apiVersion": "v1", "kind": "Pod"}])
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    with capture_logs() as logs:
        async with running(app) as r:
            await until(lambda: transactions.attempts >= 2, 15, lambda: f"{logs}")
            code, body = await r.readyz()
            assert code == 503, body
            assert "sink stdout: memory transactions are unavailable" in body, body
            assert sink.events == []
            transactions.available = True
            await until(lambda: status_is(r, 200), 20, lambda: "not ready after they started")
            await until(lambda: len(sink.events) == 1, 5)
    assert transactions.started == [["core/v1/pods"]]
    assert [e.subject for e in sink.events] == ["default/a"]
    assert warned(logs, "cannot start the transactional producers; retrying")


async def test_a_checkpoint_store_unreachable_at_start_is_retried_not_ready(
    kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    """Without leader election, a store on a server (the NATS KV bucket) that cannot
    be reached yet is waited for, not ready naming the store, with one warning for
    one reason however many attempts it takes."""
    settings = pods_on_a_stopped_nats(
        kubeconfig, emulator, nats_control, checkpoint={"kind": "nats-kv", "commitInterval": 0.05}
    )
    app = BridgeApp(settings)
    attempts = 0
    open_store = app.checkpoints.open

    async def counted_open() -> None:
        nonlocal attempts
        attempts += 1
        await open_store()

    app.checkpoints.open = counted_open  # type: ignore[method-assign]
    with capture_logs() as logs:
        async with running(app) as r:
            await until(lambda: attempts >= 3, 20, lambda: f"{logs}")
            code, body = await r.readyz()
            assert code == 503 and "checkpoint nats-kv: " in body, body
            nats_control.start()
            await until(lambda: status_is(r, 200), 20, lambda: "not ready after the store came up")
            events = await jetstream_events(nats_control.url)
    assert [e["subject"] for e in events] == ["default/a"]
    warnings = [line for line in logs if "checkpoint store cannot be opened yet" in line["event"]]
    assert len(warnings) == 1, warnings
    # Not "leading, but ...": there is no leader election to lead in.
    assert warnings[0]["event"] == "the checkpoint store cannot be opened yet; retrying"


async def test_the_sinks_batching_settings_reach_every_pipeline(
    kubeconfig: Path, emulator: Emulator
) -> None:
    """``sink.linger``, ``sink.steadyLinger`` and ``sink.maxBatch`` are what each
    resource's writer waits and takes (bridge/delivery/publisher.py)."""
    settings = settings_for(
        kubeconfig, sink={"kind": "stdout", "linger": 0.002, "steadyLinger": 0.1, "maxBatch": 7}
    )
    app = BridgeApp(settings, sink=MemorySink(), checkpoints=MemoryCheckpointStore())
    async with running(app):
        await until(lambda: len(app.pipelines) == 2, 10, lambda: "pipelines did not start")
        got = {
            (p.settings.linger, p.settings.steady_linger, p.settings.max_batch)
            for p in app.pipelines
        }
    assert got == {(0.002, 0.1, 7)}
