"""``python -m bench inprocess``: the CPU a burst costs the bridge itself, with no sockets.

The end-to-end benchmark (``bench e2e``) runs the emulator, the bridge and the
bus client in one process beside a bus on the other core, and its rates swing
by a third between runs on a shared 2-core machine. This one measures what
the bridge's own code costs per event, steadily enough to compare two
versions of it:

- a real ``ResourcePipeline``: reflector → FIFO → informer (slim cache) →
  change detection → sealed CloudEvents → outbox (write-ahead rows, commits)
  → a sink that takes every batch at once, and the memory checkpoint store;
- its ListerWatcher serves N pods by LIST, then each burst as N MODIFIED watch
  lines (one label changed per pod, the emulator's encoding, ~2.8 KB each),
  decoded by the bridge's own lazy decoder (bridge/kube/rawjson.py) as they
  are read;
- the figure is the event loop thread's CPU time (``time.thread_time``) from a
  burst's start until its last event is acknowledged, per event; best and
  median of ``--bursts``;
- beside it, in the same run, the minimal reader's CPU for the same lines:
  ``orjson.loads`` each line and ``orjson.dumps`` its object (what ``bench e2e``'s
  ceiling does besides its socket I/O).

The process is tuned as ``k8s-bridge run`` tunes it (bridge/service/tuning.py),
its after-sync step run after the initial list; ``$BENCH_TUNING_OFF`` leaves
settings out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, cast

import orjson

from bench._support import BENCHMARKS_MD, cpu_model, tune_as_run, update_benchmarks_md
from bench.decode import make_pod
from bench.slowbus import DelayedAckSink
from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.pipeline import PipelineSettings, ResourcePipeline
from bridge.kube.objects import WatchEvent
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.reflector import ReflectorSettings
from bridge.service.tuning import Tuning
from bridge.service.wiring import object_decoder
from tests.doubles.scripted import ScriptedListerWatcher, list_response

SECTION = "In process"


class _LineServer(ScriptedListerWatcher):
    """Watch scripts are raw watch lines, decoded one at a time as they are read
    (as bridge/kube/client.py does), with a turn of the loop every 64 lines (a
    socket read's worth)."""

    def __init__(self, decoder: ObjectDecoder) -> None:
        super().__init__()
        self._decode = decoder.watch_event

    def add_lines(self, lines: list[bytes]) -> None:
        # Lines, not events: ``_play`` decodes them as they are read.
        self.add_watch(cast(list[Any], lines))

    async def _play(self, steps: Iterable[Any]) -> AsyncIterator[WatchEvent]:
        decode = self._decode
        for i, line in enumerate(steps):
            if i % 64 == 0:
                await asyncio.sleep(0)
            yield decode(line)


def _bursts(pods: list[dict[str, Any]], rounds: int, first_rv: int) -> list[list[bytes]]:
    rv = first_rv
    out = []
    for r in range(rounds):
        lines = []
        for pod in pods:
            rv += 1
            meta = pod["metadata"]
            meta["labels"] = {**meta.get("labels", {}), "bench-round": str(r)}
            meta["resourceVersion"] = str(rv)
            lines.append(orjson.dumps({"type": "MODIFIED", "object": pod}))
        out.append(lines)
    return out


def _reader_cpu(lines: list[bytes]) -> float:
    """The minimal reader's CPU per line: parse it whole, encode its object."""
    loads, dumps = orjson.loads, orjson.dumps
    gc.disable()
    try:
        start = time.thread_time()
        for line in lines:
            dumps(loads(line)["object"])
        return (time.thread_time() - start) / len(lines)
    finally:
        gc.enable()


async def measure(n: int, bursts: int, tuning: Tuning) -> tuple[list[float], list[float], int]:
    """CPU µs per event of each burst through the bridge, and of the minimal reader."""
    fingerprinter = Fingerprinter([])
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    decoder = object_decoder(fingerprinter, builder, None)
    assert decoder is not None
    pods = [make_pod(i) for i in range(n)]
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(1000 + i)
    lw = _LineServer(decoder)
    listed = [decoder.object(orjson.dumps(p)) for p in pods]
    lw.add_list(list_response(listed, 1000 + n))
    del listed
    scripts = _bursts(pods, bursts, 1000 + n)
    size = sum(map(len, scripts[0][:100])) // 100
    sink = DelayedAckSink(0.0)  # a bus that takes every batch at once
    pipeline = ResourcePipeline(
        resource_id="v1/pods",
        lw=lw,
        detector=ChangeDetector(fingerprinter),
        builder=builder,
        sink=sink,
        checkpoints=MemoryCheckpointStore(),
        settings=PipelineSettings(reflector=ReflectorSettings(watch_list="off")),
    )
    task = asyncio.create_task(pipeline.run())
    bridge: list[float] = []
    reader: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while sink.published < n:
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise TimeoutError("the initial list was not published in time")
            await asyncio.sleep(0.001)
        tuning.after_first_sync()  # as `k8s-bridge run` does once every resource synced
        for lines in scripts:
            # The scripts are the benchmark's heap, not the bridge's.
            gc.collect()
            gc.freeze()
            reader.append(_reader_cpu(lines) * 1e6)
            base = sink.published
            start = time.thread_time()
            lw.add_lines(lines)
            while sink.published < base + n:
                if task.done():
                    task.result()
                await asyncio.sleep(0.0005)
            bridge.append((time.thread_time() - start) * 1e6 / n)
            await asyncio.sleep(0.05)  # the commit after the burst, outside the figure
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    return bridge, reader, size


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench inprocess", description=__doc__)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--bursts", type=int, default=8)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--output", default=str(BENCHMARKS_MD))
    args = p.parse_args(argv)
    tuning = tune_as_run()
    bridge, reader, size = asyncio.run(measure(args.objects, args.bursts, tuning))
    best, median = min(bridge), statistics.median(bridge)
    r_best, r_median = min(reader), statistics.median(reader)
    print(f"{args.objects:,} pods, {args.bursts} bursts of MODIFIED lines of ~{size:,} bytes")
    print(
        f"  bridge         µs/event best {best:6.2f}  median {median:6.2f}  each {', '.join(f'{v:.1f}' for v in bridge)}"
    )
    print(f"  minimal reader µs/event best {r_best:6.2f}  median {r_median:6.2f}")
    print(f"  bridge / reader (medians) {median / r_median:.2f}")
    if not args.no_write:
        body = "\n".join(
            [
                f"`python -m bench inprocess --objects {args.objects} --bursts {args.bursts}`"
                f" — the event loop thread's CPU per event of a burst of {args.objects:,}"
                f" MODIFIED pod lines (~{size:,} bytes) through the bridge's own path, no"
                " sockets: reflector, FIFO, informer (slim cache), change detection, sealed"
                " CloudEvents, outbox with write-ahead rows and commits (memory checkpoint"
                " store), a sink that takes every batch at once. The minimal reader parses"
                " each line whole and encodes its object, in the same run.",
                "",
                "| path | µs per event, best | median | of the reader (medians) |",
                "| --- | ---: | ---: | ---: |",
                f"| bridge | {best:.1f} | {median:.1f} | {median / r_median:.2f} |",
                f"| minimal reader (`orjson.loads` + `orjson.dumps`) | {r_best:.1f}"
                f" | {r_median:.1f} | 1.00 |",
                "",
                f"Measured {time.strftime('%Y-%m-%d')} on {cpu_model()}, 2 shared cores,"
                f" Python {platform.python_version()}.",
            ]
        )
        update_benchmarks_md(Path(args.output), SECTION, body)
        print(f"  wrote section {SECTION!r} of {args.output}")
    return 0
