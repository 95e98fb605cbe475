"""Trace context (``tracing.otlpEndpoint``): ``k8s-bridge run`` against the emulator and a
real nats-server, exporting to an OTLP/HTTP receiver of the test's own.

The oracle: the receiver decodes each export with OpenTelemetry's own protobuf
classes (opentelemetry-proto), and an independent nats-py reader takes the events
and their headers off JetStream. Every event carries the CloudEvents
distributed-tracing extension, and its ``traceparent`` names a span the bridge
exported: one per published batch, with the batch's count and what the bus
acknowledged. Off, nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bridge.emulator import Emulator
from tests.doubles.contract import assert_valid
from tests.e2e.bridge_process import BridgeProcess, until, write_config
from tests.fixtures.nats import NatsServer, free_port
from tests.real.kafkabus import read_topic

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


class Receiver:
    """An OTLP/HTTP traces endpoint: keeps every span exported to it, with its resource."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.url = ""

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for rs in export.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans.extend((resource, span) for span in ss.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", r.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    r.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield r
    finally:
        await runner.cleanup()


async def stream(url: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("K8S")
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await js.get_msg("K8S", seq)
            out.append((orjson.loads(msg.data or b"{}"), dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.int_value if v.HasField("int_value") else v.string_value
    return out


async def test_every_event_carries_the_trace_of_the_batch_span_the_bridge_exported(
    tmp_path: Path,
    kubeconfig: Path,
    emulator: Emulator,
    nats_control: NatsServer,
    receiver: Receiver,
) -> None:
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        tracing={"otlpEndpoint": receiver.url, "serviceName": "bridge-under-test"},
    )
    for i in range(3):
        emulator.create(pod(f"listed-{i}"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(30)
        got: list[tuple[dict[str, Any], dict[str, str]]] = []

        def arrived(n: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                nonlocal got
                got = await stream(nats_control.url)
                return len(got) >= n

            return check

        # The listed pods on the bus first: the live ones cannot share their batch.
        await until(arrived(3), 30, lambda: f"{len(got)} events: {bridge.tail_log()}")
        for i in range(2):
            emulator.create(pod(f"live-{i}"))
        await until(arrived(5), 30, lambda: f"{len(got)} events: {bridge.tail_log()}")
    finally:
        assert await bridge.stop() == 0  # SIGTERM: the spans still queued are exported
    assert len(got) == 5
    spans = {
        (span.trace_id.hex(), span.span_id.hex()): (resource, span)
        for resource, span in receiver.spans
    }
    per_span: dict[tuple[str, str], int] = {}
    for event, headers in got:
        assert_valid(event)
        traceparent = event["traceparent"]
        assert headers["traceparent"] == traceparent, headers
        version, trace_id, span_id, flags = traceparent.split("-")
        # Sampled (bit 0); level 2 of W3C Trace Context adds "random trace id" (bit 1).
        assert version == "00" and int(flags, 16) & 1, traceparent
        assert (trace_id, span_id) in spans, (traceparent, list(spans))
        per_span[(trace_id, span_id)] = per_span.get((trace_id, span_id), 0) + 1
    for key, count in per_span.items():
        resource, span = spans[key]
        assert resource["service.name"] == "bridge-under-test"
        assert span.name == "publish v1/pods"
        assert span.kind == span.SPAN_KIND_PRODUCER
        assert attributes(span) == {
            "messaging.system": "nats",
            "messaging.operation.type": "send",
            "messaging.batch.message_count": count,
            "k8s_bridge.resource": "v1/pods",
            "k8s_bridge.acknowledged": count,
            "k8s_bridge.refused": 0,
        }
        assert span.end_time_unix_nano > span.start_time_unix_nano
    # The listed pods and each live one left in batches of their own.
    assert len(per_span) >= 2, per_span


async def test_kafka_records_carry_the_trace_of_an_exported_batch_span(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, kafka_broker: str, receiver: Receiver
) -> None:
    topic = "traced-" + uuid.uuid4().hex[:8]
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "kafka", "kafka": {"bootstrapServers": [kafka_broker], "topic": topic}},
        resources=[{"apiVersion": "v1", "kind": "Pod"}],
        tracing={"otlpEndpoint": receiver.url},
    )
    for i in range(3):
        emulator.create(pod(f"p-{i}"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready(30)
        records: list[Any] = []

        async def arrived() -> bool:
            nonlocal records
            records = await read_topic(kafka_broker, topic)
            return len(records) >= 3

        await until(arrived, 30, lambda: f"{len(records)} records: {bridge.tail_log()}")
    finally:
        assert await bridge.stop() == 0
    spans = {(s.trace_id.hex(), s.span_id.hex()): s for _, s in receiver.spans}
    for r in records:
        event = orjson.loads(r.value)
        assert_valid(event)
        headers = {k: v.decode() for k, v in r.headers}
        assert headers["ce_traceparent"] == event["traceparent"], headers
        _, trace_id, span_id, _ = event["traceparent"].split("-")
        span = spans[(trace_id, span_id)]
        assert attributes(span)["messaging.system"] == "kafka"
        assert attributes(span)["k8s_bridge.acknowledged"] >= 1


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """Off by default: the app and a pipeline's publisher are built, no tracer, no import."""
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=tmp_path / "kubeconfig",
        sink={"kind": "nats", "nats": {"servers": ["nats://127.0.0.1:4222"]}},
    )
    script = (
        "import sys\n"
        "from bridge.cli import main\n"
        "from bridge.service.app import BridgeApp\n"
        "from bridge.service.settings import load_settings\n"
        f"app = BridgeApp(load_settings({str(config)!r}))\n"
        "assert app.tracer is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
