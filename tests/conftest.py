"""Suite-wide fixtures. Fixtures for real processes live in tests/fixtures/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest_plugins = [
    "tests.fixtures.emulator",
    "tests.fixtures.nats",
    "tests.fixtures.natscluster",
    "tests.fixtures.kafka",
    "tests.fixtures.kube",
    "tests.fixtures.realkafka",
    "tests.fixtures.postgres",
    "tests.fixtures.pipeline",
]


@pytest.fixture(autouse=True)
async def no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it (kopf does the same)."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leaked: set[asyncio.Task[object]] = set()
    # Cancelled tasks need a few loop turns to finish unwinding.
    for _ in range(50):
        leaked = {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}
        if not leaked:
            return
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leaked))
    pytest.fail(f"{request.node.nodeid} leaked {len(leaked)} asyncio task(s): {names}")
