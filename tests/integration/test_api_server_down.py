"""A dead API server must not look healthy: a warning, /readyz 503 with the reason, a gauge.

The bridge keeps retrying (the server may come back, and it does here), but
meanwhile it says so: a warning at the first failed attempt and then at most
every 30 s per resource, ``k8s_bridge_watch_up`` 0, and after
``informer.unhealthyAfter`` seconds without a working list/watch, not ready.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.emulator import Emulator
from bridge.logging import configure_logging, reset_logging
from bridge.service.app import BridgeApp
from tests.doubles.memory_sink import MemorySink
from tests.fixtures.waiting import until
from tests.integration.test_app_readiness import Running, pod, running, settings_for, status_is

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

UNHEALTHY_AFTER = 2.0


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """The app's log (JSON lines); the process-wide logging set-up is put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)
    reset_logging()


def lines(out: io.StringIO, event: str) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in parsed if line["event"] == event]


async def watch_up(r: Running) -> float | None:
    _, text = await r.get("/metrics")
    for line in text.splitlines():
        if line.startswith('k8s_bridge_watch_up{resource="v1/pods"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_api_server_gone_warns_turns_not_ready_and_gauge_zero_then_recovers(
    kubeconfig: Path, emulator: Emulator, log_lines: io.StringIO
) -> None:
    emulator.create(pod("a"))
    sink = MemorySink()
    settings = settings_for(
        kubeconfig,
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        informer={"unhealthyAfter": UNHEALTHY_AFTER},
    )
    app = BridgeApp(settings, sink=sink, checkpoints=MemoryCheckpointStore())
    async with running(app) as r:
        await until(lambda: status_is(r, 200), 15, lambda: "never ready")
        await until(lambda: _is(watch_up(r), 1.0), 5, lambda: "watch_up never 1")
        assert lines(log_lines, "list/watch failing") == []

        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        await emulator.stop()
        await until(
            lambda: lines(log_lines, "list/watch failing"), 10, lambda: log_lines.getvalue()
        )
        warning = lines(log_lines, "list/watch failing")[0]
        assert warning["level"] == "warning" and warning["reflector"] == "v1/pods"
        assert warning["failures"] == 1 and warning["error"]

        await until(lambda: status_is(r, 503), 10, lambda: "still ready with the API gone")
        assert loop.time() - stopped_at >= UNHEALTHY_AFTER
        _, body = await r.readyz()
        assert "v1/pods: no working list/watch for" in body, body
        # Readiness says why with the latest failure: the warning has the first, which
        # may differ (a watch the stopping server still accepted, then closed).
        reflector = app.pipelines[0].informer.reflector  # type: ignore[union-attr]
        assert reflector is not None and reflector.last_error
        assert reflector.last_error in body, body
        await until(lambda: _is(watch_up(r), 0.0), 5, lambda: "watch_up never 0")
        # Retries go on (backoff), but the warning is not repeated within 30 s.
        failures = reflector.failures
        assert failures >= 2
        assert len(lines(log_lines, "list/watch failing")) == 1

        emulator.create(pod("while-down"))
        await emulator.start()
        await until(lambda: status_is(r, 200), 40, lambda: "not ready after the API came back")
        await until(lambda: _is(watch_up(r), 1.0), 5, lambda: "watch_up never 1 again")
        await until(lambda: len(sink.events) == 2, 10, lambda: f"events: {sink.events}")
        back = lines(log_lines, "list/watch working again")
        assert len(back) == 1 and back[0]["reflector"] == "v1/pods"
    assert [e.subject for e in sink.events] == ["default/a", "default/while-down"]


async def _is(value: Any, expected: float) -> bool:
    return bool(await value == expected)
