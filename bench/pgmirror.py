"""``k8s-bridge mirror`` into PostgreSQL: changes/s with batching, against a raw COPY.

    python -m bench pgmirror [--objects N] [--changes C] [--batch B] [--rounds R] [--no-write]

A PostgreSQL server is started here (Debian's package, bench/_postgres.py),
durable: fsync on, synchronous commits, as in production. The workload is C
change events of N ~2.5 KB Pods, as the bridge publishes them (CloudEvents
bytes): N ``added``, then modifications of random objects with rising
resourceVersions, and one in twenty a delete followed by a re-create under
the same name (a new uid). Each round, in a fresh database:

  mirror          ``DatabaseMirror`` (decode, a batch's winners, binary COPY into the
                  staging table, the upserts with newer-wins, the positions in
                  the same transaction) in batches of B, read from memory, so
                  the figure is the mirror's own and the database's;
  mirror+history  the same with ``history: true`` (every change also in
                  ``changes``);
  raw COPY        the same rows, already decoded, ``COPY``'d in batches of B
                  into a table with the columns of ``objects`` and no index or
                  key, one transaction each: what the database takes at most.

Prints changes/s (medians of R rounds) and the ratios, and writes the
"Mirror into PostgreSQL" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import asyncpg
import orjson

from bench._postgres import PostgresServer
from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod
from bridge.mirror.rows import decode
from bridge.mirror.runner import DatabaseMirror
from bridge.mirror.sources import Message
from bridge.mirror.store import PostgresStore

SECTION = "Mirror into PostgreSQL"


def workload(objects: int, changes: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    pods = [make_pod(i) for i in range(objects)]
    rv = 10_000
    out: list[bytes] = []

    def emit(pod: dict[str, object], change: str) -> None:
        nonlocal rv
        rv += 1
        md = pod["metadata"]
        assert isinstance(md, dict)
        md["resourceVersion"] = str(rv)
        suffix = "deleted" if change == "deleted" else str(rv)
        out.append(
            orjson.dumps(
                {
                    "specversion": "1.0",
                    "id": f"{md['uid']}:{suffix}",
                    "type": f"io.k8s.core.v1.Pod.{change}",
                    "source": "k8s://bench/v1/pods",
                    "subject": f"{md['namespace']}/{md['name']}",
                    "time": "2026-11-27T10:00:00.000000Z",
                    "datacontenttype": "application/json",
                    "resourceversion": str(rv),
                    "initial": False,
                    "data": {"object": pod},
                }
            )
        )

    for pod in pods:
        emit(pod, "added")
    generation = 0
    while len(out) < changes:
        i = rng.randrange(objects)
        pod = pods[i]
        md = pod["metadata"]
        assert isinstance(md, dict)
        if rng.random() < 0.05:
            emit(pod, "deleted")
            generation += 1
            md["uid"] = f"{md['uid'][:-12]}{generation:012x}"  # same name, new uid
            emit(pod, "added")
        else:
            md["annotations"] = {"n": str(rng.random())}
            emit(pod, "modified")
    return out[:changes]


class ListSource:
    """The events in memory, read from given positions (a bus without the network)."""

    def __init__(self, values: list[bytes]) -> None:
        self.identity = "bench:events"
        self.values = values
        self.next = 0

    async def seek(self, positions: Mapping[int, int]) -> None:
        self.next = positions.get(0, 0)

    async def fetch(self, max_messages: int, wait: float) -> list[Message]:
        start, end = self.next, min(len(self.values), self.next + max_messages)
        self.next = end
        if start == end:
            await asyncio.sleep(0.001)
        return [Message(0, p, self.values[p]) for p in range(start, end)]

    async def close(self) -> None:
        pass


async def run_mirror(dsn: str, values: list[bytes], batch: int, history: bool) -> float:
    source = ListSource(values)
    store = PostgresStore(dsn, "k8s", history=history, keep_deleted=False, tombstone_retention=3600)
    stop = asyncio.Event()
    mirror = DatabaseMirror(source, store, max_events=batch, max_wait=0, prune_every=1e9)
    # Schema creation is not part of the measure: open once before.
    await store.open()
    await store.close()
    done = asyncio.Event()

    def on_batch(_: object) -> None:
        if mirror.stats.changes >= len(values):
            done.set()

    mirror.on_batch = on_batch
    started = time.perf_counter()
    task = asyncio.create_task(mirror.run(stop))
    await done.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    return len(values) / elapsed


async def run_copy(dsn: str, values: list[bytes], batch: int) -> float:
    records = []
    for p, v in enumerate(values):
        c = decode(v, 0, p)
        assert c is not None
        records.append(
            (c.cluster, c.uid, c.api_version, c.kind, c.namespace, c.name, c.resource_version,
             c.labels, c.object, c.observed_at, c.observed_at, c.event_id)
        )  # fmt: skip
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE TABLE raw_objects (cluster text, uid text, api_version text, kind text,
               namespace text, name text, resource_version bigint, labels jsonb,
               object jsonb, first_seen timestamptz, last_changed timestamptz,
               event_id text)"""
        )
        started = time.perf_counter()
        for i in range(0, len(records), batch):
            async with conn.transaction():
                await conn.copy_records_to_table("raw_objects", records=records[i : i + batch])
        return len(values) / (time.perf_counter() - started)
    finally:
        await conn.close()


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    values = workload(args.objects, args.changes)
    size = statistics.mean(len(v) for v in values)
    print(f"  {len(values)} events of {args.objects} objects, {size:.0f} bytes each on average")
    results: dict[str, list[float]] = {"mirror": [], "mirror+history": [], "raw COPY": []}
    workdir = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    server = PostgresServer(workdir, durable=True)
    server.start()
    try:
        for r in range(args.rounds):
            for name in results:
                dsn = server.new_database()
                if name == "raw COPY":
                    rate = await run_copy(dsn, values, args.batch)
                else:
                    rate = await run_mirror(dsn, values, args.batch, name == "mirror+history")
                results[name].append(rate)
                print(f"  round {r + 1} {name:15} {rate:9,.0f} changes/s")
    finally:
        server.stop("fast")
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pgmirror")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    results = asyncio.run(measure(args))
    medians = {k: statistics.median(v) for k, v in results.items()}
    ceiling = medians["raw COPY"]
    rows = "\n".join(
        f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} |" for name, rate in medians.items()
    )
    body = (
        f"`python -m bench pgmirror --objects {args.objects} --changes {args.changes}"
        f" --batch {args.batch}` ({args.rounds} rounds, medians; PostgreSQL from Debian's"
        f" package, fsync on; {cpu_model()}, Python {platform.python_version()}).\n\n"
        "| writer | changes/s | ratio to raw COPY |\n| --- | --- | --- |\n" + rows
    )
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
