"""What one event says about one object, a batch's winners, and the mirror's settings."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from bridge.errors import ConfigError
from bridge.mirror.rows import NotOurs, decode, mark_winners
from bridge.mirror.settings import load_mirror_settings
from tests.doubles.memory_source import event


def test_an_event_becomes_a_row() -> None:
    c = decode(event("a", "u1", 42, "added", cluster="prod", namespace="team-a"), 2, 7)
    assert c is not None
    assert (c.cluster, c.uid, c.api_version, c.kind, c.namespace, c.name) == (
        "prod", "u1", "v1", "Pod", "team-a", "a",
    )  # fmt: skip
    assert (c.resource_version, c.change, c.event_id, c.partition, c.position) == (
        42, "added", "u1:42", 2, 7,
    )  # fmt: skip
    assert orjson.loads(c.labels) == {"app": "a"}
    assert orjson.loads(c.object)["metadata"]["uid"] == "u1"
    assert c.observed_at.isoformat() == "2026-11-27T10:00:00+00:00"


def test_a_cluster_scoped_object_has_the_empty_namespace() -> None:
    doc = orjson.loads(event("n1", "u1", 3))
    del doc["data"]["object"]["metadata"]["namespace"]
    c = decode(orjson.dumps(doc), 0, 0)
    assert c is not None and c.namespace == ""


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (None, "empty message"),
        (b"{", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"id": "1", "type": "t", "source": "s"}', "is not io.k8s"),
        (b'{"id": "1", "type": "io.k8s.core.v1.Pod.exploded", "source": "k8s://c/v1/pods"}', "unknown change"),
        (b'{"id": "1", "type": "io.k8s.core.v1.Pod.added", "source": "http://x"}', "is not k8s://"),
        (b'{"id": "1", "type": "io.k8s.core.v1.Pod.added", "source": "k8s://c/v1/pods"}', "no uid or name"),
        (event("a", "u", 1).replace(b'"resourceversion":"1"', b'"resourceversion":"x"'), "not an integer"),
    ],
)  # fmt: skip
def test_what_is_not_ours_says_why(raw: bytes | None, why: str) -> None:
    with pytest.raises(NotOurs, match=why):
        decode(raw, 0, 0)


def test_a_heartbeat_is_ours_but_no_change() -> None:
    hb = b'{"id": "hb:1:1", "type": "io.k8s.bridge.heartbeat", "source": "k8s://c/v1/pods"}'
    assert decode(hb, 0, 0) is None


def test_winners_newest_per_uid_a_removal_on_a_tie_and_the_newest_per_name() -> None:
    raws = [
        event("a", "u1", 5),
        event("a", "u1", 9),
        event("a", "u1", 7),  # late: loses to 9
        event("b", "u2", 4),
        event("b", "u2", 4, "deleted"),  # a delete seen through a relist: same rv, wins
        event("c", "old", 10),
        event("c", "new", 12),  # the name's newer object
        event("a", "u1", 9, cluster="other"),  # another cluster: its own winner
    ]
    changes = [c for i, r in enumerate(raws) if (c := decode(r, 0, i)) is not None]
    mark_winners(changes)
    assert [c.position for c in changes if c.winner] == [1, 4, 6, 7]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mirror.yaml"
    path.write_text(text)
    return str(path)


def test_settings_and_their_one_line_errors(tmp_path: Path) -> None:
    s = load_mirror_settings(write(tmp_path, "source: {kind: nats}\n"))
    assert s.source.identity == "nats:K8S" and s.postgres.db_schema == "k8s"
    assert s.postgres.dsn is None and s.server.port is None and not s.history
    s = load_mirror_settings(
        write(tmp_path, "source: {kind: kafka, kafka: {topic: t}, id: east}\n"),
        {"logging.level": "debug"},
    )
    assert s.source.identity == "east" and s.logging.level == "debug"
    for text, message in [
        ("source: {kind: kafka}\npostgres: {schema: Bad-Name}\n", "postgres.schema: 'Bad-Name' is not a lower-case SQL identifier"),
        ("source: {kind: kafka, kafka: {topic: 'k8s.{kind}'}}\n", "is a templated topic"),
        ("postgres: {}\n", "source: required key is missing"),
        ("source: {kind: kafka}\nbatch: {maxEvent: 3}\n", "batch.maxEvent: unknown key (did you mean maxEvents?)"),
        ("- 1\n", "the top level must be a mapping"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_mirror_settings(write(tmp_path, text))
