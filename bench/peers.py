"""The bridge against a peer: the OpenTelemetry Collector's k8sobjects receiver to Kafka.

Both programs run on the same real kube-apiserver (+ etcd) and Apache Kafka
broker (the test fixtures' servers), each in its own process, one at a time,
in alternating order round after round, each on a fresh topic:

- **first list**: ``--pods`` Pods (bench.decode's, ~2.6 KB stored) exist; the
  program starts and publishes one event per Pod. Peak RSS (VmHWM) and CPU
  (utime + stime) when the last Pod reached the topic.
- **steady churn**: Pods patched at ``--rate`` per second for ``--seconds``;
  change → sink latency (the patch's send time to the consumer's receipt) and
  CPU per 1,000 events.
- **backlog**: the program is stopped (SIGSTOP) while ``--backlog`` changes are
  made, then continued: events per second until the last change is published.
- **410**: stopped again, its watch cut by a kube-apiserver restart, changes
  made to distinct Pods, then etcd compacted and kube-apiserver restarted once
  more (its watch cache starts afresh, so the program's resourceVersion is
  expired): how many of those changes reach the topic.
- **restart**: the program is stopped (SIGTERM) and started again on its own
  state; every event published then is a copy.
- **idle**: a fresh process watching Pods with a label selector that matches
  nothing: its RSS after ``IDLE_SECONDS``.

Each change sets the Pod's label ``bench-chg`` to ``bchg-<pod>-<change>z``, a
string that shows as is in the bridge's CloudEvents JSON and in the collector's
OTLP protobuf, so one consumer (aiokafka, reading from the start) counts the
events of both and times each change.

The bridge runs from byte-compiled modules, as the image installs it (pip
compiles the wheel); the collector is a compiled Go binary, built by
``tools/peers/build`` (not part of ``make test``).
``--no-write`` leaves BENCHMARKS.md ("Peers") alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bench._support import (
    BENCHMARKS_MD,
    compile_bridge,
    cpu_model,
    free_port,
    update_benchmarks_md,
)
from bench.decode import make_pod

if TYPE_CHECKING:
    from tests.fixtures.kube import KubeCluster

SECTION = "Peers"
REPO = Path(__file__).resolve().parent.parent
MARK = re.compile(rb"bchg-(\d+)-(\d+)z")
IDLE_SECONDS = 10.0
MAX_MESSAGE = 64 << 20  # the collector sends one Kafka message per batch of log records
PROGRAMS = ("bridge", "collector")


def collector_binary() -> Path:
    from tests.fixtures.realdeps import cache_dir

    path = cache_dir() / "bin" / "otelcol-peers"
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path} is missing: run tools/peers/build first")
    return path


def pod(i: int, change: int) -> dict[str, Any]:
    """bench.decode's Pod as a client creates it (no uid, resourceVersion, status)."""
    p = make_pod(i)
    md = p["metadata"]
    for k in ("uid", "resourceVersion", "creationTimestamp", "generateName"):
        md.pop(k, None)
    md["ownerReferences"] = []
    md["labels"]["bench-chg"] = f"bchg-{i}-{change}z"
    p.pop("status", None)
    return p


class Changes:
    """Makes changes to the Pods (one label each) and remembers when each was sent."""

    def __init__(self, kube: KubeCluster, pods: int) -> None:
        self.kube = kube
        self.pods = pods
        self.next = 1  # change 0 is the creation
        self.sent: dict[int, float] = {}
        self._lock = threading.Lock()

    def _one(self, i: int, change: int) -> None:
        md = make_pod(i)["metadata"]
        label = {"metadata": {"labels": {"bench-chg": f"bchg-{i}-{change}z"}}}
        self.sent[change] = time.monotonic()
        self.kube.patch("v1", "Pod", md["name"], label, md["namespace"])

    def take(self, n: int) -> list[tuple[int, int]]:
        with self._lock:
            first, self.next = self.next, self.next + n
        return [((c - 1) % self.pods, c) for c in range(first, first + n)]

    def paced(self, rate: int, seconds: float) -> list[int]:
        """``rate`` changes per second for ``seconds``, round the Pods (one thread)."""
        done: list[int] = []
        start = time.monotonic()
        while (now := time.monotonic()) - start < seconds:
            due = int((now - start) * rate) - len(done)
            for i, c in self.take(due) if due > 0 else []:
                self._one(i, c)
                done.append(c)
            time.sleep(0.005)
        return done

    def burst(self, n: int, threads: int = 4) -> list[int]:
        """``n`` changes as fast as the server takes them."""
        work = self.take(n)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda ic: self._one(*ic), work))
        return [c for _, c in work]


@dataclass
class Seen:
    """What one topic holds: every (pod, change) mark and when it first arrived."""

    first: dict[tuple[int, int], float] = field(default_factory=dict)
    pods: set[int] = field(default_factory=set)
    by_change: dict[int, float] = field(default_factory=dict)
    events: int = 0  # marks, copies included
    last: float = 0.0

    def add(self, value: bytes, at: float) -> None:
        for m in MARK.finditer(value):
            key = (int(m[1]), int(m[2]))
            self.events += 1
            self.last = at
            if key not in self.first:
                self.first[key] = at
                self.pods.add(key[0])
                self.by_change.setdefault(key[1], at)


async def consume(bootstrap: str, topic: str, seen: Seen, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
        max_partition_fetch_bytes=MAX_MESSAGE,
        fetch_max_bytes=2 * MAX_MESSAGE,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=20)
            at = time.monotonic()
            for records in batches.values():
                for r in records:
                    if r.value:
                        seen.add(r.value, at)
    finally:
        await consumer.stop()


class Program:
    """One program under test: its config files and its process."""

    def __init__(self, name: str, workdir: Path, kubeconfig: Path, bootstrap: str) -> None:
        self.name = name
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.bootstrap = bootstrap
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, topic: str, selector: str = "") -> list[str]:
        d = self.workdir
        if self.name == "bridge":
            resource: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"}
            if selector:
                resource["labelSelector"] = selector
            config: dict[str, Any] = {
                "cluster": {"kubeconfig": str(self.kubeconfig)},
                "resources": [resource],
                "sink": {"kind": "kafka", "kafka": {"bootstrapServers": [self.bootstrap],
                                                    "topic": topic}},
                "checkpoint": {"kind": "sqlite", "path": str(d / "state.db")},
                "server": {"host": "127.0.0.1", "port": free_port()},
                "logging": {"format": "json", "level": "warning"},
            }  # fmt: skip
            (d / "bridge.yaml").write_text(yaml.safe_dump(config))
            return [sys.executable, "-m", "bridge.cli", "run", "--config", str(d / "bridge.yaml")]
        objects: dict[str, Any] = {"name": "pods", "mode": "watch"}
        if selector:
            objects["label_selector"] = selector
        config = {
            "receivers": {
                "k8sobjects": {
                    "auth_type": "kubeConfig",
                    # Without it the first list only gives the watch its resourceVersion.
                    "include_initial_state": True,
                    "objects": [objects],
                }
            },
            # As the configuration: batches of up to 200 ms.
            "processors": {"batch": {"timeout": "200ms"}},
            "exporters": {
                "kafka": {
                    "brokers": [self.bootstrap],
                    "logs": {"topic": topic, "encoding": "otlp_proto"},
                    "producer": {"max_message_bytes": MAX_MESSAGE, "required_acks": -1},
                }
            },
            "service": {
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                "pipelines": {
                    "logs": {
                        "receivers": ["k8sobjects"],
                        "processors": ["batch"],
                        "exporters": ["kafka"],
                    }
                },
            },
        }
        (d / "otelcol.yaml").write_text(yaml.safe_dump(config))
        return [str(collector_binary()), "--config", str(d / "otelcol.yaml")]

    def start(self, cmd: list[str]) -> None:
        # The collector's kubeConfig auth reads client-go's default places.
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir)}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        with (self.workdir / f"{self.name}.log").open("ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def _status(self, key: str) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def peak_rss(self) -> int:
        return self._status("VmHWM")

    def rss(self) -> int:
        return self._status("VmRSS")

    def cpu(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.workdir / f"{self.name}.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {log}")


async def wait_until(ok: Callable[[], bool], prog: Program, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not ok():
        prog.alive()
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def quiet(seen: Seen, prog: Program, *, settle: float, timeout: float) -> None:
    """Until nothing new arrived for ``settle`` seconds (at most ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        prog.alive()
        if time.monotonic() - max(seen.last, start) > settle:
            return
        await asyncio.sleep(0.1)


@dataclass
class Result:
    list_peak_rss: float = 0.0  # MiB
    list_cpu_per_1k: float = 0.0
    list_seconds: float = 0.0
    churn_rate: float = 0.0
    churn_p50_ms: float = 0.0
    churn_p99_ms: float = 0.0
    churn_cpu_per_1k: float = 0.0
    churn_missing: int = 0
    backlog_rate: float = 0.0
    backlog_missing: int = 0
    expired_made: int = 0
    expired_lost: int = 0
    restart_copies: int = 0
    idle_rss: float = 0.0  # MiB


async def run_program(
    name: str, kube: KubeCluster, changes: Changes, bootstrap: str, args: argparse.Namespace,
    workdir: Path, topic: str,
) -> Result:  # fmt: skip
    res = Result()
    d = workdir / topic
    d.mkdir()
    prog = Program(name, d, kube.write_kubeconfig(d / "kubeconfig"), bootstrap)
    seen, stop = Seen(), asyncio.Event()
    await create_topic(bootstrap, topic)
    consumer = asyncio.create_task(consume(bootstrap, topic, seen, stop))
    cmd = prog.write_config(topic)
    try:
        # First list.
        t0 = time.monotonic()
        prog.start(cmd)
        if not await wait_until(lambda: len(seen.pods) >= args.pods, prog, 600):
            raise RuntimeError(f"{name}: first list incomplete ({len(seen.pods)} Pods)")
        res.list_seconds = time.monotonic() - t0
        res.list_peak_rss = prog.peak_rss() / 2**20
        res.list_cpu_per_1k = prog.cpu() / args.pods * 1000
        await quiet(seen, prog, settle=2.0, timeout=30)
        print(f"  {name}: first list {res.list_seconds:.1f} s", file=sys.stderr, flush=True)

        # Steady churn.
        cpu0 = prog.cpu()
        made = await asyncio.to_thread(changes.paced, args.rate, args.seconds)
        await wait_until(lambda: all(c in seen.by_change for c in made), prog, 60)
        res.churn_cpu_per_1k = (prog.cpu() - cpu0) / len(made) * 1000
        res.churn_rate = len(made) / args.seconds
        lat = sorted(seen.by_change[c] - changes.sent[c] for c in made if c in seen.by_change)
        res.churn_missing = len(made) - len(lat)
        res.churn_p50_ms = statistics.median(lat) * 1000
        res.churn_p99_ms = lat[int(len(lat) * 0.99)] * 1000
        await quiet(seen, prog, settle=2.0, timeout=30)

        # A backlog: stopped while the changes are made, then continued.
        prog.signal(signal.SIGSTOP)
        made = await asyncio.to_thread(changes.burst, args.backlog)
        t0 = time.monotonic()
        prog.signal(signal.SIGCONT)
        await wait_until(lambda: all(c in seen.by_change for c in made), prog, 300)
        got = [seen.by_change[c] for c in made if c in seen.by_change]
        res.backlog_missing = len(made) - len(got)
        res.backlog_rate = len(got) / max(max(got, default=t0) - t0, 1e-3)
        await quiet(seen, prog, settle=2.0, timeout=30)

        # Changes it had not seen when its resourceVersion expired (410 Gone).
        # Its watch is cut first (a new kube-apiserver), so none of the changes
        # waits in its socket: it can learn of them only from the relist.
        prog.signal(signal.SIGSTOP)
        await asyncio.to_thread(kube.restart_apiserver)
        made = await asyncio.to_thread(changes.burst, min(args.backlog, args.pods))
        await asyncio.to_thread(kube.compact)
        await asyncio.to_thread(kube.restart_apiserver)
        prog.signal(signal.SIGCONT)
        await wait_until(lambda: all(c in seen.by_change for c in made), prog, 60)
        await quiet(seen, prog, settle=5.0, timeout=60)
        res.expired_made = len(made)
        res.expired_lost = sum(1 for c in made if c not in seen.by_change)

        # A restart on its own state: whatever it publishes is a copy.
        prog.stop()
        before = seen.events
        prog.start(cmd)
        await asyncio.sleep(5.0)
        await quiet(seen, prog, settle=5.0, timeout=120)
        res.restart_copies = seen.events - before
        prog.stop()

        # Idle: a fresh process watching Pods, none of which match.
        idle = Program(name, d / "idle", prog.kubeconfig, bootstrap)
        idle.workdir.mkdir()
        idle.start(idle.write_config(topic + ".idle", selector="bench-none=1"))
        try:
            await asyncio.sleep(IDLE_SECONDS)
            idle.alive()
            res.idle_rss = idle.rss() / 2**20
        finally:
            idle.stop()
        return res
    finally:
        prog.stop()
        stop.set()
        await consumer


async def create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cfg = {"max.message.bytes": str(MAX_MESSAGE)}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=cfg)])
    finally:
        await admin.close()


def populate(kube: KubeCluster, pods: int) -> None:
    namespaces = sorted({pod(i, 0)["metadata"]["namespace"] for i in range(min(pods, 40))})
    for ns in namespaces:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: kube.create(pod(i, 0)), range(pods)))


def versions() -> str:
    from importlib.metadata import version

    from tests.fixtures.realdeps import cache_dir

    binary = cache_dir() / "bin" / "otelcol-peers"

    def stamp(path: str) -> str:
        found = cache_dir() / path
        return found.read_text().split()[0] if found.exists() else "?"

    otel = "no collector"
    if binary.exists():
        run = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        otel = run.stdout.strip() + " (k8sobjects receiver, batch processor, Kafka exporter)"
    return (
        f"kube-apiserver {stamp('bin/.kube-apiserver.version')} + etcd"
        f" {stamp('bin/.etcd.version')}, Apache Kafka {stamp('kafka/.version')} (one broker),"
        f" {otel},"
        f" Python {platform.python_version()}, aiokafka {version('aiokafka')},"
        f" orjson {version('orjson')}"
    )


def table(results: dict[str, list[Result]]) -> list[str]:
    def med(name: str, attr: str) -> float:
        rs = results.get(name) or [Result()]
        return float(statistics.median(getattr(r, attr) for r in rs))

    cols = [
        ("peak RSS, first list", "list_peak_rss", "{:,.0f} MiB", False),
        ("CPU s per 1,000 events, first list", "list_cpu_per_1k", "{:.2f} s", False),
        ("backlog drained (events/s)", "backlog_rate", "{:,.0f}", True),
        ("change → sink at steady churn (p50)", "churn_p50_ms", "{:,.0f} ms", False),
        ("change → sink (p99)", "churn_p99_ms", "{:,.0f} ms", False),
        ("CPU s per 1,000 events, steady churn", "churn_cpu_per_1k", "{:.2f} s", False),
        ("idle process RSS (nothing matched)", "idle_rss", "{:,.0f} MiB", False),
    ]
    rows = ["| | bridge | collector | collector / bridge |", "| --- | ---: | ---: | ---: |"]
    for title, attr, fmt, _ in cols:
        b, c = med("bridge", attr), med("collector", attr)
        ratio = f"{c / b:.2f}" if b and c else "-"
        rows.append(f"| {title} | {fmt.format(b)} | {fmt.format(c)} | {ratio} |")
    for title, attr in [
        ("steady churn achieved (changes/s)", "churn_rate"),
        ("changes lost after a 410 (of those made while stopped)", "expired_lost"),
        ("events re-sent by a restart", "restart_copies"),
        ("changes missing (churn + backlog)", "churn_missing"),
    ]:
        vals = [
            "/".join(
                f"{getattr(r, attr) + (r.backlog_missing if attr == 'churn_missing' else 0):,.0f}"
                + (f" of {r.expired_made:,}" if attr == "expired_lost" else "")
                for r in results.get(name, [])
            )
            for name in PROGRAMS
        ]
        rows.append(f"| {title} | {vals[0]} | {vals[1]} | |")
    return rows


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, list[Result]]:
    from tests.fixtures.kube import KubeCluster
    from tests.fixtures.realkafka import KafkaBroker

    kube = KubeCluster(workdir / "kube")
    kube.workdir.mkdir()
    broker = KafkaBroker(workdir / "kafka", message_max_bytes=MAX_MESSAGE)
    broker.workdir.mkdir()
    programs = tuple(p for p in PROGRAMS if p in args.programs)
    results: dict[str, list[Result]] = {p: [] for p in programs}
    if "bridge" in programs:
        compile_bridge(REPO)  # the collector is a compiled binary; the bridge's image is too
    try:
        await asyncio.to_thread(kube.start)
        await asyncio.to_thread(broker.start)
        t0 = time.monotonic()
        await asyncio.to_thread(populate, kube, args.pods)
        print(f"  {args.pods:,} Pods in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        changes = Changes(kube, args.pods)
        for rnd in range(args.rounds):
            order = programs if rnd % 2 == 0 else programs[::-1]
            for name in order:
                topic = f"peers-{name}-{rnd}"
                res = await run_program(name, kube, changes, broker.bootstrap, args, workdir, topic)
                results[name].append(res)
                print(f"  round {rnd + 1} {name}: {res}", file=sys.stderr, flush=True)
    finally:
        await asyncio.to_thread(kube.stop)
        await asyncio.to_thread(broker.stop)
    return results


def main(argv: list[str]) -> int:
    from tests.fixtures.realdeps import cache_dir

    parser = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--backlog", type=int, default=10_000, help="changes made while stopped")
    parser.add_argument("--rate", type=int, default=200, help="steady churn, changes per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="steady churn's length")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2,000 Pods, 2,000 changes, 1 round")
    parser.add_argument("--programs", nargs="+", choices=PROGRAMS, default=list(PROGRAMS))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the servers' and programs' logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.pods, args.backlog, args.seconds, args.rounds = 2000, 2000, 15.0, 1
    if "collector" in args.programs and not (cache_dir() / "bin" / "otelcol-peers").exists():
        print(f"{cache_dir() / 'bin' / 'otelcol-peers'} is missing: run tools/peers/build first")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        results = asyncio.run(bench(args, workdir))
    except BaseException:
        print(f"  kept {workdir} for its logs", file=sys.stderr)
        raise
    if args.keep:
        print(f"  logs in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = table(results)
    print("\n".join(rows))
    flags = " ".join(
        f"--{k} {getattr(args, k)}" for k in ("pods", "backlog", "rate", "seconds", "rounds")
    )
    body = (
        f"`python -m bench peers {flags}` on {cpu_model()} ({os.cpu_count()} cores, shared),"
        f" {time.strftime('%Y-%m-%d')}, the servers of tests/fixtures: {versions()}. Each"
        f" program in its own process, one at a time, alternating; medians over {args.rounds}"
        " round(s) (the last four rows give every round, separated by /). The collector's"
        " column is the peer the bridge is compared with; the last column is collector /"
        " bridge.\n\n" + "\n".join(rows) + "\n"
    )
    if not args.no_write and set(args.programs) == set(PROGRAMS):
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
