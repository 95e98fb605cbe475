"""What the Kafka tests of the real tier share: a bridge config for Pods in one
namespace of the real API server, its committed watermark, and a topic read to
its end (the broker's end offsets, not an idle wait)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.doubles.contract import assert_valid
from tests.e2e.bridge_process import BridgeProcess, write_config
from tests.fixtures.kube import KubeCluster

Body = dict[str, Any]


def pod(name: str, ns: str, **labels: str) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web", **labels}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


class PodBridge:
    """One bridge's config and SQLite checkpoint for Pods in ``ns``, publishing to Kafka."""

    def __init__(
        self,
        tmp_path: Path,
        cluster: KubeCluster,
        ns: str,
        kafka: Body,
        *,
        name: str = "bridge.yaml",
        **resource: Any,
    ) -> None:
        self.db = tmp_path / "state.db"
        self.resource_id = f"core/v1/pods@{ns}"
        self.config = write_config(
            tmp_path / name,
            kubeconfig=cluster.write_kubeconfig(tmp_path / "kubeconfig"),
            sink={"kind": "kafka", "kafka": kafka},
            resources=[{"apiVersion": "v1", "kind": "Pod", "namespaces": [ns], **resource}],
            checkpoint={"kind": "sqlite", "path": str(self.db), "commitInterval": 0.1},
        )

    def watermark(self, *, settled: bool = True) -> int:
        return watermark(self.db, self.resource_id, settled=settled)


def watermark(db: Path, resource_id: str, *, settled: bool = True) -> int:
    """The committed watermark of ``resource_id`` (0 before the first commit); with
    ``settled``, 0 also while a digest written ahead is not yet acknowledged."""
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        row = con.execute(
            "select resource_version from watermarks where resource_id = ?", (resource_id,)
        ).fetchone()
        pending = con.execute(
            "select count(*) from digests where resource_id = ? and state != ''", (resource_id,)
        ).fetchone()[0]
    except sqlite3.OperationalError:  # the tables are not there yet
        return 0
    finally:
        con.close()
    if settled and pending:
        return 0
    return int(row[0]) if row and row[0] else 0


async def read_topic(
    bootstrap: str, topic: str, *, isolation_level: str = "read_uncommitted"
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` up to the broker's end offsets at the time of the call
    (under ``read_committed``, up to the last stable offset, aborted records left out)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described["error_code"]:  # no such topic: nothing on it
        return []
    parts = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        records: list[ConsumerRecord[bytes, bytes]] = []
        for tp in parts:
            while await consumer.position(tp) < end[tp]:
                for recs in (await consumer.getmany(tp, timeout_ms=500)).values():
                    records.extend(recs)
        return records
    finally:
        await consumer.stop()


def decoded(records: list[ConsumerRecord[bytes, bytes]]) -> list[Body]:
    out = []
    for r in records:
        assert r.value is not None, r
        event = orjson.loads(r.value)
        assert_valid(event)  # every scenario's events keep to the published schema
        out.append(event)
    return out


@contextlib.asynccontextmanager
async def running(bridge: BridgeProcess) -> AsyncIterator[BridgeProcess]:
    """``bridge`` started; stopped with SIGTERM (exit 0 asserted) when the block
    ends, killed when it fails (so the failure shows, not the stop's)."""
    await bridge.start()
    try:
        yield bridge
    except BaseException:
        if bridge.proc is not None and bridge.proc.returncode is None:
            bridge.proc.kill()
            await bridge.proc.wait()
        raise
    assert await bridge.stop() == 0
