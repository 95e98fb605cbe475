"""``python -m bench restart``: a restart on a SQLite checkpoint of N objects.

The bridge side of a restart, timed in a fresh subprocess per round: open the
SQLite checkpoint (N digests and a watermark, written beforehand by the
store's own ``commit``), ``ResourcePipeline.load`` (digests → the informer's
cache), start the pipeline, and resume the watch from the watermark. The
watch replays ``--replay`` changes made before the crash whose events were
already acknowledged (new resourceVersions, same content: echoes the
fingerprints must recognise), then a BOOKMARK. *Ready*: the pipeline is
synced and every replayed change is processed. Then the pipeline keeps
running ``--settle`` seconds and every event the sink got is counted:
a correct restart publishes none.

The API server is the project's scripted ListerWatcher, not the emulator:
an emulator holding a million Pods would cost the machine ~3 GB and minutes
to fill, and a resumed watch never lists them. The checkpoint file is built
once per N (cached under ``--dir``) and copied for each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._support import BENCHMARKS_MD, cpu_model, tune_as_run, update_benchmarks_md

if TYPE_CHECKING:
    from bridge.checkpoints.base import CheckpointStore
    from bridge.kube.objects import WatchEvent

RESOURCE_ID = "v1/pods"
WATERMARK = 50_000_000


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pod(i: int, rv: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"web-{i:07d}",
            "namespace": f"team-{i % 200:03d}",
            "uid": str(
                uuid.UUID(int=(i * 0x9E3779B97F4A7C15_9E3779B97F4A7C15) % 2**128, version=4)
            ),
            "resourceVersion": str(rv),
            "labels": {"app": "web"},
        },
        "spec": {"nodeName": f"node-{i % 50}", "containers": [{"name": "c", "image": "img:1"}]},
    }


async def _build(store: CheckpointStore, objects: int) -> None:
    """The checkpoint of the first ``objects`` objects, and the watermark."""
    from bridge.delivery.changes import Fingerprinter
    from bridge.ground.digest import Digest
    from bridge.kube.objects import namespace_key

    fp = Fingerprinter()
    await store.open()
    chunk = 50_000
    for first in range(0, objects, chunk):
        digests = []
        for i in range(first, min(objects, first + chunk)):
            obj = _pod(i, 1_000_000 + i)
            m = obj["metadata"]
            digests.append(
                Digest(namespace_key(obj), m["uid"], m["resourceVersion"], fp.fingerprint(obj))
            )
        last = first + chunk >= objects
        await store.commit(RESOURCE_ID, str(WATERMARK) if last else None, digests, ())
    await store.close()


def _store(spec: str) -> CheckpointStore:
    """``sqlite:<path>`` or ``kafka:<bootstrap>/<topic>``."""
    kind, _, where = spec.partition(":")
    if kind == "kafka":
        from bridge.checkpoints.kafka import KafkaCheckpointStore

        bootstrap, _, topic = where.partition("/")
        return KafkaCheckpointStore({"bootstrap_servers": [bootstrap]}, topic)
    from bridge.checkpoints.sqlite import SqliteCheckpointStore

    return SqliteCheckpointStore(where)


async def _round(spec: str, replay: int, settle: float) -> dict[str, float]:
    from bridge.delivery.changes import ChangeDetector, Fingerprinter
    from bridge.delivery.events import EventBuilder
    from bridge.delivery.pipeline import PipelineSettings, ResourcePipeline
    from tests.doubles.memory_sink import MemorySink
    from tests.doubles.scripted import HANG, ScriptedListerWatcher

    lw = ScriptedListerWatcher()
    # Changes made before the crash and already published: echoes of the checkpoint.
    echoes: list[Any] = [
        {"type": "MODIFIED", "object": _pod(i, WATERMARK + 1 + i)} for i in range(replay)
    ]
    bookmark: WatchEvent = {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "metadata": {"resourceVersion": str(WATERMARK + replay + 1)}},
    }
    lw.add_watch([*echoes, bookmark, HANG])
    sink = MemorySink()
    await sink.start()
    rss0 = _rss()

    t0, c0 = time.perf_counter(), time.process_time()
    store = _store(spec)
    await store.open()
    pipeline = ResourcePipeline(
        resource_id=RESOURCE_ID,
        lw=lw,
        detector=ChangeDetector(Fingerprinter()),
        builder=EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods"),
        sink=sink,
        checkpoints=store,
        settings=PipelineSettings(),
    )
    await pipeline.load()
    loaded, loaded_cpu = time.perf_counter() - t0, time.process_time() - c0
    task = asyncio.create_task(pipeline.run())
    informer = pipeline.informer
    assert informer is not None
    while not (
        pipeline.has_synced()
        and lw.delivered >= replay + 1
        and informer.fifo.processed_total >= replay
        and informer.fifo.is_idle()
    ):
        await asyncio.sleep(0.001)
    ready, ready_cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_ready = _rss() - rss0
    await asyncio.sleep(settle)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await store.close()
    return {
        "objects": len(informer.store),
        "load_s": loaded,
        "ready_s": ready,
        "load_cpu_s": loaded_cpu,
        "ready_cpu_s": ready_cpu,
        "published": len(sink.events),
        "suppressed": pipeline.stats.suppressed,
        "rss_mib": rss_ready / 2**20,
    }


def _child(spec: str, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            *("-m", "bench", "restart", "--child", spec),
            *("--replay", str(args.replay), "--settle", str(args.settle)),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def _kafka(stores: list[str]) -> Iterator[str | None]:
    """A broker of the benchmark's own (the test tier's Apache Kafka) if asked for."""
    if "kafka" not in stores:
        yield None
        return
    from tests.fixtures.realkafka import KafkaBroker

    workdir = Path(tempfile.mkdtemp(prefix="k8s-bridge-bench-kafka-"))
    broker = KafkaBroker(workdir)
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench restart", description=__doc__)
    p.add_argument("--objects", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replay", type=int, default=1000)
    p.add_argument("--settle", type=float, default=2.0)
    p.add_argument(
        "--stores",
        nargs="+",
        choices=["sqlite", "kafka"],
        default=["sqlite"],
        help="checkpoint stores, each round in turn; kafka starts a broker (make realdeps)"
        " and prints its time to ready against SQLite's of the same round",
    )
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "k8s-bridge-bench"))
    p.add_argument("--label", default="", help="a name for this code in the printed rows")
    p.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    p.add_argument("--child", metavar="STORE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        tune_as_run()
        result = asyncio.run(_round(args.child, args.replay, args.settle))
        print(json.dumps(result))
        return 0

    os.makedirs(args.dir, exist_ok=True)
    stores = ["sqlite", *(s for s in args.stores if s != "sqlite")]
    rows: list[tuple[int, dict[str, list[dict[str, float]]]]] = []
    status = 0
    with _kafka(stores) as bootstrap:
        for n in args.objects:
            source = Path(args.dir) / f"restart-{n}.db"
            if not source.exists():
                print(f"writing a checkpoint of {n:,} objects to {source} ...", flush=True)
                asyncio.run(_build(_store(f"sqlite:{source}"), n))
            if bootstrap is not None:
                print(f"writing a checkpoint of {n:,} objects to Kafka ...", flush=True)
                asyncio.run(_build(_store(f"kafka:{bootstrap}/restart-{n}"), n))
            results: dict[str, list[dict[str, float]]] = {s: [] for s in stores}
            for _ in range(args.rounds):
                for kind in stores:
                    if kind == "sqlite":
                        work = Path(args.dir) / f"restart-{n}-round.db"
                        for suffix in ("", "-wal", "-shm"):
                            Path(f"{work}{suffix}").unlink(missing_ok=True)
                        shutil.copyfile(source, work)
                        r = _child(f"sqlite:{work}", args)
                    else:
                        spec = f"kafka:{bootstrap}/restart-{n}"
                        r = _child(spec, args)
                        # The round committed the replayed echoes and a newer watermark
                        # into the topic: the next one starts where this one did.
                        asyncio.run(_build(_store(spec), args.replay))
                    results[kind].append(r)
                    status |= r["published"] != 0 or r["objects"] != n
                    ratio = ""
                    if kind != "sqlite":
                        ratio = (
                            f" ({r['ready_s'] / results['sqlite'][-1]['ready_s']:.2f}x SQLite's)"
                        )
                    print(
                        f"{args.label}{n:>9,} objects, {kind:>6}: checkpoint loaded in"
                        f" {r['load_s']:.2f} s, ready in {r['ready_s']:.2f} s{ratio}"
                        f" ({r['ready_cpu_s']:.2f} s CPU), {r['published']} events published"
                        f" ({r['suppressed']} echoes suppressed), RSS +{r['rss_mib']:.0f} MiB",
                        flush=True,
                    )
            rows.append((n, results))
    if args.write:
        _write(args, stores, rows)
    return int(status)


def _write(
    args: argparse.Namespace,
    stores: list[str],
    rows: list[tuple[int, dict[str, list[dict[str, float]]]]],
) -> None:
    command = (
        f"`python -m bench restart --objects {' '.join(map(str, args.objects))}"
        f" --rounds {args.rounds}{' --stores ' + ' '.join(stores) if len(stores) > 1 else ''}"
        " --write` — "
    )
    footer = (
        f"Best of {args.rounds} round(s), each a fresh process with {args.replay:,} replayed"
        f" echoes. Measured {time.strftime('%Y-%m-%d')} on {cpu_model()}, 2 cores,"
        f" Python {platform.python_version()}."
    )
    # SQLite's own section, from its rounds, in either case.
    lines = [
        command + " ".join((__doc__ or "").split("\n\n")[1].split()),
        "",
        "| objects in the checkpoint | checkpoint loaded (s) | ready (s) | events published"
        " | RSS at ready above the start |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, by_store in rows:
        c = _cells(by_store["sqlite"])
        lines.append(f"| {n:,} | {c['loaded']} | {c['ready']} | {c['published']} | {c['rss']} |")
    update_benchmarks_md(BENCHMARKS_MD, "Restart", "\n".join([*lines, "", footer]))
    if len(stores) == 1:
        return
    lines = [
        command + "The same restart (see Restart) from a checkpoint in a compacted Kafka"
        " topic (``checkpoint.kind: kafka``, written beforehand by the store's ``commit`` to"
        " a local Apache Kafka 4 broker), and from SQLite in the same rounds, in turn: SQLite"
        " is the reference. *ready*: the whole topic read to its end, the rows converted"
        " into the informer's cache, the replayed echoes processed.",
        "",
        "| objects | store | checkpoint loaded (s) | ready (s) | CPU to ready (s) | ready against"
        " SQLite's | events published | RSS at ready above the start |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, by_store in rows:
        reference = min(r["ready_s"] for r in by_store["sqlite"])
        for kind in stores:
            c = _cells(by_store[kind], reference)
            lines.append(
                f"| {n:,} | {kind} | {c['loaded']} | {c['ready']} | {c['cpu']}"
                f" | {c['ratio']} | {c['published']} | {c['rss']} |"
            )
    update_benchmarks_md(
        BENCHMARKS_MD, "Restart from a Kafka checkpoint", "\n".join([*lines, "", footer])
    )


def _cells(results: list[dict[str, float]], reference: float = 0.0) -> dict[str, str]:
    """One table row's cells from a store's rounds: the best round's times (the worst
    beside its ready time), the most events any round published, the least RSS."""
    best = min(results, key=lambda r: r["ready_s"])
    worst = max(results, key=lambda r: r["ready_s"])
    return {
        "loaded": f"{best['load_s']:.2f}",
        "ready": f"{best['ready_s']:.2f} (worst {worst['ready_s']:.2f})",
        "cpu": f"{best['ready_cpu_s']:.2f}",
        "ratio": f"{best['ready_s'] / reference:.2f}x" if reference else "",
        "published": f"{max(r['published'] for r in results):.0f}",
        "rss": f"{min(r['rss_mib'] for r in results):,.0f} MiB",
    }
