"""One kind across replicas: what each replica receives and spends per second of churn.

The emulator (in this process) holds N Pods (~2.8 KB each, bench.decode's) in 40
namespaces and serves ``shardSelector`` as kube-apiserver 1.37 does with
ShardedListAndWatch on (``server``) or ignores it as with the gate off
(``client``: every replica receives everything and drops what is not its slice).
For 1, 2 and 4 shards (``sharding.by: uid``), that many ``k8s-bridge run``
processes (stdout sink to /dev/null, SQLite checkpoints) each reach it through a
proxy that counts the bytes the API server sends them. Once all are synced, the
Pods are patched at a fixed rate for a fixed time; the measure ends when every
change is published (the replicas' ``events_published_total`` sum). Per replica:
bytes received and CPU seconds (utime + stime of its process) per second of churn,
and the same CPU measured as long with nothing changing just before (bookmarks,
metrics, timers: what a replica costs whatever its share), so the part that
scales with the changes it receives shows apart.

The ceiling of the same run is one unsharded replica: ratios are per replica
against it, so server-side sharding should give about 1/N of the bytes and of
the CPU, client-side the bytes of one whole stream and the CPU of decoding it.

``--no-write`` leaves BENCHMARKS.md ("Sharding") alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from bench._support import BENCHMARKS_MD, cpu_model, free_port, update_benchmarks_md
from bench.decode import make_pod

SECTION = "Sharding"


@dataclass
class Replica:
    proc: asyncio.subprocess.Process
    port: int
    received: list[int]  # bytes from the API server (one cell, shared with its proxy)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    async def published(self, session: aiohttp.ClientSession) -> float:
        async with session.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            text = await r.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("k8s_bridge_events_published_total{")
        )

    async def ready(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(f"http://127.0.0.1:{self.port}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False


async def counting_proxy(target: int, counter: list[int]) -> asyncio.Server:
    """A TCP proxy to ``127.0.0.1:target`` that adds every byte it sends back to ``counter``."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        try:
            while data := await reader.read(1 << 16):
                if count:
                    counter[0] += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def measure(
    objects: int, shards: int, server_side: bool, rate: int, seconds: float, workdir: Path
) -> tuple[list[int], list[float], list[float]]:
    """Per replica: bytes received over the churn, CPU seconds per second of churn,
    and CPU seconds per second idle (before it)."""
    from bridge.emulator import Emulator
    from bridge.emulator.server import write_kubeconfig

    emu = Emulator(bookmark_interval=5.0, sharded_list_watch=server_side)
    for i in range(objects):
        emu.create(make_pod(i))
    await emu.start()
    proxies: list[asyncio.Server] = []
    replicas: list[Replica] = []
    try:
        for index in range(shards):
            counter = [0]
            proxy = await counting_proxy(int(emu.url.rsplit(":", 1)[1]), counter)
            proxies.append(proxy)
            proxy_port = proxy.sockets[0].getsockname()[1]
            d = workdir / f"{shards}-{index}-{'server' if server_side else 'client'}"
            d.mkdir()
            port = free_port()
            config = {
                "cluster": {"kubeconfig": str(write_kubeconfig(d / "kubeconfig",
                                                               f"http://127.0.0.1:{proxy_port}"))},
                "resources": [{"apiVersion": "v1", "kind": "Pod"}],
                "sink": {"kind": "stdout"},
                "checkpoint": {"kind": "sqlite", "path": str(d / "state.db")},
                "server": {"host": "127.0.0.1", "port": port},
                "logging": {"format": "json", "level": "warning"},
                "sharding": {"by": "uid", "shards": shards, "shardIndex": index},
            }  # fmt: skip
            (d / "bridge.yaml").write_text(yaml.safe_dump(config))
            with (d / "bridge.log").open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bridge.cli", "run", "--config", str(d / "bridge.yaml"),
                    stdout=asyncio.subprocess.DEVNULL, stderr=err,
                )  # fmt: skip
            replicas.append(Replica(proc, port, counter))
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 120
            while not all([await r.ready(session) for r in replicas]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replicas not ready; see {workdir}")
                await asyncio.sleep(0.2)
            before = sum([await r.published(session) for r in replicas])
            await asyncio.sleep(1.0)  # the first sync's trailing work (trim, commits)
            # What a replica spends with nothing changing (bookmarks, metrics, timers),
            # over as long as the churn: the part of its CPU that is not per change.
            idle0 = [r.cpu_seconds() for r in replicas]
            await asyncio.sleep(seconds)
            idle = [r.cpu_seconds() - c for r, c in zip(replicas, idle0, strict=True)]
            bytes0 = [r.received[0] for r in replicas]
            cpu0 = [r.cpu_seconds() for r in replicas]
            # Patch at ``rate`` per second, in 20 ms steps, round the Pods.
            changes, step, start = 0, 0.02, time.monotonic()
            while (now := time.monotonic()) - start < seconds:
                due = int((now - start) * rate)
                while changes < due:
                    i = changes % objects
                    pod = make_pod(i)
                    md = pod["metadata"]
                    emu.patch("v1", "Pod", md["name"], {"metadata": {"labels": {"rev": str(changes)}}},
                              md["namespace"])  # fmt: skip
                    changes += 1
                await asyncio.sleep(step)
            deadline = time.monotonic() + 120
            while sum([await r.published(session) for r in replicas]) < before + changes:
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not publish every change")
                await asyncio.sleep(0.1)
            received = [r.received[0] - b for r, b in zip(replicas, bytes0, strict=True)]
            cpu = [r.cpu_seconds() - c for r, c in zip(replicas, cpu0, strict=True)]
        return received, [c / seconds for c in cpu], [c / seconds for c in idle]
    finally:
        for r in replicas:
            if r.proc.returncode is None:
                r.proc.terminate()
        await asyncio.gather(*(r.proc.wait() for r in replicas))
        for p in proxies:
            p.close()
        await emu.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench shards", description=__doc__)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=1000, help="changes per second")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    ceiling: tuple[float, float, float] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        for server_side in (True, False):
            for n in args.shards:
                if n == 1 and not server_side:
                    continue  # one shard sends no selector: the same as server-side
                got, cpu, idle = asyncio.run(
                    measure(args.objects, n, server_side, args.rate, args.seconds, Path(tmp))
                )
                per_s = [b / args.seconds for b in got]
                mean_b, mean_cpu, mean_idle = sum(per_s) / n, sum(cpu) / n, sum(idle) / n
                net = mean_cpu - mean_idle
                if n == 1:
                    ceiling = (mean_b, mean_cpu, net)
                assert ceiling is not None, "--shards must start with 1 (the ceiling)"
                mode = "server-side" if server_side else "client-side"
                rows.append(
                    f"| {n} | {mode if n > 1 else 'unsharded'} | {mean_b / 1024:,.0f} KiB/s "
                    f"({mean_b / ceiling[0]:.2f}) | {mean_cpu:.3f} ({mean_cpu / ceiling[1]:.2f}) "
                    f"| {mean_idle:.3f} | {net:.3f} ({net / ceiling[2]:.2f}) |"
                )
                print(rows[-1], flush=True)
    body = (
        f"`python -m bench shards --objects {args.objects} --rate {args.rate} --seconds"
        f" {args.seconds:g}` on {cpu_model()} ({os.cpu_count()} cores, shared),"
        f" Python {platform.python_version()}: {args.objects:,} Pods (~2.8 KB), patched at"
        f" {args.rate}/s for {args.seconds:g} s, `sharding.by: uid`. Per replica, the mean"
        " over the replicas; in brackets the ratio to one unsharded replica (the ceiling,"
        " measured in the same run).\n\n"
        "| shards | selector | received from the API server | CPU s per s of churn |"
        " idle CPU s per s | churn less idle |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n"
    )
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
