"""``python -m bench records``: bytes per object of a slim informer's cache, steady state.

Each row is a fresh subprocess that fills an ``Indexer`` (the informer's store,
keyed only, as the bridge keeps it) with N cached records of realistic Pods (uuid4
uids, resourceVersions from the tens of millions, xxh3-128 fingerprints,
keys like ``team-042/web-0001234-7c9b6``) and reports the memory that stays:
what tracemalloc counts as allocated by the fill, and the RSS growth after a
GC. *dict record*: the slim record as it was (``{apiVersion, kind,
metadata: {name, namespace, uid, resourceVersion}, fingerprint}``);
*compact record*: ``bridge.ground.records.make_record`` (what the informer
caches now).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import xxhash

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md

MODES = {
    "dict": "dict record (before)",
    "compact": "compact record (now)",
}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _values(i: int) -> tuple[str, str, str, str, str]:
    ns = f"team-{i % 200:03d}"
    name = f"web-{i:07d}-{i * 2654435761 % 100000:05d}"
    uid = str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15_9E3779B97F4A7C15) % 2**128, version=4))
    rv = str(10_000_000 + i)
    fp = xxhash.xxh3_128_hexdigest(name.encode())
    return ns, name, uid, rv, fp


def _dict_record(ns: str, name: str, uid: str, rv: str, fp: str) -> dict[str, Any]:
    # The slim record as the informer kept it before compact records.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": rv},
        "fingerprint": fp,
    }


def child(mode: str, objects: int, trace: bool) -> dict[str, float]:
    from bridge.ground.records import make_record
    from bridge.kube.store import Indexer

    store = Indexer()
    # The inputs are made in chunks and dropped, so only the cache stays.
    gc.collect()
    rss0 = _rss()
    tracked0 = len(gc.get_objects())
    if trace:
        # tracemalloc's own bookkeeping inflates RSS: a traced run reports only the trace.
        tracemalloc.start()
    t0 = time.perf_counter()
    chunk = 10_000
    for start in range(0, objects, chunk):
        values = [_values(i) for i in range(start, min(objects, start + chunk))]
        if mode == "dict":
            for ns, name, uid, rv, fp in values:
                store.add(_dict_record(ns, name, uid, rv, fp))
        else:
            for ns, name, uid, rv, fp in values:
                store.add(make_record(f"{ns}/{name}", uid, rv, fp))
        del values
    elapsed = time.perf_counter() - t0
    gc.collect()
    assert len(store) == objects
    if trace:
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"traced_per_object": traced / objects}
    return {
        "rss_per_object": (_rss() - rss0) / objects,
        "gc_tracked_per_object": max(0, len(gc.get_objects()) - tracked0) / objects,
        "seconds": elapsed,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench records", description=__doc__)
    p.add_argument("--objects", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["dict", "compact"])
    p.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    p.add_argument("--child", nargs=3, metavar=("MODE", "N", "TRACE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2] == "1")))
        return 0

    rows: list[tuple[str, int, dict[str, float]]] = []
    for n in args.objects:
        for mode in args.modes:
            result: dict[str, float] = {}
            for trace in ("0", "1"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench", "records", "--child", mode, str(n), trace],
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, "PYTHONHASHSEED": "0"},
                ).stdout
                result.update(json.loads(out.strip().splitlines()[-1]))
            rows.append((mode, n, result))
            print(
                f"{MODES[mode]:>22} {n:>9,}: {result['traced_per_object']:7.0f} B traced,"
                f" {result['rss_per_object']:7.0f} B RSS per object,"
                f" {result['gc_tracked_per_object']:.2f} GC-tracked objects per object,"
                f" {result['seconds']:.2f} s to fill"
            )
    if args.write:
        lines = [
            f"`python -m bench records --objects {' '.join(map(str, args.objects))}"
            " --write` — the slim informer's cache (`Indexer`, keyed only)"
            " holding N Pods' records, each row in a fresh subprocess; bytes per object"
            " that stay after the fill: allocated as tracemalloc counts them, and the RSS"
            " growth after a GC. Keys like `team-042/web-0001234-7c9b6`, uuid4 uids,"
            " resourceVersions from 10,000,000 on, xxh3-128 fingerprints.",
            "",
            "| record | objects | traced per object | RSS per object"
            " | GC-tracked objects per object | seconds to fill |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for mode, n, r in rows:
            lines.append(
                f"| {MODES[mode]} | {n:,} | {r['traced_per_object']:,.0f} B"
                f" | {r['rss_per_object']:,.0f} B | {r['gc_tracked_per_object']:.2f}"
                f" | {r['seconds']:.2f} |"
            )
        lines += [
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {cpu_model()}, 2 cores,"
            f" Python {platform.python_version()}.",
        ]
        update_benchmarks_md(BENCHMARKS_MD, "Cache records", "\n".join(lines))
    return 0
