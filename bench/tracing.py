"""``python -m bench tracing``: what trace context costs on the publish path, on and off.

Realistic ~3 KB pods (bench/decode.py's), built and sealed as the pipeline does,
then handed to a sink in batches of 500 (``sink.maxBatch``'s default) that reads
each record as the Kafka sink does (the JSON and the headers) and keeps nothing.
Off, the batch goes as it is (the ceiling: the publisher holds no tracer). On, the
publisher's traced path: one OpenTelemetry span per batch (the bridge's
``OtelTracer``, its batch processor exporting over OTLP/HTTP to a local receiver
in a thread), its ``traceparent`` spliced into every event and set for the
headers. Events/s, best of 3 rounds. Writes the "Trace context" section of
BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod
from bridge.delivery.changes import Change, ChangeKind
from bridge.delivery.events import EventBuilder
from bridge.delivery.tracing import traced
from bridge.ground.envelope import Event

SECTION = "Trace context"
BATCH = 500


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _consume(events: Sequence[Event]) -> int:
    """What a sink reads of each record (the Kafka sink: value and headers)."""
    n = 0
    for e in events:
        n += len(e.to_json()) + len(e.headers)
    return n


def _rate(run: Callable[[], None], events: int, rounds: int = 3) -> float:
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = max(best, events / (time.perf_counter() - start))
    return best


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench tracing")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    from bridge.service.settings import TracingSettings
    from bridge.service.tracing import OtelTracer

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    tracer = OtelTracer(TracingSettings(otlp_endpoint=endpoint), "kafka")
    builder = EventBuilder(cluster="c", group="", version="v1", kind="Pod", plural="pods")
    pods = [make_pod(i) for i in range(args.events)]
    events = [builder.build(Change(ChangeKind.MODIFIED, p, "k"), sealed=True) for p in pods]
    batches = [events[i : i + BATCH] for i in range(0, len(events), BATCH)]
    size = sum(len(e.encoded) for e in events) // len(events)

    def off() -> None:
        for batch in batches:
            _consume(batch)

    def on() -> None:
        for batch in batches:
            span = tracer.batch("v1/pods", len(batch))
            _consume(traced(batch, span.traceparent, span.tracestate))
            span.acknowledged(len(batch), 0)
            span.end()

    def build_off() -> None:
        for i in range(0, len(pods), BATCH):
            _consume(
                [
                    builder.build(Change(ChangeKind.MODIFIED, p, "k"), sealed=True)
                    for p in pods[i : i + BATCH]
                ]
            )

    def build_on() -> None:
        for i in range(0, len(pods), BATCH):
            batch = [
                builder.build(Change(ChangeKind.MODIFIED, p, "k"), sealed=True)
                for p in pods[i : i + BATCH]
            ]
            span = tracer.batch("v1/pods", len(batch))
            _consume(traced(batch, span.traceparent, span.tracestate))
            span.acknowledged(len(batch), 0)
            span.end()

    results = [
        ("publish path, tracing off (ceiling)", _rate(off, len(events))),
        ("publish path, tracing on", _rate(on, len(events))),
        ("build + seal + publish path, tracing off (ceiling)", _rate(build_off, len(events))),
        ("build + seal + publish path, tracing on", _rate(build_on, len(events))),
    ]
    tracer.shutdown()
    server.shutdown()
    lines = [
        f"`python -m bench tracing` — {len(events):,} pod events of {size:,} bytes (JSON),"
        f" batches of {BATCH}, one span per batch exported over OTLP/HTTP to a local"
        f" receiver; {date.today()}, Python {platform.python_version()}, {cpu_model()}.",
        "",
        "| path | events/s | vs its ceiling |",
        "| --- | ---: | ---: |",
    ]
    for n, (label, rate) in enumerate(results):
        ceiling = results[n - n % 2][1]
        lines.append(f"| {label} | {rate:,.0f} | {rate / ceiling:.2f} |")
    lines += [
        "",
        "On, each event's JSON is copied once (the trace attributes spliced in front) and"
        " gets two headers; the span itself is one per batch. Off, the publisher holds no"
        " tracer and nothing of OpenTelemetry is imported.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
