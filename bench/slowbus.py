"""``python -m bench slowbus``: a first list of N Pods into a bus slowed on purpose.

Does memory stay flat while the bus is slower than the list? The emulator runs
in its own process (as in ``bench listmem``) holding N Pods of ~2.8 KB. Each
row is a fresh subprocess running a whole ``ResourcePipeline`` (emulator over
HTTP → slim informer → change detection → CloudEvents → sink, SQLite
checkpoint with its write-ahead rows) until every object's event is
acknowledged and checkpointed. The sink drops the events and acknowledges
each batch after ``delay`` seconds: *normal* has no delay; *slow* waits
``--delay`` per batch, so the bus, not the bridge, sets the pace. Reported:
peak RSS above the baseline after imports (``VmHWM``); the steady RSS, once
everything is acknowledged and checkpointed and the heap is frozen and its
free pages handed back, as the app does after its first sync; the most events
ever decided but unacknowledged (bounded by ``max_pending``, two batches) and queued in the
FIFO (bounded by ``max_queued``); and events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench._support import BENCHMARKS_MD, cpu_model, tune_as_run, update_benchmarks_md
from bench.listmem import MODE_NAMES, _reset_peak, _serve_emulator, _status_kb

SECTION = "Slow bus"


class DelayedAckSink:
    """A bus that takes ``delay`` seconds to acknowledge each batch, and keeps nothing."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.published = 0

    async def start(self) -> None:
        pass

    async def publish(self, events: Sequence[Any]) -> Mapping[int, str]:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.published += len(events)
        return {}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        pass


# The parent's --sync-write-ahead, handed to each child (checkpoint.syncWriteAhead).
SYNC_ENV = "BENCH_SYNC_WRITE_AHEAD"


def _child(kubeconfig: str, mode: str, n: int, delay: float, pace: float | None) -> None:
    import gc

    from bridge.checkpoints.sqlite import SqliteCheckpointStore
    from bridge.delivery.changes import ChangeDetector, Fingerprinter
    from bridge.delivery.events import EventBuilder
    from bridge.delivery.pipeline import PipelineSettings, ResourcePipeline
    from bridge.kube.client import KubeClient
    from bridge.kube.discovery import ResourceInfo
    from bridge.kube.listwatch import ListWatch
    from bridge.kube.reflector import ReflectorSettings
    from bridge.logging import configure_logging
    from bridge.service.wiring import object_decoder

    configure_logging("json", "warning")
    tuning = tune_as_run()
    gc.collect()
    _reset_peak()
    baseline = _status_kb("VmHWM")
    pods = ResourceInfo("", "v1", "Pod", "pods", True, ("list", "watch"))

    async def run() -> dict[str, Any]:
        client = await KubeClient.from_kubeconfig(kubeconfig)
        sink = DelayedAckSink(delay)
        with tempfile.TemporaryDirectory(prefix="bench-slowbus-") as tmp:
            store = SqliteCheckpointStore(
                Path(tmp) / "checkpoints.db",
                sync_write_ahead=os.environ.get(SYNC_ENV, "on") == "on",
            )
            await store.open()
            reflector = ReflectorSettings(watch_list="off" if mode == "list" else "on")
            if pace is not None:
                reflector = replace(reflector, list_pace_seconds=pace)
            settings = PipelineSettings(reflector=reflector)
            fingerprinter = Fingerprinter()
            builder = EventBuilder(
                cluster="bench", group="", version="v1", kind="Pod", plural="pods"
            )
            pipeline = ResourcePipeline(
                resource_id="v1/pods",
                # Decoded as the app does: spec and status stay the server's bytes.
                lw=ListWatch(client, pods, decoder=object_decoder(fingerprinter, builder, None)),
                detector=ChangeDetector(fingerprinter),
                builder=builder,
                sink=sink,
                checkpoints=store,
                settings=settings,
            )
            t0 = time.perf_counter()
            task = asyncio.create_task(pipeline.run())
            max_pending = max_queued = 0
            while not (sink.published >= n and pipeline.committed_resource_version):
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
                max_pending = max(max_pending, pipeline.outbox.unacknowledged)
                if pipeline.informer is not None:
                    max_queued = max(max_queued, len(pipeline.informer.fifo))
            elapsed = time.perf_counter() - t0
            peak = _status_kb("VmHWM")
            # What `k8s-bridge run` does once the first sync has landed: the heap
            # frozen, free C-heap pages handed back. What stays is the steady state.
            tuning.after_first_sync()
            steady = _status_kb("VmRSS")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()
        await client.close()
        return {
            "published": sink.published,
            "seconds": elapsed,
            "peak_kb": peak,
            "steady_kb": steady,
            "max_pending": max_pending,
            "max_queued": max_queued,
            "settings_max_pending": settings.pending_limit,
            "settings_max_queued": settings.max_queued,
        }

    result = asyncio.run(run())
    result["baseline_kb"] = baseline
    print(json.dumps(result), flush=True)


def _measure(
    kubeconfig: str, mode: str, n: int, delay: float, pace: float | None
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.slowbus", "--child", kubeconfig, mode, str(n), str(delay)]
    cmd.append("" if pace is None else str(pace))
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["published"] < n:
        raise RuntimeError(f"{mode}: published {result['published']} events, expected {n}")
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench slowbus", description=__doc__)
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--delay", type=float, default=0.1, help="seconds per batch on the slow bus")
    p.add_argument("--modes", nargs="+", choices=sorted(MODE_NAMES), default=["list", "stream"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--sync-write-ahead",
        choices=("on", "off"),
        default="on",
        help="the SQLite checkpoint's checkpoint.syncWriteAhead (on: as run by default)",
    )
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--list-pace",
        type=float,
        help="seconds a LIST waits for room in the FIFO before reading the rest ahead as"
        " bytes (0: read ahead at once); default: the setting's default",
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kubeconfig, mode, n, delay, pace = args.child
        _child(kubeconfig, mode, int(n), float(delay), float(pace) if pace else None)
        return 0
    os.environ[SYNC_ENV] = args.sync_write_ahead

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    emulator = ctx.Process(target=_serve_emulator, args=(args.objects, ready), daemon=True)
    emulator.start()
    rows: list[tuple[str, str, float, dict[str, Any]]] = []
    try:
        url, size = ready.get(timeout=1800)
        print(f"{args.objects:,} Pods of ~{size} bytes in the emulator at {url}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-slowbus-") as tmp:
            from bridge.emulator import write_kubeconfig

            kubeconfig = str(write_kubeconfig(Path(tmp) / "kubeconfig", url))
            for mode in args.modes:
                for bus, delay in (("normal", 0.0), ("slow", args.delay)):
                    best: dict[str, Any] | None = None
                    for _ in range(args.rounds):
                        r = _measure(kubeconfig, mode, args.objects, delay, args.list_pace)
                        if best is None or r["peak_kb"] < best["peak_kb"]:
                            best = r
                    assert best is not None
                    rows.append((mode, bus, delay, best))
                    peak = (best["peak_kb"] - best["baseline_kb"]) * 1024
                    steady = (best["steady_kb"] - best["baseline_kb"]) * 1024
                    print(
                        f"  {MODE_NAMES[mode]:38s} {bus:6s} bus: peak RSS +{peak / 2**20:,.0f} MiB"
                        f" ({peak / args.objects:,.0f} B per object),"
                        f" steady +{steady / 2**20:,.0f} MiB ({steady / args.objects:,.0f} B),"
                        f" {args.objects / best['seconds']:,.0f} events/s,"
                        f" at most {best['max_pending']:,} unacknowledged"
                        f" / {best['max_queued']:,} queued",
                        flush=True,
                    )
    finally:
        emulator.kill()
    if not args.no_write:
        lines = [
            f"`python -m bench slowbus --objects {args.objects} --delay {args.delay}"
            f" --rounds {args.rounds}` — " + " ".join((__doc__ or "").split("\n\n")[1].split()),
            "",
            "| list mode | bus | peak RSS above baseline | per object | steady RSS above baseline"
            " | per object | events/s"
            " | most unacknowledged (max_pending) | most queued in the FIFO (max_queued) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for mode, _bus, delay, r in rows:
            peak = (r["peak_kb"] - r["baseline_kb"]) * 1024
            steady = (r["steady_kb"] - r["baseline_kb"]) * 1024
            what = (
                "normal (acks at once)" if not delay else f"slow ({delay * 1000:.0f} ms per batch)"
            )
            lines.append(
                f"| {MODE_NAMES[mode]} | {what} | {peak / 2**20:,.0f} MiB"
                f" | {peak / args.objects:,.0f} B | {steady / 2**20:,.0f} MiB"
                f" | {steady / args.objects:,.0f} B | {args.objects / r['seconds']:,.0f}"
                f" | {r['max_pending']:,} ({r['settings_max_pending']:,})"
                f" | {r['max_queued']:,} ({r['settings_max_queued']:,}) |"
            )
        lines += [
            "",
            f"Best of {args.rounds} round(s) (lowest peak). Measured {time.strftime('%Y-%m-%d')} on {cpu_model()},"
            f" 2 cores, Python {platform.python_version()}.",
        ]
        update_benchmarks_md(BENCHMARKS_MD, SECTION, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
