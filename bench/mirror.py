"""Mirror ingest against the bridge's own publish rate and a raw consumer, in one run;
mirror memory per object.

    python -m bench mirror [--objects M] [--memory-objects K] [--rounds R]
                           [--buses nats,kafka] [--no-write]

Per bus (nats-server with JetStream on disk; Apache Kafka 4.x from ``make
realdeps``; both started here), each round:

1. the bridge publishes: bench/e2e.py's ``run_e2e`` (the API emulator over
   HTTP with M Pods, a ``ResourcePipeline`` with its SQLite checkpoint and
   the real sink) from its first list to the last ack, then a burst of one
   update per Pod to the last ack: the bridge's own publish rate, events/s;
2. a raw consumer reads the 2M events back (the bus client only, the
   mirror's way: an ephemeral JetStream pull consumer / aiokafka
   ``getmany``, nothing parsed): the ceiling;
3. a ``Mirror`` reads them from its start until ``synced()``: every event
   parsed into a ``ReceivedEvent`` and applied (objects kept whole).

Memory: K Pods applied to a ``Mirror`` in process (no bus), the heap measured
by tracemalloc after a collection, per mirrored object, with whole objects
and in slim mode (``keep=["spec.nodeName", "status.phase"]``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import shutil
import tempfile
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import orjson
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench._support import cpu_model, free_port, process, tune_as_run, update_benchmarks_md
from bench.decode import make_pod
from bench.e2e import load_pods, run_e2e
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.pipeline import PipelineSettings
from bridge.emulator import Emulator
from bridge.mirroring.mirror import Mirror
from bridge.service.settings import Settings, load_settings
from bridge.service.tuning import Tuning
from bridge.sinks.base import Sink
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink


def settings_for(sink: dict[str, Any]) -> Settings:
    raw = {
        "cluster": {"kubeconfig": "/dev/null", "name": "bench"},
        "resources": [{"apiVersion": "v1", "kind": "Pod"}],
        "sink": sink,
    }
    return load_settings(None, raw, env={})


async def mirror_rate(settings: Settings, n: int, as_json: bool = False) -> float:
    mirror = Mirror(settings, bootstrap="stream", as_json=as_json)
    start = time.perf_counter()
    async with mirror:
        await mirror.synced(600)
        elapsed = time.perf_counter() - start
        assert mirror.stats.applied + mirror.stats.stale == n, mirror.stats
    return n / elapsed


async def bridge_rate(sink: Sink, ctx: E2e, round_: int, tuning: Tuning) -> tuple[float, float]:
    """The bridge's own publish rate: a ``ResourcePipeline`` (emulator over HTTP, SQLite
    checkpoint, this sink) from its first list to the last ack, then a burst of one
    update per Pod to the last ack (bench/e2e.py's run): events/s of each."""
    n = len(ctx.pods)
    listed, burst, _ = await run_e2e(
        ctx.emu, ctx.kubeconfig, ctx.pods, sink, round_, PipelineSettings(), 300.0, tuning
    )
    assert burst is not None
    return n / listed.acked, n / burst.acked


@dataclass
class E2e:
    emu: Emulator
    kubeconfig: Path
    pods: list[dict[str, Any]]


async def bench_nats(url: str, ctx: E2e, rounds: int, tuning: Tuning) -> dict[str, float]:
    best = dict.fromkeys(("list", "burst", "raw", "mirror", "json"), 0.0)
    n = 2 * len(ctx.pods)  # the first list's adds and the burst's updates
    for r in range(rounds):
        nc = await nats.connect(url)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream("K8S")
        await nc.close()
        listed, burst = await bridge_rate(NatsSink([url]), ctx, r + 1, tuning)
        best["list"], best["burst"] = max(best["list"], listed), max(best["burst"], burst)

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
        best["json"] = max(best["json"], await mirror_rate(settings, n, as_json=True))
    return best


async def bench_kafka(bootstrap: str, ctx: E2e, rounds: int, tuning: Tuning) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer

    best = dict.fromkeys(("list", "burst", "raw", "mirror", "json"), 0.0)
    n = 2 * len(ctx.pods)
    for r in range(rounds):
        topic = "bench-mirror-" + uuid.uuid4().hex[:8]
        listed, burst = await bridge_rate(KafkaSink([bootstrap], topic=topic), ctx, r + 1, tuning)
        best["list"], best["burst"] = max(best["list"], listed), max(best["burst"], burst)

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
        best["json"] = max(best["json"], await mirror_rate(settings, n, as_json=True))
    return best


def memory_per_object(
    objects: int, keep: list[str] | None, as_json: bool = False
) -> tuple[float, int]:
    """Bytes of heap per mirrored Pod (bench/decode.py's ~2.8 KB Pod, as the e2e
    benchmark's), and the size of one event's JSON."""
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    detector = ChangeDetector(Fingerprinter([]))

    def event(i: int) -> bytes:
        (change,) = detector.on_add(make_pod(i))
        return builder.build(change).to_json()

    size = len(event(0))
    mirror = Mirror(settings_for({"kind": "nats"}), keep=keep, as_json=as_json)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(objects):
        mirror.apply_raw(event(i))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    del mirror
    gc.collect()
    # What is left is the detector's own cache, not the mirror's: taken off.
    others = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return (used - others) / objects, size


async def run(args: argparse.Namespace, tuning: Tuning) -> str:
    rows: list[str] = []
    buses = args.buses.split(",")
    async with Emulator(bookmark_interval=1.0) as emu:
        pods = load_pods(emu, args.objects)
        gc.collect()
        gc.freeze()  # the emulator's objects are not the bridge's or the mirror's heap
        with tempfile.TemporaryDirectory(prefix="bench-mirror-") as tmp:
            ctx = E2e(emu, emu.write_kubeconfig(Path(tmp) / "kubeconfig"), pods)
            size = len(orjson.dumps(emu.list("v1", "Pod")[0]))
            if "nats" in buses:
                binary = shutil.which("nats-server")
                assert binary, "nats-server not on PATH"
                port = free_port()
                store = Path(tmp) / "nats"
                with process([binary, "-js", "-p", str(port), "-sd", str(store)], port):
                    r = await bench_nats(f"nats://127.0.0.1:{port}", ctx, args.rounds, tuning)
                rows.append(row("NATS JetStream (nats-server 2.9.10, file storage)", r))
            if "kafka" in buses:
                from tests.fixtures.realkafka import KafkaBroker

                broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="bench-kafka-", dir=tmp)))
                broker.start()
                try:
                    r = await bench_kafka(broker.bootstrap, ctx, args.rounds, tuning)
                finally:
                    broker.stop()
                rows.append(row("Apache Kafka 4.4.0 (one node, KRaft)", r))
    whole, one = memory_per_object(args.memory_objects, None)
    slim, _ = memory_per_object(args.memory_objects, ["spec.nodeName", "status.phase"])
    packed, _ = memory_per_object(args.memory_objects, None, as_json=True)
    return f"""`python -m bench mirror --objects {args.objects} --memory-objects \
{args.memory_objects} --rounds {args.rounds}` — in each round the bridge's own pipeline
(bench/e2e.py's: the API emulator over HTTP, the SQLite checkpoint, the real sink) publishes
{args.objects:,} Pods (~{size:,} bytes each) by its first list, then a burst of one update per
Pod, to a local bus started by the benchmark; *bridge*: its events/s to the last ack of each.
Then the {2 * args.objects:,} events on the bus are read by *raw*, the bus client alone the
mirror's way (NATS: an ephemeral pull consumer, no acks; Kafka: `getmany`), nothing parsed,
and by *mirror*, `Mirror(bootstrap="stream")` from its start to `synced()`, every event
parsed and applied. events/s, best of {args.rounds} round(s), all in the same run, the
process tuned as `k8s-bridge run` tunes itself: `{tuning}`.

| bus | bridge, first list | bridge, burst | raw consumer | mirror ingest | mirror / raw | mirror / bridge (the faster phase) | mirror ingest, `as_json=True` | its / bridge |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

Mirror memory, {args.memory_objects:,} Pods applied in process (each ~{one:,} bytes of
event JSON), tracemalloc heap after a collection, per object:

| mode | bytes per mirrored Pod | {args.memory_objects:,} Pods |
| --- | ---: | ---: |
| whole objects (`keep=None`) | {whole:,.0f} | {whole * args.memory_objects / 2**20:,.0f} MiB |
| whole objects as JSON (`as_json=True`: decoded by each `get`/`list`) | {packed:,.0f} | {packed * args.memory_objects / 2**20:,.0f} MiB |
| slim (`keep=["spec.nodeName", "status.phase"]`, plus name, namespace, uid, resourceVersion, labels) | {slim:,.0f} | {slim * args.memory_objects / 2**20:,.0f} MiB |

Machine: {cpu_model()}, 2 cores shared with other work while measuring.
"""


def row(bus: str, r: dict[str, float]) -> str:
    bridge = max(r["list"], r["burst"])
    return (
        f"| {bus} | {r['list']:,.0f} | {r['burst']:,.0f} | {r['raw']:,.0f} | "
        f"{r['mirror']:,.0f} | {r['mirror'] / r['raw']:.2f} | {r['mirror'] / bridge:.2f} | "
        f"{r['json']:,.0f} | {r['json'] / bridge:.2f} |"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mirror")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--memory-objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buses", default="nats,kafka")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    # As ``k8s-bridge run`` tunes itself (GC young threshold 50,000, ...); a service
    # holding a large mirror gains the same (BENCH_TUNING_OFF=all measures without).
    tuning = tune_as_run()
    body = asyncio.run(run(args, tuning))
    print(body)
    if not args.no_write:
        update_benchmarks_md(Path(__file__).parents[1] / "BENCHMARKS.md", "Mirror", body)
    return 0
