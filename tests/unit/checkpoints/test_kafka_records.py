"""The Kafka checkpoint's record format (the seam a transactional writer shares), how
a read folds records into rows, and how the store is wired from settings. The store
against a real broker: tests/real/test_kafka_checkpoint.py and the store contract."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import yaml

from bridge.checkpoints.kafka import (
    KafkaCheckpointStore,
    _Fold,
    commit_records,
    digest_key,
    digest_of,
    digest_value,
    watermark_key,
)
from bridge.errors import CheckpointError, ConfigError
from bridge.ground.digest import UNCERTAIN, Digest
from bridge.ground.records import pack_state
from bridge.service.settings import load_settings
from bridge.service.wiring import build_checkpoints


def test_keys_name_the_resource_and_the_object() -> None:
    assert digest_key("core/v1/pods@ns", "ns/a") == b"d\x00core/v1/pods@ns\x00ns/a"
    assert watermark_key("core/v1/pods@ns") == b"w\x00core/v1/pods@ns"
    assert digest_key("r", "ns/ünï") == b"d\x00r\x00ns/\xc3\xbcn\xc3\xaf"


def test_a_commit_is_deletes_then_upserts_then_the_watermark() -> None:
    records = commit_records(
        "r",
        "9",
        [Digest("ns/b", "ub", "8", "f"), Digest("ns/c", "uc", "9", "g", UNCERTAIN, "old")],
        ["ns/a", "ns/c"],
    )
    assert records == [
        (b"d\x00r\x00ns/a", None),
        (b"d\x00r\x00ns/b", orjson.dumps(["ub", "8", "f", "", ""])),
        # Deleted and upserted in one commit: upserted (as every store does).
        (b"d\x00r\x00ns/c", orjson.dumps(["uc", "9", "g", UNCERTAIN, "old"])),
        (b"w\x00r", b'"9"'),
    ]


def test_a_write_ahead_commit_has_no_watermark_and_a_key_once() -> None:
    records = commit_records(
        "r", None, [Digest("a", "u", "3", "f", UNCERTAIN), Digest("a", "u", "4", "g")], []
    )
    assert records == [(b"d\x00r\x00a", orjson.dumps(["u", "4", "g", "", ""]))]
    assert commit_records("r", "", [], []) == [(b"w\x00r", b'""')]


def fold(records: list[tuple[bytes | None, bytes | None]], only: bytes | None = None) -> Any:
    f = _Fold(only)
    f.add([SimpleNamespace(key=k, value=v) for k, v in records])
    return {
        rid: (rows.watermark, {k[rows.prefix_length :]: v for k, v in rows.digests.items()})
        for rid, rows in f.rows.items()
    }


def test_the_last_record_of_a_key_wins_and_a_tombstone_removes_it() -> None:
    log = [
        *commit_records(
            "a", None, [Digest("k1", "u1", "1", "f"), Digest("k2", "u2", "1", "f")], []
        ),
        *commit_records("b", "5", [Digest("k1", "v1", "5", "f")], []),  # interleaved
        *commit_records("a", "2", [Digest("k1", "u1", "2", "g")], ["k2"]),
        *commit_records("b", "6", [], ["k1"]),
        (b"d\x00a\x00k2", b"late"),  # written again after its tombstone
        (None, b"not ours"),
        (b"x\x00other", b"not ours"),
    ]
    assert fold(log) == {
        b"a": (b'"2"', {b"k1": orjson.dumps(["u1", "2", "g", "", ""]), b"k2": b"late"}),
        b"b": (b'"6"', {}),
    }
    assert fold(log, only=b"b") == {b"b": (b'"6"', {})}


def config(tmp_path: Path, sink: dict[str, Any]) -> Any:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "resources": [{"apiVersion": "v1", "kind": "Pod"}],
                "sink": sink,
                "checkpoint": {"kind": "kafka", "kafka": {"topic": "cp"}},
            }
        )
    )
    return load_settings(str(path), env={})


def test_the_store_reaches_the_sinks_cluster_as_the_sink_does(tmp_path: Path) -> None:
    settings = config(
        tmp_path,
        {
            "kind": "kafka",
            "kafka": {
                "bootstrapServers": ["k1:9093", "k2:9093"],
                "securityProtocol": "SASL_PLAINTEXT",
                "saslMechanism": "SCRAM-SHA-512",
                "saslUsername": "bridge",
                "saslPassword": "s3cret",
            },
        },
    )
    store = build_checkpoints(settings)
    assert isinstance(store, KafkaCheckpointStore)
    assert store.topic == "cp" and store.replication_factor is None
    options = store._options
    assert options["bootstrap_servers"] == ["k1:9093", "k2:9093"]
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("bridge", "s3cret")


def test_a_kafka_checkpoint_beside_another_sink_is_a_one_line_config_error(
    tmp_path: Path,
) -> None:
    settings = config(tmp_path, {"kind": "nats"})
    with pytest.raises(ConfigError) as caught:
        build_checkpoints(settings)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("config error: checkpoint.kind: kafka")
    assert "sink.kind is 'nats'" in message


def test_a_plain_digest_is_its_packed_state_and_any_other_is_json() -> None:
    """A certain digest with no earlier incarnation whose values pack is stored as the
    cache's 41 packed bytes (a restart hands them over as they are); any other as JSON.
    Both read back as the digest."""
    uid, fp = "0f8fad5b-d9cb-469f-a165-70867728950e", "00112233445566778899aabbccddeeff"
    plain = Digest("ns/a", uid, "123", fp)
    value = digest_value(plain)
    assert len(value) == 41 and value[0] == 0 and value == pack_state(uid, "123", fp)
    for d in (
        plain,
        Digest("ns/a", uid, "123", fp, UNCERTAIN),
        Digest("ns/a", uid, "123", fp, prior="old"),
        Digest("ns/a", uid.upper(), "123", fp),
        Digest("ns/a", uid, "0123", fp),
    ):
        assert digest_of("ns/a", digest_value(d)) == d
        assert (digest_value(d)[:1] == b"[") is (d is not plain)
    with pytest.raises(CheckpointError, match="'ns/a': not a digest"):
        digest_of("ns/a", b"\x01" * 41)


async def bulk_of(records: list[tuple[bytes, bytes | None]]) -> Any:
    """``load_bulk`` of resource "r" from these records, as if read from the topic."""
    f = _Fold(None)
    f.add([SimpleNamespace(key=k, value=v) for k, v in records])
    store = KafkaCheckpointStore({"bootstrap_servers": ["unused:9092"]}, "cp")
    store._rows, store._open = f.rows, True
    return await store.load_bulk("r")


async def test_a_bulk_load_hands_packed_values_over_and_sorts_out_the_others() -> None:
    """All packed: keys and values in columns. After a crash some are JSON: those come
    out as digests (or loose records), the rest still in columns. A key the columns
    cannot split (it holds the prefix's NUL): one by one, nothing lost."""
    uid, fp = "0f8fad5b-d9cb-469f-a165-70867728950e", "00112233445566778899aabbccddeeff"
    plain = [Digest(f"ns/p{i}", uid, str(100 + i), fp) for i in range(50)]
    bulk = await bulk_of(commit_records("r", "9", plain, []))
    assert not bulk.others and not bulk.loose and bulk.resource_version == "9"
    assert dict(zip(bulk.packed.keys, bulk.packed.packed, strict=True)) == {
        d.key: pack_state(d.uid, d.resource_version, d.fingerprint) for d in plain
    }
    ahead = Digest("ns/p3", uid, "200", fp, UNCERTAIN)
    odd = Digest("ns/odd", "not-a-uuid", "7", fp)
    nul = Digest("ns/d\x00r\x00y", uid, "8", fp)
    records = commit_records("r", "9", [*plain, odd, nul], []) + commit_records(
        "r", None, [ahead], []
    )
    bulk = await bulk_of(records)
    assert bulk.others == [ahead]
    assert [r.key for r in bulk.loose] == ["ns/odd"]
    packed = dict(zip(bulk.packed.keys, bulk.packed.packed, strict=True))
    assert set(packed) == {d.key for d in plain} - {"ns/p3"} | {nul.key}
    assert packed[nul.key] == pack_state(uid, "8", fp)
