"""``k8s-bridge replay`` counts only what the bus took, and cuts batches at ``sink.maxBatch``.

A bus refuses some events for good (too large, not permitted); the running
bridge applies the poison policy to them and never counts them as published.
Replay must not claim them either: its count is what consumers can read.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from bridge.cli.replay import replay
from bridge.emulator import Emulator
from bridge.service.settings import load_settings
from tests.doubles.memory_sink import MemorySink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def config_map(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"k": "v"},
    }


async def test_refused_events_are_not_counted_and_batches_follow_max_batch(
    kubeconfig: Path, emulator: Emulator
) -> None:
    start = emulator.create(config_map("before"))
    from_rv = start["metadata"]["resourceVersion"]
    for i in range(7):
        emulator.create(config_map(f"cm{i}"))
    settings = load_settings(
        None,
        {
            "cluster": {"kubeconfig": str(kubeconfig), "name": "it"},
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap"}],
            "sink": {"kind": "stdout", "maxBatch": 3},
            "checkpoint": {"kind": "memory"},
        },
        env={},
    )
    sink = MemorySink(refuse=lambda e: "too large" if e.subject.endswith(("cm2", "cm5")) else None)
    err = io.StringIO()
    code = await replay(
        settings, "ConfigMap", from_rv, None, asyncio.Event(), err, quiet=0.5, sink=sink
    )
    assert code == 0
    published = sorted(e.subject.rpartition("/")[2] for e in sink.events)
    assert published == ["cm0", "cm1", "cm3", "cm4", "cm6"]
    assert max(len(b) for b in sink.batches) <= 3
    line = err.getvalue()
    assert "replayed 5 change(s) of configmaps" in line, line
    assert "2 refused by the bus for good" in line, line
