"""Memory and speed of a first list at scale: does memory grow with one LIST response?

The emulator runs in its own process (its memory is not counted) holding N
Pods of ~2.8 KB. Each measurement is a fresh subprocess that imports the
bridge, notes its RSS (the interpreter and imports: the baseline), then runs
only the client side of a first list until it is synced, and reports its
peak RSS above that baseline, and the RSS left after a GC. The peak is
``VmHWM``, not ``ru_maxrss``: on Linux a child's ``ru_maxrss`` starts at its
parent's peak (it survives fork and exec), here the benchmark's own.

  list modes  LIST ``resourceVersion=0`` (served whole, as the watch cache
              does) and the streaming list (``sendInitialEvents=true``)
  stores      *no-op*: Reflector → RealFIFO → a consumer that drops each item,
              so the peak is the list-decoding path alone; *slim*: the
              SharedInformer in slim mode (what the bridge runs, less the sink)

Speed is items/s from the start to synced, against a parse-only ceiling
measured in the same run: ``orjson.loads`` of the same item bytes, one by one.
``--before REV`` also runs the same subprocesses against ``bridge/`` as it
was at commit REV, for the before/after comparison.

Writes the "List memory" section of BENCHMARKS.md (``--no-write`` to skip).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md

SECTION = "List memory"
MODES = ("list", "stream")
STORES = ("read", "noop", "slim")
MODE_NAMES = {
    "list": "LIST `resourceVersion=0` (one body)",
    "stream": "streaming list (`sendInitialEvents`)",
}
STORE_NAMES = {
    "read": "body read only, not decoded",
    "noop": "no-op consumer",
    "slim": "informer, slim cache",
}


# -- the emulator (own process) ------------------------------------------------------


def _serve_emulator(n: int, ready: Any) -> None:
    import gc

    from bench.decode import make_pod
    from bridge.emulator import Emulator

    async def serve() -> None:
        emu = Emulator(bookmark_interval=60.0)
        pods = emu.registry.by_kind("v1", "Pod")
        assert pods is not None
        for i in range(n):
            body = make_pod(i)
            emu.store.create(pods, body["metadata"]["namespace"], body)
        emu.chaos.compact()  # the creation history is not needed: the lists read the state
        gc.collect()
        gc.freeze()
        await emu.start()
        sample = emu.list("v1", "Pod")[:100]
        size = sum(
            len(orjson.dumps({k: v for k, v in p.items() if k not in ("kind", "apiVersion")}))
            for p in sample
        )
        ready.put((emu.url, size // max(1, len(sample))))
        await asyncio.Event().wait()

    asyncio.run(serve())


# -- one measurement (own process) ---------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    # ru_maxrss survives fork and exec on Linux (a child starts with its parent's
    # peak), so the peak is read as VmHWM, restarted here from the current RSS.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _child(kubeconfig: str, mode: str, store: str, n: int, bridge_path: str | None) -> None:
    if bridge_path:
        sys.path.insert(0, bridge_path)
    import gc

    from bridge.delivery.changes import Fingerprinter
    from bridge.kube.client import KubeClient
    from bridge.kube.discovery import ResourceInfo
    from bridge.kube.fifo import FIFOClosedError, RealFIFO
    from bridge.kube.informer import SharedInformer
    from bridge.kube.listwatch import ListWatch
    from bridge.kube.reflector import Reflector, ReflectorSettings
    from bridge.logging import configure_logging

    class _Unheard:
        """A handler that does nothing: what is measured is the cache alone."""

        async def on_add(self, obj: Any, is_in_initial_list: bool) -> None:
            pass

        async def on_update(self, old: Any, new: Any) -> None:
            pass

        async def on_delete(self, obj: Any) -> None:
            pass

    configure_logging("json", "warning")
    gc.collect()
    _reset_peak()
    baseline = _status_kb("VmHWM")
    pods = ResourceInfo("", "v1", "Pod", "pods", True, ("list", "watch"))
    settings = ReflectorSettings(watch_list="off" if mode == "list" else "on")

    async def run() -> dict[str, Any]:
        client = await KubeClient.from_kubeconfig(kubeconfig)
        lw = ListWatch(client, pods)
        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()
        if store == "read":
            count = n if await _read_only(client, mode) else 0
        elif store == "slim":
            informer = SharedInformer(
                lw,
                _Unheard(),
                name="pods",
                slim=Fingerprinter().fingerprint,
                reflector_settings=settings,
            )
            tasks.append(asyncio.create_task(informer.run()))
            await informer.wait_for_sync()
            count = len(informer.store)
        else:
            fifo = RealFIFO()
            dropped = 0

            async def drop(deltas: list[Any], initial: bool) -> None:
                nonlocal dropped
                dropped += len(deltas)

            async def consume() -> None:
                try:
                    while True:
                        await fifo.pop(drop)
                except FIFOClosedError:
                    pass

            tasks.append(asyncio.create_task(Reflector(lw, fifo, settings=settings).run()))
            tasks.append(asyncio.create_task(consume()))
            await fifo.wait_for_sync()
            count = dropped
        elapsed = time.perf_counter() - t0
        peak = _status_kb("VmHWM")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gc.collect()
        after = _status_kb("VmRSS")
        await client.close()
        return {"count": count, "seconds": elapsed, "peak_kb": peak, "after_kb": after}

    result = asyncio.run(run())
    result["baseline_kb"] = baseline
    print(json.dumps(result), flush=True)


async def _read_only(client: Any, mode: str) -> bool:
    """The body's bytes read and dropped: what the emulator and the socket allow."""
    path = "/api/v1/pods"
    if mode == "list":
        async with client.stream_body("GET", path, {"resourceVersion": "0"}) as chunks:
            async for _ in chunks:
                pass
        return True
    params = {
        "watch": 1,
        "sendInitialEvents": True,
        "allowWatchBookmarks": True,
        "resourceVersionMatch": "NotOlderThan",
        "resourceVersion": "",
    }
    async with client.stream(path=path, method="GET", params=params) as lines:
        async for line in lines:
            if b'"k8s.io/initial-events-end"' in line[:300]:
                return True
    return False


def _measure(
    kubeconfig: str, mode: str, store: str, n: int, bridge_path: str | None
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.listmem", "--child", kubeconfig, mode, store, str(n)]
    if bridge_path:
        cmd += ["--bridge-path", bridge_path]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["count"] != n:
        raise RuntimeError(f"{mode}/{store}: synced {result['count']} objects, expected {n}")
    return result


# -- the ceiling -----------------------------------------------------------------------


def _ceiling(url: str, rounds: int) -> tuple[float, int]:
    """orjson.loads of each item's bytes, as the emulator sent them: items/s, best of rounds."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/pods?resourceVersion=0") as resp:
        body = resp.read()
    items = [orjson.dumps(i) for i in orjson.loads(body)["items"]]
    del body
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for raw in items:
            orjson.loads(raw)
        best = max(best, len(items) / (time.perf_counter() - t0))
    return best, sum(len(i) for i in items) // max(1, len(items))


# -- running and reporting ---------------------------------------------------------------


@dataclass
class Row:
    label: str
    objects: int
    mode: str
    store: str
    ceiling: float
    peak_kb: list[int] = field(default_factory=list)
    after_kb: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)


def _export(rev: str, into: Path) -> Path:
    repo = Path(__file__).parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "bridge"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(args: argparse.Namespace) -> tuple[list[Row], float, int]:
    rows: list[Row] = []
    ceiling, item_bytes = 0.0, 0
    with tempfile.TemporaryDirectory(prefix="bench-listmem-") as tmp:
        variants: list[tuple[str, str | None]] = [("after", None)]
        if args.before:
            old = _export(args.before, Path(tmp))
            variants.insert(0, (f"before ({args.before})", str(old)))
        for n in args.objects:
            c, item_bytes = _run_size(n, variants, Path(tmp), args, rows)
            ceiling = max(ceiling, c)
    return rows, ceiling, item_bytes


def _run_size(
    n: int,
    variants: list[tuple[str, str | None]],
    tmp: Path,
    args: argparse.Namespace,
    rows: list[Row],
) -> tuple[float, int]:
    from bridge.emulator import write_kubeconfig

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    emulator = ctx.Process(target=_serve_emulator, args=(n, ready), daemon=True)
    t0 = time.perf_counter()
    emulator.start()
    try:
        url, size = ready.get(timeout=1800)
        print(f"{n:,} Pods of ~{size} bytes in the emulator ({time.perf_counter() - t0:.0f}s)")
        kubeconfig = str(write_kubeconfig(tmp / f"kubeconfig-{n}", url))
        ceiling, item_bytes = _ceiling(url, args.rounds)
        print(f"  ceiling: orjson.loads per item {ceiling:,.0f} items/s ({item_bytes} bytes/item)")
        for label, path in variants:
            for mode in args.modes:
                for store in args.stores:
                    if store == "read" and path is not None:
                        continue  # the transport is the same whatever the bridge
                    row = Row(label, n, mode, store, ceiling)
                    for _ in range(args.rounds):
                        r = _measure(kubeconfig, mode, store, n, path)
                        row.peak_kb.append(r["peak_kb"] - r["baseline_kb"])
                        row.after_kb.append(r["after_kb"] - r["baseline_kb"])
                        row.rate.append(r["count"] / r["seconds"])
                    rows.append(row)
                    print(
                        f"  {label:18s} {mode:6s} {store:5s}"
                        f"  peak +{min(row.peak_kb) / 1024:7.1f} MiB"
                        f" ({min(row.peak_kb) * 1024 / n:6.0f} B/obj)"
                        f"  after +{min(row.after_kb) / 1024:7.1f} MiB"
                        f"  {max(row.rate):9,.0f} items/s ({max(row.rate) / ceiling:.2f})"
                    )
        return ceiling, item_bytes
    finally:
        emulator.terminate()
        emulator.join(10)


def render(rows: list[Row], ceiling: float, item_bytes: int, args: argparse.Namespace) -> str:
    sizes = " ".join(str(n) for n in args.objects)
    cmd = f"python -m bench listmem --objects {sizes} --rounds {args.rounds}"
    if args.before:
        cmd += f" --before {args.before}"
    biggest = max(args.objects)
    lines = [
        f"`{cmd}` — Pods of ~{item_bytes:,} bytes of JSON each",
        f"(~{biggest * item_bytes / 2**20:,.0f} MiB per list of {biggest:,}) in the emulator, in its own",
        "process. Each row is a fresh subprocess running only the client side of a first",
        "list until synced: its peak RSS above its RSS after the imports (`VmHWM`, reset",
        "after the imports: a child's `ru_maxrss` starts at its parent's peak), the RSS",
        "left after a GC once synced, and items/s from start to synced. *Body read only*:",
        "the bytes read and dropped (what the emulator and loopback allow); *no-op",
        "consumer*: Reflector → RealFIFO → a consumer dropping each item (the list",
        "decoding path alone); *informer, slim cache*: the SharedInformer in slim mode",
        "(what the bridge runs, less the sink). Ceiling: `orjson.loads` of each item's",
        "bytes one by one, in the same run against the same emulator",
        f"({ceiling:,.0f} items/s at best). Best of {args.rounds} round(s) per row (lowest",
        "memory, highest speed).",
        "",
        "| code | objects | list mode | store | peak RSS above baseline | per object | RSS after sync, per object | items/s | vs ceiling |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        n = row.objects
        peak, after, rate = min(row.peak_kb), min(row.after_kb), max(row.rate)
        lines.append(
            f"| {row.label} | {n:,} | {MODE_NAMES[row.mode]} | {STORE_NAMES[row.store]} "
            f"| {peak / 1024:,.0f} MiB | {peak * 1024 / n:,.0f} B "
            f"| {max(0, after) * 1024 / n:,.0f} B | {rate:,.0f} | {rate / row.ceiling:.2f} |"
        )
    summary = _summary(rows)
    if summary:
        lines += ["", *summary]
    lines += ["", _machine()]
    return "\n".join(lines)


def _summary(rows: list[Row]) -> list[str]:
    """The figures the table is about, in words."""

    def find(label: str, n: int, mode: str, store: str) -> Row | None:
        for r in rows:
            if r.label.startswith(label) and (r.objects, r.mode, r.store) == (n, mode, store):
                return r
        return None

    out: list[str] = []
    sizes = sorted({r.objects for r in rows})
    n = sizes[-1]
    for mode in MODES:
        for store in ("noop", "slim"):
            before, after = find("before", n, mode, store), find("after", n, mode, store)
            if before and after:
                b, a = min(before.peak_kb) * 1024 / n, min(after.peak_kb) * 1024 / n
                out.append(
                    f"- {MODE_NAMES[mode]}, {STORE_NAMES[store]}, {n:,} objects: peak "
                    f"{b:,.0f} → {a:,.0f} B per object ({b / a:,.0f}x less); "
                    f"{max(before.rate):,.0f} → {max(after.rate):,.0f} items/s."
                )
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for mode in MODES:
            small, big = find("after", lo, mode, "noop"), find("after", hi, mode, "noop")
            if small and big:
                growth = (min(big.peak_kb) - min(small.peak_kb)) * 1024 / (hi - lo)
                out.append(
                    f"- {MODE_NAMES[mode]}, no-op consumer: the peak grows by {growth:,.0f} B per"
                    f" object from {lo:,} to {hi:,} objects: mostly the set of listed keys a Replace"
                    " needs for its tombstones (client-go keeps the same), not the body, of which"
                    " one read and one unfinished item are held."
                )
    for mode in MODES:
        read, noop = find("after", n, mode, "read"), find("after", n, mode, "noop")
        if read and noop:
            out.append(
                f"- {MODE_NAMES[mode]}: the no-op path runs at "
                f"{max(noop.rate) / max(read.rate):.2f} of the body-read-only rate, which is"
                " what the emulator serves on this box; the slim informer's own work per"
                " object (slim record, fingerprint, cache) takes the rest."
            )
    return out


def _machine() -> str:
    from importlib.metadata import version

    return (
        f"Machine: {cpu_model()}, {os.cpu_count()} cores shared with other work while measuring,\n"
        f"Python {platform.python_version()}, orjson {orjson.__version__}, "
        f"aiohttp {version('aiohttp')}, {platform.system()} {platform.release()}."
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        p = argparse.ArgumentParser(prog="python -m bench.listmem --child")
        p.add_argument("kubeconfig")
        p.add_argument("mode", choices=MODES)
        p.add_argument("store", choices=STORES)
        p.add_argument("objects", type=int)
        p.add_argument("--bridge-path")
        a = p.parse_args(argv[1:])
        _child(a.kubeconfig, a.mode, a.store, a.objects, a.bridge_path)
        return 0
    p = argparse.ArgumentParser(prog="python -m bench listmem", description=__doc__)
    p.add_argument(
        "--objects", type=int, nargs="+", default=[100_000], help="Pods in the emulator (sizes)"
    )
    p.add_argument("--rounds", type=int, default=1, help="subprocesses per row (best is kept)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES))
    p.add_argument("--before", metavar="REV", help="also measure bridge/ as at this commit")
    p.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args, _ = p.parse_known_args(argv)
    rows, ceiling, item_bytes = run(args)
    body = render(rows, ceiling, item_bytes, args)
    print()
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
