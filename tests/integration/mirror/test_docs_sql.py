"""The SQL docs/mirror.md shows runs against the mirror's tables and answers what it says."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.doubles.memory_source import MemorySource, event
from tests.integration.mirror.test_postgres_store import mirror_all, rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DOC = Path(__file__).resolve().parents[3] / "docs" / "mirror.md"


def queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)


async def test_the_documented_queries(postgres_dsn: str) -> None:
    yesterday = (datetime.now(UTC) - timedelta(days=1)).replace(hour=12)
    stamp = yesterday.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    src = MemorySource()
    for value in (
        event("a", "a1", 1, cluster="prod", namespace="team-a",
              containers=[{"name": "c", "image": "web:1"}], initContainers=[{"name": "i", "image": "init:1"}]),
        event("b", "b1", 2, cluster="dev", namespace="team-a", containers=[{"name": "c", "image": "web:1"}]),
        event("gone", "g1", 3, cluster="prod", namespace="team-a"),
        event("gone", "g1", 4, "deleted", cluster="prod", namespace="team-a", time=stamp),
        event("web", "d1", 5, "added", cluster="prod", namespace="team-a", kind="Deployment",
              labels={"tier": "frontend"}, replicas=3),
        event("web", "d1", 6, cluster="prod", namespace="team-a", kind="Deployment",
              labels={"tier": "frontend"}, replicas=4),
    ):  # fmt: skip
        src.append(value)
    await mirror_all(src, postgres_dsn)
    sql = queries()
    assert len(sql) == 5
    images, deleted, by_label, history, positions = [await rows(postgres_dsn, q) for q in sql]
    assert images == [("web:1", 2, ["dev", "prod"]), ("init:1", 1, ["prod"])]
    assert [(c, k, n) for c, k, n, _ in deleted] == [("prod", "Pod", "gone")]
    assert by_label == [("prod", "team-a", "web", "4")]
    assert [(change, rv) for _, _, change, rv, _ in history] == [("added", 5), ("modified", 6)]
    assert [(s, p, n) for s, p, n, _ in positions] == [("memory:events", 0, 6)]
