"""Cost per change at steady rates: CPU of the bridge per 1,000 changes, and change → bus latency.

    python -m bench steady [--rates 50 200 1000 5000] [--seconds 5] [--rounds 1]
                           [--tree LABEL=PATH ...] [--no-write]

Apache Kafka (one local broker, the realdeps cache's) and the project's API
emulator (in this process, 2,000 Pods of ~2.8 KB) are started here.
``k8s-bridge run`` (Pods, Kafka sink with its defaults: acks=all, idempotent;
SQLite checkpoint with its defaults: each write-ahead fsynced) runs as its
own process. Once it has published the first list, the Pods are patched (a
label ``rev`` numbering the change) at each rate in turn for ``--seconds``,
scheduled by absolute time. A consumer in this process notes when each
change's event arrives (read_committed is not needed: no transactions). Per
rate: the bridge process's CPU seconds (utime + stime from /proc) per 1,000
changes, from the first patch to the last change's arrival, and the p50/p99
of patch → arrival (an upper bound of the ack: a record is readable once the
broker has it).

The ceiling, measured the same way in the same run: a minimal forwarder
process holding one WATCH, parsing each line with orjson and handing it to
an aiokafka producer (acks=all, idempotent) without waiting for the ack: the
least CPU a forwarder in Python can spend per change, with no checkpoint, no
change detection and no envelope. ``--tree LABEL=PATH`` also runs the bridge
from another source tree, alternating with this one round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench._support import BENCHMARKS_MD, cpu_model, free_port, update_benchmarks_md
from bench.decode import make_pod

SECTION = "Cost per change"
HERE = str(Path(__file__).resolve().parent.parent)
PODS = 2000
# ``--profile DIR``: each measured process sampled by py-spy during the rates.
PROFILE_DIR: Path | None = None
# Shown when a wait times out.
LOGS: list[Path] = []

FORWARDER = r"""
import asyncio, sys, aiohttp, orjson
from aiokafka import AIOKafkaProducer

async def main(url, bootstrap, topic):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True)
    await producer.start()
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/api/v1/pods") as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        print("ready", flush=True)
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
        async with s.get(url + "/api/v1/pods", params=params,
                         timeout=aiohttp.ClientTimeout(total=None)) as r:
            async for line in r.content:
                event = orjson.loads(line)
                if event["type"] == "BOOKMARK":
                    continue
                md = event["object"]["metadata"]
                await producer.send(topic, orjson.dumps(event),
                                    key=md["uid"].encode())

asyncio.run(main(*sys.argv[1:]))
"""


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


@dataclass
class Arrivals:
    """When each change (its ``rev`` label) reached the topic; how many records did."""

    at: dict[int, float] = field(default_factory=dict)
    records: int = 0


def rev_of(value: bytes) -> int | None:
    doc = orjson.loads(value)
    obj = doc.get("data", {}).get("object") if "specversion" in doc else doc.get("object")
    rev = ((obj or {}).get("metadata") or {}).get("labels", {}).get("rev")
    return int(rev) if rev is not None else None


async def create_topic(bootstrap: str, topic: str) -> None:
    # Made first: a consumer subscribed to a missing topic would learn of it only
    # at its next metadata refresh, minutes later.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def consume(bootstrap: str, topic: str, arrivals: Arrivals, started: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    started.set()
    try:
        async for record in consumer:
            now = time.monotonic()
            arrivals.records += 1
            rev = rev_of(record.value) if record.value else None
            if rev is not None:
                arrivals.at.setdefault(rev, now)
    finally:
        await consumer.stop()


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            logs = "".join(p.read_text()[-2000:] for p in LOGS if p.exists())
            raise RuntimeError(f"timed out: {what}\n{logs}")
        await asyncio.sleep(0.05)


@dataclass
class Point:
    rate: int
    changes: int
    achieved: float  # changes per second actually patched
    cpu_per_1000: float
    p50_ms: float
    p99_ms: float


class Driver:
    """Patches the emulator's Pods at a steady rate; numbers every change."""

    def __init__(self, emu: Any, min_changes: int) -> None:
        self.emu = emu
        # CPU time is counted in clock ticks (10 ms): a phase needs enough changes.
        self.min_changes = min_changes
        self.next_rev = 0
        self.sent: dict[int, float] = {}

    async def run(self, rate: int, seconds: float) -> tuple[list[int], float]:
        revs: list[int] = []
        start = time.monotonic()
        step = min(0.005, 1.0 / rate)
        total = max(int(rate * seconds), self.min_changes)
        while len(revs) < total:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            while len(revs) < due:
                rev = self.next_rev
                self.next_rev += 1
                pod = make_pod(rev % PODS)
                md = pod["metadata"]
                self.emu.patch("v1", "Pod", md["name"], {"metadata": {"labels": {"rev": str(rev)}}},
                               md["namespace"])  # fmt: skip
                self.sent[rev] = time.monotonic()
                revs.append(rev)
            await asyncio.sleep(step)
        return revs, total / (time.monotonic() - start)


async def measure_process(
    label: str,
    start_proc: Any,
    driver: Driver,
    bootstrap: str,
    topic: str,
    rates: list[int],
    seconds: float,
    first_list: int,
) -> list[Point]:
    arrivals = Arrivals()
    started = asyncio.Event()
    await create_topic(bootstrap, topic)
    consumer = asyncio.create_task(consume(bootstrap, topic, arrivals, started))
    proc = await start_proc()
    try:
        await started.wait()
        await until(lambda: consumer.done() or arrivals.records >= first_list, 120,
                    f"{label}: the first list on the bus")  # fmt: skip
        if consumer.done():
            consumer.result()  # its error
        await asyncio.sleep(1.5)  # the first sync's trailing work (commits, trims)
        spy = None
        if PROFILE_DIR is not None:
            # py-spy (not a dependency: on PATH when asked for) samples the rates, only
            # while the GIL is held: where the process spends its CPU in Python.
            out = PROFILE_DIR / f"{label.replace(' ', '_')}-{proc.pid}.txt"
            spy = await asyncio.create_subprocess_exec(
                "py-spy", "record", "--gil", "-p", str(proc.pid), "-f", "raw", "-o", str(out), "-r", "200",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        points = []
        for rate in rates:
            user0, sys0 = cpu_split(proc.pid)
            revs, achieved = await driver.run(rate, seconds)
            await until(
                lambda revs=revs: all(r in arrivals.at for r in revs), 120, f"{label} at {rate}/s"
            )
            user1, sys1 = cpu_split(proc.pid)
            cpu = user1 - user0 + sys1 - sys0
            system_share = (sys1 - sys0) / cpu if cpu else 0.0
            lat = sorted((arrivals.at[r] - driver.sent[r]) * 1000 for r in revs)
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            point = Point(rate, len(revs), achieved, cpu / len(revs) * 1000,
                          statistics.median(lat), p99)  # fmt: skip
            print(f"  {label} {rate}/s (patched {achieved:,.0f}/s): {point.cpu_per_1000:.3f} CPU s"
                  f" per 1,000 ({system_share:.0%} in the kernel), p50 {point.p50_ms:.1f} ms,"
                  f" p99 {point.p99_ms:.1f} ms",
                  flush=True)  # fmt: skip
            points.append(point)
            await asyncio.sleep(1.0)
        if spy is not None:
            spy.send_signal(2)
            await spy.wait()
        return points
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer


async def run(args: argparse.Namespace, trees: dict[str, str]) -> dict[str, list[list[Point]]]:
    from bridge.emulator import Emulator
    from bridge.emulator.server import write_kubeconfig
    from tests.fixtures.realkafka import KafkaBroker

    results: dict[str, list[list[Point]]] = {label: [] for label in [*trees, "forwarder"]}
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as tmp:
        workdir = Path(tmp)
        LOGS[:] = [workdir / "forwarder.log"]
        broker = KafkaBroker(workdir / "kafka")
        (workdir / "kafka").mkdir()
        broker.start()
        emu = Emulator(bookmark_interval=5.0)
        for i in range(PODS):
            emu.create(make_pod(i))
        await emu.start()
        driver = Driver(emu, args.min_changes)
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", emu.url)
        try:
            for _ in range(args.rounds):
                for label, tree in trees.items():
                    topic = f"steady-{uuid.uuid4().hex[:8]}"

                    async def bridge(tree: str = tree, topic: str = topic) -> Any:
                        port = free_port()
                        d = workdir / f"bridge-{port}"
                        d.mkdir()
                        config = {
                            "cluster": {"kubeconfig": str(kubeconfig)},
                            "resources": [{"apiVersion": "v1", "kind": "Pod"}],
                            "sink": {"kind": "kafka",
                                     "kafka": {"bootstrapServers": [broker.bootstrap],
                                               "topic": topic}},
                            "checkpoint": {"kind": "sqlite", "path": str(d / "state.db")},
                            "server": {"host": "127.0.0.1", "port": port},
                            "logging": {"format": "json", "level": "warning"},
                        }  # fmt: skip
                        (d / "bridge.yaml").write_text(yaml.safe_dump(config))
                        LOGS.append(d / "bridge.log")
                        with (d / "bridge.log").open("wb") as err:
                            # cwd: ``python -m`` puts the working directory before PYTHONPATH.
                            return await asyncio.create_subprocess_exec(
                                sys.executable, "-m", "bridge.cli", "run", "--config",
                                str(d / "bridge.yaml"), stdout=asyncio.subprocess.DEVNULL,
                                stderr=err, cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                            )  # fmt: skip

                    results[label].append(
                        await measure_process(
                            label,
                            bridge,
                            driver,
                            broker.bootstrap,
                            topic,
                            args.rates,
                            args.seconds,
                            PODS,
                        )
                    )
                topic = f"forward-{uuid.uuid4().hex[:8]}"

                async def forwarder(topic: str = topic) -> Any:
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable, "-c", FORWARDER, emu.url, broker.bootstrap, topic,
                        stdout=asyncio.subprocess.PIPE, stderr=(workdir / "forwarder.log").open("ab"),
                    )  # fmt: skip
                    assert proc.stdout is not None
                    await proc.stdout.readline()
                    return proc

                results["forwarder"].append(
                    await measure_process(
                        "forwarder",
                        forwarder,
                        driver,
                        broker.bootstrap,
                        topic,
                        args.rates,
                        args.seconds,
                        0,
                    )
                )
        finally:
            await emu.stop()
            broker.stop()
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench steady", description=__doc__)
    parser.add_argument("--rates", type=int, nargs="+", default=[50, 200, 1000, 5000])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--min-changes", type=int, default=1000, help="per rate, at least")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of another tree")
    parser.add_argument("--profile", type=Path, help="py-spy samples (raw) into this folder")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    global PROFILE_DIR
    PROFILE_DIR = args.profile
    trees = {"k8s-bridge run": HERE}
    for item in args.tree:
        label, _, path = item.partition("=")
        trees[f"k8s-bridge run ({label})"] = str(Path(path).resolve())
    results = asyncio.run(run(args, trees))
    ceiling = {
        rate: statistics.median(r[i].cpu_per_1000 for r in results["forwarder"])
        for i, rate in enumerate(args.rates)
    }
    rows = []
    for label, runs in results.items():
        for i, rate in enumerate(args.rates):
            points = [r[i] for r in runs]
            cpu = statistics.median(p.cpu_per_1000 for p in points)
            rows.append(
                f"| {label} | {rate:,} | {statistics.median(p.achieved for p in points):,.0f} |"
                f" {cpu:.3f} ({cpu / ceiling[rate]:.2f}) |"
                f" {statistics.median(p.p50_ms for p in points):.1f} |"
                f" {statistics.median(p.p99_ms for p in points):.1f} |"
            )
            print(rows[-1], flush=True)
    body = (
        f"`python -m bench steady --rates {' '.join(map(str, args.rates))} --seconds"
        f" {args.seconds:g} --min-changes {args.min_changes} --rounds {args.rounds}` on {cpu_model()} ({os.cpu_count()} cores,"
        f" shared), Python {platform.python_version()}, Apache Kafka 4.4.0 (one local broker):"
        f" {PODS:,} Pods (~2.8 KB) patched at each steady rate for {args.seconds:g} s"
        f" (at least {args.min_changes:,} changes);"
        " `k8s-bridge run` with the Kafka sink and the SQLite checkpoint, their defaults."
        " CPU: the process's CPU seconds per 1,000 changes, in brackets the ratio to the"
        " minimal forwarder (one WATCH, orjson, aiokafka without awaiting acks: the ceiling,"
        " measured in the same run); latency: patch answered → record readable on the topic."
        " Medians over the rounds.\n\n"
        "| process | changes/s asked | patched/s | CPU s per 1,000 changes (ratio) |"
        " p50 ms | p99 ms |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n"
    )
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
