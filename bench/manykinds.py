"""One bridge watching hundreds of kinds, most of them idle CRDs, on a real kube-apiserver.

kube-apiserver + etcd (``tools/realdeps/build``) serve ``--kinds`` CustomResourceDefinitions
of one group, each with no objects but ``--objects-in`` of them holding a few. A
``BridgeApp`` (memory checkpoint, stdout sink to /dev/null) runs in this process with
one entry, ``group: <that group>``, and is measured from start until every pipeline has
synced:

  start-up       seconds from ``run`` to every pipeline synced
  requests       HTTP requests the bridge sent until then (discovery, access probes,
                 lists/watches), and the most requests open at once
  memory / kind  RSS growth from before start to synced, divided by the kinds
  tasks / kind   asyncio tasks alive once synced, divided by the kinds

Ceiling, measured in the same run: the same client opening the same number of
streaming lists (``sendInitialEvents``, what a pipeline opens) ``--concurrency`` at
a time and reading each to its initial-events bookmark, with nothing else: start-up /
ceiling is what the bridge adds over the API server's own cost.

Writes the "Many kinds" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _crd(group: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"kind{i}s.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": f"kind{i}s", "singular": f"kind{i}", "kind": f"Kind{i}"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


class _Counting:
    """Counts the requests every KubeClient sends, and the most open at once."""

    def __init__(self) -> None:
        self.sent = 0
        self.open = 0
        self.most = 0
        self.paths: list[Any] = []

    def install(self) -> Any:
        from bridge.kube.client import KubeClient

        original = KubeClient._send
        counter = self

        async def _send(client: Any, *args: Any, **kw: Any) -> Any:
            counter.sent += 1
            counter.open += 1
            if counter.open > counter.most:
                counter.most = counter.open
                counter.paths.append((args[0], args[1], str(args[2])[:80]))
            try:
                # Until the answer's headers: how many requests the bridge opens at once.
                return await original(client, *args, **kw)
            finally:
                counter.open -= 1

        KubeClient._send = _send  # type: ignore[method-assign,assignment]
        return original


async def _ceiling(kubeconfig: Path, group: str, kinds: int, concurrency: int) -> float:
    from bridge.errors import TooManyRequestsError
    from bridge.kube.client import KubeClient

    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            params: dict[str, str | int | bool] = {
                "watch": 1,
                "sendInitialEvents": True,
                "resourceVersionMatch": "NotOlderThan",
                "allowWatchBookmarks": True,
            }
            async with gate:
                path = f"/apis/{group}/v1/kind{i}s"
                while True:
                    try:
                        async with client.stream_decoded("GET", path, params) as events:
                            async for event in events:
                                if event.get("type") == "BOOKMARK":
                                    return
                    except TooManyRequestsError:  # its watch cache still initializing
                        await asyncio.sleep(0.2)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(kinds)))
        return time.perf_counter() - start


async def _bridge(kubeconfig: Path, group: str, kinds: int, ns: str) -> dict[str, float]:
    from bridge.checkpoints.memory import MemoryCheckpointStore
    from bridge.ground.prometheus import Registry
    from bridge.service.app import BridgeApp
    from bridge.service.settings import load_settings

    settings = load_settings(
        None,
        {
            "cluster": {"kubeconfig": str(kubeconfig)},
            "resources": [{"group": group}],
            "sink": {"kind": "stdout"},
            "checkpoint": {"kind": "memory"},
            "server": {"host": "127.0.0.1", "port": 0},
            "logging": {"level": "warning"},
        },
        env={},
    )
    counting = _Counting()
    original = counting.install()
    gc.collect()
    rss_before = _rss()
    app = BridgeApp(settings, checkpoints=MemoryCheckpointStore(), registry=Registry())
    stop = asyncio.Event()
    start = time.perf_counter()
    runner = asyncio.create_task(app.run(stop))
    try:
        while len(app.pipelines) < kinds or not all(p.has_synced() for p in app.pipelines):
            if runner.done():
                runner.result()
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - start
        sent, most = counting.sent, counting.most
        await asyncio.sleep(1.0)
        gc.collect()
        rss = _rss() - rss_before
        tasks = len(asyncio.all_tasks())
    finally:
        stop.set()
        await runner
        from bridge.kube.client import KubeClient

        KubeClient._send = original  # type: ignore[method-assign]
    return {
        "seconds": seconds,
        "requests": sent,
        "most_open": most,
        "rss_per_kind": rss / kinds,
        "tasks_per_kind": tasks / kinds,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench manykinds", description=__doc__)
    parser.add_argument("--kinds", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from tests.fixtures.kube import KubeCluster

    workdir = Path(tempfile.mkdtemp(prefix="bench-kinds-"))
    cluster = KubeCluster(workdir)
    group = f"b{uuid.uuid4().hex[:6]}.k8s-bridge.test"
    try:
        cluster.start()
        kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")
        ns = cluster.namespace("bench")
        started = time.perf_counter()
        for i in range(args.kinds):
            cluster.create(_crd(group, i))
        while True:
            status, doc = cluster.raw("GET", f"/apis/{group}/v1")
            if status == 200 and len(doc.get("resources", [])) >= args.kinds:
                break
            time.sleep(0.5)
        print(f"  {args.kinds} CRDs served after {time.perf_counter() - started:.0f}s")
        # Twice: the first waits out the new watch caches; the second counts.
        asyncio.run(_ceiling(kubeconfig, group, args.kinds, args.concurrency))
        ceiling = asyncio.run(_ceiling(kubeconfig, group, args.kinds, args.concurrency))
        got = asyncio.run(_bridge(kubeconfig, group, args.kinds, ns))
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    body = "\n".join(
        [
            f"`python -m bench manykinds --kinds {args.kinds}` on {cpu_model()}"
            f" ({platform.python_version()}), kube-apiserver + etcd from `tools/realdeps/build`:"
            f" one entry `group: <g>` selecting {args.kinds} idle CRDs (no objects), memory"
            " checkpoint, stdout sink. Ceiling: the same client opening the same streaming"
            f" lists, {args.concurrency} at a time, and nothing else.",
            "",
            "| figure | value |",
            "| --- | ---: |",
            f"| start-up to every pipeline synced | {got['seconds']:.2f} s |",
            f"| ceiling (bare streaming lists) | {ceiling:.2f} s |",
            f"| start-up / ceiling | {got['seconds'] / ceiling:.1f} |",
            f"| requests until synced | {got['requests']:.0f}"
            f" ({got['requests'] / args.kinds:.2f} per kind) |",
            f"| most requests opening at once | {got['most_open']:.0f} |",
            f"| memory per idle kind (RSS) | {got['rss_per_kind'] / 1024:.0f} KiB |",
            f"| asyncio tasks per idle kind | {got['tasks_per_kind']:.1f} |",
        ]
    )
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, "Many kinds", body)
    sys.stdout.flush()
    return 0
