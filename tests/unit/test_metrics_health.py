"""Metrics registry per instance, the health server over a real socket, structured logs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.ground.prometheus import Registry
from bridge.logging import configure_logging, get_logger, reset_logging
from bridge.service.health import HealthServer
from bridge.service.metrics import MemoryLimitCollector, Metrics, cgroup_memory_limit
from tests.fixtures.metrics import sample_value

FAMILIES = {
    "k8s_bridge_events_published",
    "k8s_bridge_changes_suppressed",
    "k8s_bridge_publish_latency_seconds",
    "k8s_bridge_watch_restarts",
    "k8s_bridge_relists",
    "k8s_bridge_checkpoint_resource_version",
    "k8s_bridge_checkpoint_lag_seconds",
    "k8s_bridge_cache_objects",
    "k8s_bridge_sink_in_flight",
    "k8s_bridge_ready",
    "k8s_bridge_leader",
}


class Readiness:
    def __init__(self) -> None:
        self.ready = False
        self.reasons = ["v1/pods: not synced", "sink: nats unreachable"]

    def __call__(self) -> tuple[bool, list[str]]:
        return self.ready, [] if self.ready else list(self.reasons)


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status, await resp.text(), resp.headers.get("Content-Type", "")


def test_two_instances_do_not_share_counters() -> None:
    a, b = Metrics(Registry()), Metrics(Registry())
    a.events_published.labels(resource="v1/pods", type="added").inc(3)
    assert (
        sample_value(
            a.registry,
            "k8s_bridge_events_published_total",
            {"resource": "v1/pods", "type": "added"},
        )
        == 3
    )
    assert (
        sample_value(
            b.registry,
            "k8s_bridge_events_published_total",
            {"resource": "v1/pods", "type": "added"},
        )
        is None
    )


def test_checkpoint_gauge_takes_numeric_rv_only() -> None:
    metrics = Metrics(Registry())
    metrics.set_checkpoint("v1/pods", "4711")
    metrics.set_checkpoint("v1/pods", "not-a-number")  # opaque RVs leave it as it was
    assert (
        sample_value(
            metrics.registry, "k8s_bridge_checkpoint_resource_version", {"resource": "v1/pods"}
        )
        == 4711
    )


async def test_readyz_flips_with_the_readiness_callable() -> None:
    readiness = Readiness()
    async with HealthServer("127.0.0.1", 0, Registry(), readiness) as server:
        assert server.port > 0
        async with aiohttp.ClientSession() as session:
            status, body, _ = await get(session, f"{server.url}/readyz")
            assert status == 503
            assert body.splitlines() == ["v1/pods: not synced", "sink: nats unreachable"]
            assert (await get(session, f"{server.url}/healthz"))[0] == 200

            readiness.ready = True
            status, body, _ = await get(session, f"{server.url}/readyz")
            assert (status, body.strip()) == (200, "ok")

            readiness.ready, readiness.reasons = False, ["leader: lost the lease"]
            status, body, _ = await get(session, f"{server.url}/readyz")
            assert (status, body.strip()) == (503, "leader: lost the lease")


async def test_readyz_reports_a_crashing_check_as_not_ready() -> None:
    def broken() -> tuple[bool, list[str]]:
        raise RuntimeError("boom")

    async with HealthServer("127.0.0.1", 0, Registry(), broken) as server:
        async with aiohttp.ClientSession() as session:
            status, body, _ = await get(session, f"{server.url}/readyz")
    assert status == 503 and "boom" in body


async def test_metrics_endpoint_exposes_every_family() -> None:
    registry = Registry()
    metrics = Metrics(registry)
    metrics.events_published.labels(resource="v1/pods", type="modified").inc()
    metrics.publish_latency.labels(sink="kafka").observe(0.02)
    metrics.ready.set(1)
    async with HealthServer("127.0.0.1", 0, registry, lambda: (True, [])) as server:
        async with aiohttp.ClientSession() as session:
            status, body, content_type = await get(session, f"{server.url}/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert FAMILIES <= set(families)
    published = [
        s for s in families["k8s_bridge_events_published"].samples if s.name.endswith("_total")
    ]
    assert [(s.labels, s.value) for s in published] == [
        ({"resource": "v1/pods", "type": "modified"}, 1.0)
    ]
    assert families["k8s_bridge_ready"].samples[0].value == 1.0


async def test_a_scrape_carries_the_pipelines_counters_first() -> None:
    """What the bus acknowledged a moment ago is in the very next scrape, not a second later."""
    registry = Registry()
    metrics = Metrics(registry)
    acked = {"n": 0, "carried": 0}

    def carry() -> None:
        delta = acked["n"] - acked["carried"]
        metrics.events_published.labels(resource="v1/pods", type="added").inc(delta)
        acked["carried"] = acked["n"]

    server = HealthServer("127.0.0.1", 0, registry, lambda: (True, []), before_scrape=carry)
    async with server, aiohttp.ClientSession() as session:
        acked["n"] = 3
        _, body, _ = await get(session, f"{server.url}/metrics")
    assert 'k8s_bridge_events_published_total{resource="v1/pods",type="added"} 3.0' in body


async def test_stop_releases_the_port() -> None:
    server = HealthServer("127.0.0.1", 0, Registry(), lambda: (True, []))
    await server.start()
    port = server.port
    await server.stop()
    again = HealthServer("127.0.0.1", port, Registry(), lambda: (True, []))
    await again.start()  # the port is free again
    await again.stop()
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await get(session, f"http://127.0.0.1:{port}/healthz")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back for the next tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    reset_logging()


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_redact_credentials() -> None:
    out = io.StringIO()  # not a TTY: auto means JSON
    configure_logging("auto", "info", stream=out)
    log = get_logger("bridge.test")
    log.info("connecting", token="abc", sasl_password="p", tls={"authorization": "Bearer x"}, n=1)
    log.debug("hidden below info")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 1
    line = lines[0]
    assert line["event"] == "connecting" and line["logger"] == "bridge.test"
    assert line["level"] == "info" and line["n"] == 1
    assert line["token"] == line["sasl_password"] == "[redacted]"
    assert line["tls"] == {"authorization": "[redacted]"}
    assert "abc" not in out.getvalue() and "Bearer" not in out.getvalue()


@pytest.mark.usefixtures("restore_logging")
def test_stdlib_loggers_share_the_output() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    logging.getLogger("aiokafka").warning("broker %s down", "k1")
    line = json.loads(out.getvalue().splitlines()[-1])
    assert line["event"] == "broker k1 down" and line["logger"] == "aiokafka"


@pytest.mark.usefixtures("restore_logging")
def test_console_format_is_not_json() -> None:
    out = io.StringIO()
    configure_logging("console", "debug", stream=out)
    get_logger("bridge.test").debug("visible", secret="s3")
    text = out.getvalue()
    assert "visible" in text and "s3" not in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "536870912\n"}, 536870912),  # cgroup v2, limited
        ({"memory.max": "max\n"}, None),  # cgroup v2, none
        ({"memory.limit_in_bytes": "268435456\n"}, 268435456),  # cgroup v1, limited
        ({"memory.limit_in_bytes": "9223372036854771712\n"}, None),  # cgroup v1, none
        ({}, None),  # no cgroup files at all
    ],
)
def test_the_memory_limit_is_the_cgroups_and_absent_without_one(
    files: dict[str, str], limit: int | None, tmp_path: Path
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = (tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes")
    assert cgroup_memory_limit(paths) == limit
    registry = Registry()
    registry.register(MemoryLimitCollector("k8s_bridge_memory_limit_bytes", paths))
    assert sample_value(registry, "k8s_bridge_memory_limit_bytes") == limit
    # Declared either way, so a query naming it finds the family.
    assert "# TYPE k8s_bridge_memory_limit_bytes gauge" in registry.exposition().decode()
