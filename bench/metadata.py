"""Metadata only (``metadataOnly: true``) against full objects, on a real kube-apiserver.

A kube-apiserver + etcd (built by ``tools/realdeps/build``) holds N ConfigMaps
with ``--data-bytes`` of data each and N Pods with a typical spec (no kubelet: they
stay Pending). For each kind the bridge's own ``ListWatch`` lists them all
(paginated, ``--page-size``) twice: full objects, then metadata only
(``PartialObjectMetadataList``). Reported per object:

  bytes     bytes of the LIST answers read (the HTTP bodies, as the bridge reads them)
  memory    bytes Python holds for one decoded object (tracemalloc: what the list of
            decoded objects frees when dropped, divided by N)
  time      seconds to list them all

Each figure of metadata only is given as a ratio to the full objects' figure measured
in the same run (the ceiling: what the bridge reads without the option).

Writes the "Metadata only" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md


def _pod(ns: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{i}",
            "namespace": ns,
            "labels": {"app": "web", "tier": "front", "pod-template-hash": "5d8f7c9b6"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
        },
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/team/web:1.27.3",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [{"name": f"SETTING_{k}", "value": f"value-{k}"} for k in range(8)],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "512Mi"},
                    },
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
                }
            ],
            "nodeSelector": {"kubernetes.io/os": "linux"},
        },
    }


def _configmap(ns: str, i: int, data_bytes: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"c{i}", "namespace": ns, "labels": {"app": "web"}},
        "data": {"config.yaml": ("x" * 63 + "\n") * (data_bytes // 64)},
    }


async def _measure(
    kubeconfig: Path, ns: str, kind: str, plural: str, metadata_only: bool, page: int
) -> tuple[int, int, float, int]:
    """(bytes read, bytes held by the decoded objects, seconds, objects) of one full list."""
    from bridge.kube.client import KubeClient
    from bridge.kube.discovery import ResourceInfo
    from bridge.kube.listwatch import ListWatch
    from bridge.kube.protocols import ListOptions

    info = ResourceInfo("", "v1", kind, plural, True, ("list", "watch"))
    async with await KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        read = 0
        original = client.stream_body

        def counting(*args: Any, **kw: Any) -> Any:
            cm = original(*args, **kw)

            class Counted:
                async def __aenter__(self) -> Any:
                    chunks = await cm.__aenter__()

                    async def counted() -> Any:
                        nonlocal read
                        async for chunk in chunks:
                            read += len(chunk)
                            yield chunk

                    return counted()

                async def __aexit__(self, *exc: Any) -> Any:
                    return await cm.__aexit__(*exc)

            return Counted()

        client.stream_body = counting  # type: ignore[method-assign]
        lw = ListWatch(client, info, namespace=ns, metadata_only=metadata_only)
        items: list[Any] = []
        tracemalloc.start()
        start = time.perf_counter()
        token = None
        while True:
            async with lw.list_stream(ListOptions(limit=page, continue_token=token)) as body:
                async for batch in body:
                    items.extend(batch)
            token = body.metadata.get("continue") or None
            if not token:
                break
        seconds = time.perf_counter() - start
        count = len(items)
        # What the decoded objects hold: the traced memory they free when dropped.
        gc.collect()
        with_items, _ = tracemalloc.get_traced_memory()
        items.clear()
        gc.collect()
        without, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return read, with_items - without, seconds, count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench metadata", description=__doc__)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--data-bytes", type=int, default=2048)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from tests.fixtures.kube import KubeCluster

    workdir = Path(tempfile.mkdtemp(prefix="bench-metadata-"))
    cluster = KubeCluster(workdir)
    rows = []
    try:
        cluster.start()
        kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")
        ns = cluster.namespace("bench")
        started = time.perf_counter()
        for i in range(args.objects):
            cluster.create(_configmap(ns, i, args.data_bytes))
            cluster.create(_pod(ns, i))
        print(f"  created {2 * args.objects} objects in {time.perf_counter() - started:.0f}s")
        for kind, plural in (("ConfigMap", "configmaps"), ("Pod", "pods")):
            # Each twice, alternating; the second of each (warm server caches) counts.
            full = meta = (0, 0, 0.0, 0)
            for _ in range(2):
                full = asyncio.run(_measure(kubeconfig, ns, kind, plural, False, args.page_size))
                meta = asyncio.run(_measure(kubeconfig, ns, kind, plural, True, args.page_size))
            assert full[3] == meta[3] == args.objects, (full, meta)
            n = args.objects
            row = (
                f"| {kind} | {full[0] / n:,.0f} | {meta[0] / n:,.0f} | {meta[0] / full[0]:.2f} "
                f"| {full[1] / n:,.0f} | {meta[1] / n:,.0f} | {meta[1] / full[1]:.2f} "
                f"| {full[2]:.2f} | {meta[2]:.2f} | {meta[2] / full[2]:.2f} |"
            )
            print(row)
            rows.append(row)
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    body = "\n".join(
        [
            f"`python -m bench metadata --objects {args.objects} --data-bytes {args.data_bytes}`"
            f" on {cpu_model()} ({platform.python_version()}), kube-apiserver + etcd from"
            " `tools/realdeps/build`. One namespace holding N ConfigMaps (each"
            f" ~{args.data_bytes} bytes of data) and N Pods (one container, 8 env vars,"
            " probes, resources); each listed whole with the bridge's ListWatch in pages of"
            f" {args.page_size}: full objects, then `metadataOnly` (PartialObjectMetadataList)."
            " Per object: bytes of the LIST answers read; bytes Python holds per decoded"
            " object (tracemalloc, objects parsed whole); seconds for the whole list (each listed twice, alternating; the second counts). Ratio ="
            " metadata only / full objects, both measured in the same run.",
            "",
            "| kind | bytes full | bytes meta | ratio | memory full | memory meta | ratio "
            "| s full | s meta | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, "Metadata only", body)
    return 0
