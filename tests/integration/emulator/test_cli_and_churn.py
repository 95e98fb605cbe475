"""The emulator as a process (``python -m bridge.emulator``) and the churn generator."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bridge.emulator import Emulator
from bridge.emulator.churn import ChurnGenerator
from tests.fixtures.waiting import until


async def test_module_serves_writes_kubeconfig_and_exits_zero_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge.emulator",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--churn",
        "--churn-rate",
        "50",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        url = line.split()[-1]
        assert line.startswith("emulator serving http://127.0.0.1:")
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        assert server == url
        async with aiohttp.ClientSession(url) as http:
            async with http.get("/version") as r:
                assert r.status == 200
            async with http.get("/apis/example.com/v1/widgets") as r:
                assert r.status == 200

            async def churned() -> bool:
                async with http.get("/api/v1/pods") as r:
                    return len((await r.json())["items"]) > 0

            await until(churned, 10)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 10)
    assert code == 0


async def test_churn_watch_stream_replays_to_the_listed_state(emulator: Emulator) -> None:
    """Every change churn makes reaches a watch in order: replaying it gives the final LIST."""
    churn = ChurnGenerator(emulator, rate=1000, seed=7)
    churn.setup()
    start = emulator.resource_version
    state: dict[str, dict[str, Any]] = {
        p["metadata"]["namespace"] + "/" + p["metadata"]["name"]: p
        for p in emulator.list("v1", "Pod")
    }
    params = {"watch": "1", "resourceVersion": str(start)}
    async with aiohttp.ClientSession(emulator.url) as http:
        async with http.get("/api/v1/pods", params=params) as r:
            kinds = {churn.step().split()[0] for _ in range(300)}
            # The RV of the last Pod change: the stream must deliver up to it.
            end = max(rec.rv for rec in emulator.store.history if rec.res.kind == "Pod")
            last = start
            while last < end:
                raw = await asyncio.wait_for(r.content.readline(), 5)
                event = orjson.loads(raw)
                obj = event["object"]
                key = obj["metadata"]["namespace"] + "/" + obj["metadata"]["name"]
                rv = int(obj["metadata"]["resourceVersion"])
                assert rv > last
                last = rv
                if event["type"] == "DELETED":
                    del state[key]
                else:
                    state[key] = obj
    listed = {
        p["metadata"]["namespace"] + "/" + p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in emulator.list("v1", "Pod")
    }
    assert {k: v["metadata"]["resourceVersion"] for k, v in state.items()} == listed
    assert {"pod", "node", "deployment", "widget"} <= kinds
