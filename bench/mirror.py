"""Mirror ingest against the bridge's publish rate and a raw consumer, in one run; mirror memory.

    python -m bench mirror [--events N] [--objects M] [--memory-objects K] [--rounds R]
                           [--buses nats,kafka] [--no-write]

Per bus (nats-server with JetStream on disk, started here; Apache Kafka 4.x
from ``make realdeps``, started here): N Pod MODIFIED events (~2.3 KB of
CloudEvent each) over M objects are

1. published by the bridge's own sink (``NatsSink`` / ``KafkaSink``, batches of
   500 as the pipeline hands over, every event acknowledged by the bus): the
   most the bridge can publish on this machine (the whole bridge, deciding
   and checkpointing as well, publishes less: ``bench e2e``);
2. read back by a raw consumer (the bus client only: an ordered JetStream
   consumer / aiokafka ``getmany``, bytes counted, nothing parsed): the ceiling;
3. read by a ``Mirror`` from its start until ``synced()``: events parsed into
   ``ReceivedEvent``s and applied (the object kept whole).

Memory: K Pods of ~2.3 KB applied to a ``Mirror`` in process (no bus), the
heap measured by tracemalloc after a collection, per mirrored object, with
whole objects and in slim mode (``keep=["spec.nodeName", "status.phase"]``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench._support import cpu_model, free_port, process, update_benchmarks_md
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import Event, EventBuilder
from bridge.mirror import Mirror
from bridge.service.settings import Settings, load_settings
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink

BATCH = 500


def pod(i: int, objects: int, rv: int) -> dict[str, Any]:
    n = i % objects
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{n}",
            "namespace": f"ns-{n % 20}",
            "uid": f"00000000-0000-0000-0000-{n:012d}",
            "resourceVersion": str(rv),
            "labels": {"app": f"app-{n % 50}", "tier": "web", "pod-template-hash": "5d8f7c9b4"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"app-{n % 50}-5d8f7c9b4",
                    "uid": f"rs-{n % 50}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"node-{n % 100}",
            "containers": [
                {
                    "name": "web",
                    "image": "registry.local/app:1.2.3",
                    "env": [{"name": f"E{k}", "value": "v" * 40} for k in range(12)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                }
            ],
            "serviceAccountName": "default",
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.{n % 250}.{n % 200}.{n % 100}",
            "conditions": [{"type": t, "status": "True"} for t in ("Ready", "Initialized")],
        },
    }


def make_events(n: int, objects: int) -> list[Event]:
    detector = ChangeDetector(Fingerprinter([]))
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    out: list[Event] = []
    for i in range(n):
        out += [builder.build(c) for c in detector.on_update(None, pod(i, objects, 1000 + i))]
    return out


def settings_for(sink: dict[str, Any]) -> Settings:
    raw = {
        "cluster": {"kubeconfig": "/dev/null", "name": "bench"},
        "resources": [{"apiVersion": "v1", "kind": "Pod"}],
        "sink": sink,
    }
    return load_settings(None, raw, env={})


async def mirror_rate(settings: Settings, n: int) -> float:
    mirror = Mirror(settings, bootstrap="stream")
    start = time.perf_counter()
    async with mirror:
        await mirror.synced(600)
        elapsed = time.perf_counter() - start
        assert mirror.stats.applied + mirror.stats.stale == n, mirror.stats
    return n / elapsed


async def bench_nats(url: str, events: list[Event], rounds: int) -> dict[str, float]:
    best: dict[str, float] = {"publish": 0.0, "raw": 0.0, "mirror": 0.0}
    n = len(events)
    for _ in range(rounds):
        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            await js.delete_stream("K8S")
        except nats.js.errors.NotFoundError:
            pass
        await nc.close()
        sink = NatsSink([url], stream="K8S", subjects=["k8s.>"])
        await sink.start()
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            await sink.publish(events[i : i + BATCH])
        best["publish"] = max(best["publish"], n / (time.perf_counter() - start))
        await sink.close()

        nc = await nats.connect(url)
        start = time.perf_counter()
        # The mirror's own way of reading (an ephemeral pull consumer, no acks).
        sub = await nc.jetstream().pull_subscribe(
            "k8s.bench.>", durable=None, stream="K8S", config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        )  # fmt: skip
        got = 0
        while got < n:
            got += sum(len(m.data) > 0 for m in await sub.fetch(1000, timeout=5))
        best["raw"] = max(best["raw"], n / (time.perf_counter() - start))
        await sub.unsubscribe()
        await nc.close()
        settings = settings_for({"kind": "nats", "nats": {"servers": [url]}})
        best["mirror"] = max(best["mirror"], await mirror_rate(settings, n))
    return best


async def bench_kafka(bootstrap: str, events: list[Event], rounds: int) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer

    best: dict[str, float] = {"publish": 0.0, "raw": 0.0, "mirror": 0.0}
    n = len(events)
    for _ in range(rounds):
        topic = "bench-mirror-" + uuid.uuid4().hex[:8]
        sink = KafkaSink([bootstrap], topic=topic)
        await sink.start()
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            await sink.publish(events[i : i + BATCH])
        best["publish"] = max(best["publish"], n / (time.perf_counter() - start))
        await sink.close()

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        start = time.perf_counter()
        await consumer.start()
        got = 0
        while got < n:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                got += sum(len(r.value or b"") > 0 for r in records)
        best["raw"] = max(best["raw"], n / (time.perf_counter() - start))
        await consumer.stop()
        settings = settings_for(
            {"kind": "kafka", "kafka": {"bootstrapServers": [bootstrap], "topic": topic}}
        )
        best["mirror"] = max(best["mirror"], await mirror_rate(settings, n))
    return best


def memory_per_object(objects: int, keep: list[str] | None) -> tuple[float, int]:
    """Bytes of heap per mirrored Pod, and the size of one event's JSON."""
    events = make_events(1, 1)
    size = len(events[0].to_json())
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    detector = ChangeDetector(Fingerprinter([]))
    mirror = Mirror(settings_for({"kind": "nats"}), keep=keep)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(objects):
        (change,) = detector.on_add(pod(i, objects, 1000 + i))
        mirror.apply_raw(builder.build(change).to_json())
    gc.collect()
    # The detector's own cache is not the mirror's: measured apart and taken off.
    used = tracemalloc.get_traced_memory()[0] - before
    del mirror
    gc.collect()
    detector_only = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return (used - detector_only) / objects, size


async def run(args: argparse.Namespace) -> str:
    events = make_events(args.events, args.objects)
    size = sum(len(e.to_json()) for e in events) // len(events)
    rows: list[str] = []
    buses = args.buses.split(",")
    if "nats" in buses:
        binary = shutil.which("nats-server")
        assert binary, "nats-server not on PATH"
        port = free_port()
        with (
            tempfile.TemporaryDirectory() as store,
            process([binary, "-js", "-p", str(port), "-sd", store], port),
        ):
            r = await bench_nats(f"nats://127.0.0.1:{port}", events, args.rounds)
        rows.append(row("NATS JetStream (nats-server 2.9.10, file storage)", r))
    if "kafka" in buses:
        from tests.fixtures.realkafka import KafkaBroker

        workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
        broker = KafkaBroker(workdir)
        broker.start()
        try:
            r = await bench_kafka(broker.bootstrap, events, args.rounds)
        finally:
            broker.stop()
            shutil.rmtree(workdir, ignore_errors=True)
        rows.append(row("Apache Kafka 4.4.0 (one node, KRaft)", r))
    whole, one = memory_per_object(args.memory_objects, None)
    slim, _ = memory_per_object(args.memory_objects, ["spec.nodeName", "status.phase"])
    return f"""`python -m bench mirror --events {args.events} --objects {args.objects} \
--memory-objects {args.memory_objects} --rounds {args.rounds}` — {args.events:,} Pod MODIFIED
events (~{size:,} bytes of CloudEvent JSON each, {args.objects:,} objects) on a local bus
started by the benchmark. *publish*: the bridge's own sink (batches of {BATCH}, every event
acknowledged): the most the bridge publishes on this machine. *raw*: the bus client
alone reading them back the mirror's way (NATS: an ephemeral pull consumer, no
acks; Kafka: `getmany`), nothing parsed. *mirror*: `Mirror(bootstrap="stream")` from
its start to `synced()`, every event parsed and applied. events/s, best of
{args.rounds} round(s), all in the same run.

| bus | publish (bridge sink) | raw consumer | mirror ingest | mirror / raw | mirror / publish |
| --- | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

Mirror memory, {args.memory_objects:,} Pods applied in process (each ~{one:,} bytes of
event JSON), tracemalloc heap after a collection, per object:

| mode | bytes per mirrored Pod | {args.memory_objects:,} Pods |
| --- | ---: | ---: |
| whole objects (`keep=None`) | {whole:,.0f} | {whole * args.memory_objects / 2**20:,.0f} MiB |
| slim (`keep=["spec.nodeName", "status.phase"]`, plus name, namespace, uid, resourceVersion, labels) | {slim:,.0f} | {slim * args.memory_objects / 2**20:,.0f} MiB |

Machine: {cpu_model()}, 2 cores shared with other work while measuring.
"""


def row(bus: str, r: dict[str, float]) -> str:
    return (
        f"| {bus} | {r['publish']:,.0f} | {r['raw']:,.0f} | {r['mirror']:,.0f} | "
        f"{r['mirror'] / r['raw']:.2f} | {r['mirror'] / r['publish']:.2f} |"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mirror")
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--memory-objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buses", default="nats,kafka")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    body = asyncio.run(run(args))
    print(body)
    if not args.no_write:
        update_benchmarks_md(Path(__file__).parents[1] / "BENCHMARKS.md", "Mirror", body)
    return 0
