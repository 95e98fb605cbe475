"""Synced write-ahead: what one fsync per write-ahead batch costs the SQLite checkpoint.

    python -m bench walsync [--batches 200] [--rounds 5] [--dir DIR] [--no-write]

The SQLite store writes the rows of a batch ahead before the batch is sent, so
its commit is on the path of every event. With ``checkpoint.syncWriteAhead``
(the default) that commit runs at ``synchronous=FULL`` and returns once the WAL
is fsynced; off, at ``NORMAL`` (no fsync). Timed per commit, median of
``--batches`` commits, for batches of 1 row (a trickle: each event its own
batch) and 500 rows (``sink.maxBatch``, a burst), the two settings alternating
round by round in the same directory's filesystem. The ceiling is the unsynced
commit of the same run; the disk's own ``write`` + ``fdatasync`` of 4 KiB is
shown beside it, the floor of any synced write there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.ground.digest import UNCERTAIN, Digest

SIZES = (1, 500)


async def commit_ms(directory: Path, synced: bool, rows: int, batches: int) -> float:
    """Median milliseconds of one write-ahead commit of ``rows`` rows."""
    with tempfile.TemporaryDirectory(prefix="bench-walsync-", dir=directory) as tmp:
        store = SqliteCheckpointStore(Path(tmp) / "cp.db", sync_write_ahead=synced)
        await store.open()
        times = []
        try:
            for b in range(batches):
                batch = [
                    Digest(f"team-{b % 97:03d}/pod-{b}-{r}", f"{b:08d}-{r:027d}", str(b), "f" * 32)
                    for r in range(rows)
                ]
                batch = [replace(d, state=UNCERTAIN) for d in batch]
                t0 = time.perf_counter()
                await store.commit("v1/pods", None, batch, ())
                times.append(time.perf_counter() - t0)
        finally:
            await store.close()
    return statistics.median(times) * 1000


def fdatasync_ms(directory: Path, n: int) -> float:
    """Median milliseconds of a 4 KiB write + fdatasync: the disk's floor."""
    fd, path = tempfile.mkstemp(prefix="bench-walsync-", dir=directory)
    try:
        block, times = os.urandom(4096), []
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000
    finally:
        os.close(fd)
        os.unlink(path)


async def measure(args: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    directory = Path(args.dir)
    results: dict[int, dict[str, list[float]]] = {
        rows: {"synced": [], "unsynced": [], "ratio": []} for rows in SIZES
    }
    for r in range(args.rounds):
        for rows in SIZES:
            # Alternate which goes first, so drift in the machine's load falls on both.
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {s: await commit_ms(directory, s, rows, args.batches) for s in order}
            res = results[rows]
            res["synced"].append(got[True])
            res["unsynced"].append(got[False])
            res["ratio"].append(got[True] / got[False])
            print(
                f"round {r + 1} rows {rows:3d}: synced {got[True]:.3f} ms, unsynced "
                f"{got[False]:.3f} ms, ratio {got[True] / got[False]:.2f}",
                flush=True,
            )
    return results


def render(
    results: dict[int, dict[str, list[float]]], floor: float, args: argparse.Namespace
) -> str:
    doc = " ".join((__doc__ or "").split("\n\n", 2)[2].split())
    rows = [
        f"`python -m bench walsync --batches {args.batches} --rounds {args.rounds}` — {doc}",
        "",
        "| rows per batch | synced ms, median of rounds | unsynced ms (ceiling) | synced / unsynced, median (rounds) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for n, res in results.items():
        ratios = ", ".join(f"{x:.2f}" for x in sorted(res["ratio"]))
        rows.append(
            f"| {n} | {statistics.median(res['synced']):.3f} | "
            f"{statistics.median(res['unsynced']):.3f} | "
            f"{statistics.median(res['ratio']):.2f} ({ratios}) |"
        )
    rows += [
        "",
        f"The disk's 4 KiB write + fdatasync: {floor:.3f} ms (median). Machine: {cpu_model()}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}.",
    ]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench walsync", description=__doc__)
    parser.add_argument("--batches", type=int, default=200, help="commits timed per case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args))
    floor = fdatasync_ms(Path(args.dir), args.batches)
    text = render(results, floor, args)
    print(text)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, "Synced write-ahead", text)
    return 0
