"""Exactly-once on Kafka: what a transaction per batch costs, beside the plain producer.

    python -m bench transactions [--events N] [--batch B] [--samples S] [--no-write]

Apache Kafka (the broker the real-server tests run, one node, from the realdeps
cache) is started here. The same N ~2.5 KB Pod events are published:

  ceiling        record batches built as the sink builds them, all handed to
                 the producer at once and awaited at the end (acks=all,
                 idempotent; topics of one partition): the producer alone;
  plain          ``KafkaSink.publish`` in batches of B, each awaited (what the
                 bridge does at-least-once);
  exactly-once   ``TransactionalChannel.publish`` in batches of B, each with
                 the B checkpoint records that cover it, in one transaction
                 (what ``sink.kafka.exactlyOnce`` does).

Then latency: S batches of one event at a steady 20 batches/s, each published
plain and transactional in turn; p50/p99 from the call to its return (the ack,
or the transaction's commit). Prints events/s, ratios to the ceiling, and writes
the "Exactly-once" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod
from bridge.checkpoints.kafka import commit_records
from bridge.ground.digest import Digest
from bridge.ground.envelope import Event
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.kafka_transactions import KafkaTransactions

SECTION = "Exactly-once"
RID = "core/v1/pods"


def events_of(n: int) -> list[Event]:
    out = []
    for i in range(n):
        pod = make_pod(i)
        md = pod["metadata"]
        out.append(
            Event(
                id=f"{md['uid']}:{md['resourceVersion']}",
                type="io.k8s.core.v1.Pod.modified",
                source="k8s://bench/v1/pods",
                subject=f"{md['namespace']}/{md['name']}",
                time="2026-01-01T00:00:00Z",
                resource_version=md["resourceVersion"],
                initial=False,
                data={"object": pod},
            )
        )
    return out


def rows_of(events: list[Event]) -> list[tuple[bytes, bytes | None]]:
    digests = [Digest(e.subject, e.id.split(":")[0], e.resource_version, "f" * 32) for e in events]
    return commit_records(RID, None, digests, [])


async def ceiling(bootstrap: str, topic: str, events: list[Event]) -> float:
    """Record batches built as the sink builds them and handed over all at once,
    awaited only at the end: the producer and the broker alone."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, max_batch_size=65_536
    )
    await producer.start()
    try:
        # The topic made and its metadata known before the clock starts, as for the others.
        first = events[0]
        await (await producer.send(topic, first.to_json(), key=first.key, headers=first.headers))
        started = time.perf_counter()
        futures = []
        builder = producer.create_batch()
        for e in events:
            if (
                builder.append(timestamp=None, key=e.key, value=e.to_json(), headers=e.headers)
                is None
            ):
                futures.append(await producer.send_batch(builder, topic, partition=0))
                builder = producer.create_batch()
                builder.append(timestamp=None, key=e.key, value=e.to_json(), headers=e.headers)
        futures.append(await producer.send_batch(builder, topic, partition=0))
        await asyncio.gather(*futures)
        return len(events) / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def batches(
    bootstrap: str, topic: str, events: list[Event], batch: int, *, transactional: bool
) -> float:
    sink = KafkaSink([bootstrap], topic=topic)
    await sink.start()
    transactions = KafkaTransactions(
        sink, prefix=f"bench-{uuid.uuid4().hex[:6]}", checkpoint_topic=f"{topic}-cp"
    )
    sink.transactions = transactions
    channel = transactions.channel(RID)
    try:
        if transactional:
            await channel.start()
            # The first transaction pays for the partitions' metadata: warm it up.
            await channel.publish(events[:1], lambda _: rows_of(events[:1]))
        else:
            await sink.publish(events[:1])
        started = time.perf_counter()
        for i in range(0, len(events), batch):
            chunk = events[i : i + batch]
            if transactional:
                await channel.publish(chunk, lambda _, c=chunk: rows_of(c))  # type: ignore[misc]
            else:
                await sink.publish(chunk)
        return len(events) / (time.perf_counter() - started)
    finally:
        await sink.close()


async def latencies(
    bootstrap: str, topic: str, events: list[Event], samples: int
) -> dict[str, list[float]]:
    sink = KafkaSink([bootstrap], topic=topic)
    await sink.start()
    transactions = KafkaTransactions(
        sink, prefix=f"bench-{uuid.uuid4().hex[:6]}", checkpoint_topic=f"{topic}-cp"
    )
    sink.transactions = transactions
    channel = transactions.channel(RID)
    out: dict[str, list[float]] = {"plain": [], "exactly-once": []}
    try:
        await channel.start()
        await channel.publish(events[:1], lambda _: rows_of(events[:1]))
        await sink.publish(events[:1])
        for i in range(samples):
            e = [events[i % len(events)]]
            t = time.perf_counter()
            await sink.publish(e)
            out["plain"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await channel.publish(e, lambda _, e=e: rows_of(e))  # type: ignore[misc]
            out["exactly-once"].append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
    finally:
        await sink.close()
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def measure(args: argparse.Namespace) -> str:
    from tests.fixtures.realkafka import KafkaBroker

    events = events_of(args.events)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        broker = KafkaBroker(Path(tmp))
        broker.start()
        try:
            rates: dict[str, list[float]] = {"ceiling": [], "plain": [], "exactly-once": []}
            for r in range(args.rounds):
                tag = uuid.uuid4().hex[:6]
                rates["ceiling"].append(await ceiling(broker.bootstrap, f"c-{tag}", events))
                rates["plain"].append(
                    await batches(
                        broker.bootstrap, f"p-{tag}", events, args.batch, transactional=False
                    )
                )
                rates["exactly-once"].append(
                    await batches(
                        broker.bootstrap, f"t-{tag}", events, args.batch, transactional=True
                    )
                )
                print(
                    f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items())
                )
            lat = await latencies(
                broker.bootstrap, f"l-{uuid.uuid4().hex[:6]}", events, args.samples
            )
        finally:
            broker.stop()
    ceil = statistics.median(rates["ceiling"])
    lines = [
        f"`python -m bench transactions --events {args.events} --batch {args.batch}`"
        f" ({args.rounds} rounds, medians; Apache Kafka 4.4.0, one local broker;"
        f" {cpu_model()}, Python {platform.python_version()}).",
        "",
        "| publisher | events/s | ratio to ceiling |",
        "| --- | --- | --- |",
    ]
    for name in ("ceiling", "plain", "exactly-once"):
        rate = statistics.median(rates[name])
        lines.append(f"| {name} | {rate:,.0f} | {rate / ceil:.2f} |")
    lines += [
        "",
        f"Latency of one-event batches at 20/s ({args.samples} samples each, alternating):",
        "",
        "| publisher | p50 ms | p99 ms |",
        "| --- | --- | --- |",
    ]
    for name, values in lat.items():
        lines.append(f"| {name} | {pct(values, 0.5):.1f} | {pct(values, 0.99):.1f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench transactions")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    body = asyncio.run(measure(args))
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
