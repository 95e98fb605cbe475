"""Latency: a change in the API server → its event stored by JetStream, at a steady rate.

    python -m bench latency [--rate 1000] [--seconds 20] [--warmup 3] [--no-write]

Everything runs as its own process, as in production: the project's API
emulator, nats-server (JetStream on disk), and ``k8s-bridge run`` (Pods only,
SQLite checkpoint). This process drives the API server: merge-PATCHes to
pods at a steady rate, scheduled by absolute time so the rate does not drift,
and notes when each response arrived, keyed by ``{uid}:{resourceVersion}`` of
the response — exactly the id of the event the bridge publishes. A JetStream
push consumer in this process notes when each event is delivered; JetStream
delivers only what it has stored, so that time is an upper bound of the bus
ack.

The ceiling, measured in the same run one phase after the other: a minimal
forwarder process (``reader`` below) that holds one WATCH, parses each line
with orjson and publishes it with ``js.publish``, awaiting each ack — the
simplest correct bridge, without checkpoints, change detection or events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.js.errors
import orjson
import yaml

from bench._support import (
    BENCHMARKS_MD,
    cpu_model,
    free_port,
    process,
    update_benchmarks_md,
    wait_port,
)

PODS = 200


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "default", "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}], "nodeName": "n0"},
        "status": {"phase": "Running"},
    }


@contextmanager
def child(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def until_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not ready in {timeout}s")


async def until_stream(nats_url: str, stream: str, timeout: float = 30.0) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while True:
            try:
                await js.stream_info(stream)
                return
            except nats.js.errors.NotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await nc.close()


class Receiver:
    """Notes when each message id is delivered from a stream."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    async def handle(self, msg: Any) -> None:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        if msg_id:
            self.at.setdefault(msg_id, time.monotonic())


async def drive(api: str, rate: float, seconds: float) -> dict[str, float]:
    """PATCH pods at ``rate``/s for ``seconds``; event id → when the change was answered."""
    changed: dict[str, float] = {}
    interval = 1.0 / rate
    headers = {"Content-Type": "application/merge-patch+json"}
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def one(i: int) -> None:
            body = orjson.dumps({"spec": {"nodeName": f"n{i}"}})
            url = f"{api}/api/v1/namespaces/default/pods/p{i % PODS}"
            async with s.patch(url, data=body, headers=headers) as r:
                doc = orjson.loads(await r.read())
            changed[f"{doc['metadata']['uid']}:{doc['metadata']['resourceVersion']}"] = (
                time.monotonic()
            )

        start = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        i = 0
        while True:
            due = start + i * interval
            if due - start >= seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i + 1)))
            i += 1
        await asyncio.gather(*tasks)
    return changed


async def sample_lag(metrics_url: str, lags: list[float]) -> None:
    """The bridge's checkpoint lag, twice a second, while changes keep coming."""
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(metrics_url) as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("k8s_bridge_checkpoint_lag_seconds{"):
                        lags.append(float(line.rsplit(" ", 1)[1]))
            await asyncio.sleep(0.5)


async def measure(
    api: str,
    nats_url: str,
    stream: str,
    subject: str,
    rate: float,
    seconds: float,
    warmup: float,
    metrics_url: str | None = None,
) -> dict[str, Any]:
    nc = await nats.connect(nats_url)
    received = Receiver()
    lags: list[float] = []
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subject, cb=received.handle, ordered_consumer=True)
        await drive(api, rate, warmup)  # warm-up: caches, connections, JIT-free but warm
        await asyncio.sleep(0.5)
        sampler = asyncio.create_task(sample_lag(metrics_url, lags)) if metrics_url else None
        try:
            changed = await drive(api, rate, seconds)
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not changed.keys() <= received.at.keys():
            await asyncio.sleep(0.05)
        await sub.unsubscribe()
    finally:
        await nc.close()
    missing = [k for k in changed if k not in received.at]
    lat = sorted((received.at[k] - t) * 1000 for k, t in changed.items() if k in received.at)
    return {
        "sent": len(changed),
        "missing": len(missing),
        "p50": statistics.median(lat) if lat else float("nan"),
        "p99": lat[int(len(lat) * 0.99) - 1] if lat else float("nan"),
        "max": lat[-1] if lat else float("nan"),
        "lag": max(lags) if lags else None,
    }


async def seed(api: str) -> None:
    async with aiohttp.ClientSession() as s:
        for i in range(PODS):
            async with s.post(
                f"{api}/api/v1/namespaces/default/pods", data=orjson.dumps(pod(i))
            ) as r:
                if r.status not in (200, 201):
                    raise RuntimeError(f"seeding pod {i}: HTTP {r.status}")


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, Any]]:
    nats_port, api_port, health = free_port(), free_port(), free_port()
    nats_url, api = f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{api_port}"
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit(
            "nats-server not on PATH (make realdeps builds it; make bench puts it first)"
        )
    log = tmp / "children.log"
    kubeconfig = tmp / "kubeconfig"
    py = sys.executable
    nats_cmd = [binary, "-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", str(tmp / "js")]
    emulator = [py, "-m", "bridge.cli", "emulator", "--port", str(api_port)]
    emulator += ["--kubeconfig", str(kubeconfig)]
    results: dict[str, dict[str, Any]] = {}
    with process(nats_cmd, nats_port), child(emulator, log):
        wait_port(api_port, 30)
        await seed(api)
        config = {
            "cluster": {"kubeconfig": str(kubeconfig), "name": "bench"},
            "resources": [{"apiVersion": "v1", "kind": "Pod"}],
            "sink": {"kind": "nats", "nats": {"servers": [nats_url]}},
            "checkpoint": {
                "kind": "sqlite",
                "path": str(tmp / "state.db"),
                "syncWriteAhead": args.sync_write_ahead == "on",
            },
            "server": {"host": "127.0.0.1", "port": health},
            "logging": {"format": "json", "level": "warning"},
        }
        (tmp / "bridge.yaml").write_text(yaml.safe_dump(config))
        with child([py, "-m", "bridge.cli", "run", "--config", str(tmp / "bridge.yaml")], log):
            await until_ready(f"http://127.0.0.1:{health}/readyz")
            results["k8s-bridge"] = await measure(
                api,
                nats_url,
                "K8S",
                "k8s.>",
                args.rate,
                args.seconds,
                args.warmup,
                f"http://127.0.0.1:{health}/metrics",
            )
        reader = [py, "-m", "bench.latency", "reader", "--api", api, "--nats", nats_url]
        with child(reader, log):
            await until_stream(nats_url, "RAW")
            await asyncio.sleep(1.0)  # its watch is open by now
            results["ceiling"] = await measure(
                api, nats_url, "RAW", "raw.>", args.rate, args.seconds, args.warmup
            )
    return results


# -- the minimal forwarder (the ceiling) ------------------------------------------


async def reader(api: str, nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name="RAW", subjects=["raw.>"])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        async with s.get(f"{api}/api/v1/pods?limit=1") as r:
            rv = orjson.loads(await r.read())["metadata"]["resourceVersion"]
        url = f"{api}/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
        async with s.get(url) as r:
            async for line in r.content:
                event = orjson.loads(line)
                md = event["object"].get("metadata") or {}
                if event["type"] == "BOOKMARK":
                    continue
                msg_id = f"{md['uid']}:{md['resourceVersion']}"
                await js.publish(
                    f"raw.{md['namespace']}.{md['name']}",
                    line,
                    headers={"Nats-Msg-Id": msg_id},
                )


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    b, c = results["k8s-bridge"], results["ceiling"]
    rows = [
        "| path | changes | missing | p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in (("k8s-bridge run", b), ("minimal forwarder (ceiling)", c)):
        rows.append(
            f"| {name} | {r['sent']:,} | {r['missing']} | {r['p50']:.1f} | {r['p99']:.1f} |"
            f" {r['max']:.1f} |"
        )
    lag = b.get("lag")
    lag_line = (
        f"checkpoint lag of the bridge while changes never paused: at most {lag:.2f} s"
        " (k8s_bridge_checkpoint_lag_seconds, sampled twice a second)\n"
        if lag is not None
        else ""
    )
    ratio = (
        f"bridge/ceiling: p50 {b['p50'] / c['p50']:.2f}x, p99 {b['p99'] / c['p99']:.2f}x"
        if c["p50"] and c["p99"]
        else ""
    )
    return "\n".join(rows) + f"\n\n{ratio}\n\n{lag_line}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["reader"]:
        p = argparse.ArgumentParser(prog="bench.latency reader")
        p.add_argument("--api", required=True)
        p.add_argument("--nats", required=True)
        a = p.parse_args(argv[1:])
        asyncio.run(reader(a.api, a.nats))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0, help="changes per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    parser.add_argument(
        "--sync-write-ahead",
        choices=("on", "off"),
        default="on",
        help="the bridge's checkpoint.syncWriteAhead (on: the default)",
    )
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="k8s-bridge-latency-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    table = report(results, args)
    print("== latency: change answered by the API server → event delivered from JetStream")
    print(table)
    if not args.no_write:
        body = f"""Measured with `python -m bench latency --rate {args.rate:g} --seconds {args.seconds:g}`
on {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}.
Every part is its own process: the project's API emulator, nats-server
(JetStream on disk), `k8s-bridge run` (Pods, SQLite checkpoint), and the
driver, which PATCHes {PODS} pods at a steady {args.rate:g} changes/s and
notes when each PATCH was answered and when JetStream delivered the event
with that id to a push consumer (an upper bound of the bus ack: JetStream
delivers only what it stored). The ceiling is a minimal forwarder process
(one WATCH, orjson, `js.publish` awaiting each ack) measured the same way,
in the same run, after the bridge.

{table}"""
        update_benchmarks_md(
            BENCHMARKS_MD,
            "Latency (change → JetStream ack)",
            body,
        )
    missing = results["k8s-bridge"]["missing"] + results["ceiling"]["missing"]
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
