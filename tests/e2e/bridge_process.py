"""Running ``k8s-bridge run`` as a real process, and reading what reached the bus."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from tests.doubles.contract import assert_valid
from tests.fixtures.waiting import until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, *, kubeconfig: Path, sink: dict[str, Any], **extra: Any) -> Path:
    config: dict[str, Any] = {
        "cluster": {"kubeconfig": str(kubeconfig), "name": "e2e"},
        "resources": [
            {"apiVersion": "v1", "kind": "Pod", "ignoreFields": ["status.conditions"]},
            {"apiVersion": "v1", "kind": "Secret"},
            {"apiVersion": "example.com/v1", "kind": "Widget"},
        ],
        "sink": sink,
        "checkpoint": {
            "kind": "sqlite",
            "path": str(path.parent / "state.db"),
            "flushInterval": 0.1,
        },
        "server": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info"},
    }
    config.update(extra)
    path.write_text(yaml.safe_dump(config))
    return path


class BridgeProcess:
    """``k8s-bridge run --config`` in a subprocess, with its health endpoints.

    ``keep_stdout`` keeps what it prints (the stdout sink's events) in
    ``bridge.stdout`` beside the config, for ``stdout_events``; ``env`` adds to
    the environment it runs with.
    """

    def __init__(
        self, config: Path, *, keep_stdout: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        self.port = int(yaml.safe_load(config.read_text())["server"]["port"])
        self.proc: asyncio.subprocess.Process | None = None
        self.log = config.parent / "bridge.log"
        self.stdout = config.parent / "bridge.stdout" if keep_stdout else None
        self.env = env or {}

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | self.env
        with self.log.open("ab") as err:
            if self.stdout is None:
                out: Any = asyncio.subprocess.DEVNULL
            else:
                out = self.stdout.open("ab")
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bridge.cli", "run", "--config", str(self.config),
                    stdout=out, stderr=err, env=env,
                )  # fmt: skip
            finally:
                if self.stdout is not None:
                    out.close()

    def stdout_events(self, change: str | None = None) -> list[dict[str, Any]]:
        """The events it printed (``keep_stdout``), of one change type if given."""
        assert self.stdout is not None, "started without keep_stdout"
        lines = self.stdout.read_bytes().splitlines() if self.stdout.exists() else []
        events = [orjson.loads(line) for line in lines if line.strip()]
        for e in events:
            assert_valid(e)  # every scenario's events keep to the published schema
        return [e for e in events if change is None or e["type"].endswith(f".{change}")]

    async def readyz(self) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.get(f"http://127.0.0.1:{self.port}/readyz") as r:
                    return r.status, await r.text()
            except aiohttp.ClientError as e:
                return 0, str(e)

    async def metrics(self) -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.port}/metrics") as r,
        ):
            return await r.text()

    async def wait_ready(self, timeout: float = 20.0) -> None:
        await until(
            lambda: self._ready(), timeout, lambda: f"bridge not ready; log:\n{self.tail_log()}"
        )

    async def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise AssertionError(f"bridge exited with {self.proc.returncode}:\n{self.tail_log()}")
        status, _ = await self.readyz()
        return status == 200

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"bridge did not stop on {sig}:\n{self.tail_log()}") from None

    def tail_log(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


async def run_until_exit(bridge: BridgeProcess, timeout: float = 30.0) -> tuple[int, str]:
    """Start ``bridge`` and wait for it to exit by itself: (exit code, its log)."""
    await bridge.start()
    assert bridge.proc is not None
    try:
        code = await asyncio.wait_for(bridge.proc.wait(), timeout)
    finally:
        if bridge.proc.returncode is None:
            await bridge.stop()
    return code, bridge.log.read_text()


def kafka_sink(bootstrap: str, topic: str) -> dict[str, Any]:
    """The ``sink`` section for a test's Kafka broker: the producer at its defaults
    (``acks=all``, idempotent), as users run it."""
    return {"kind": "kafka", "kafka": {"bootstrapServers": [bootstrap], "topic": topic}}


async def jetstream_events(url: str, stream: str = "K8S") -> list[dict[str, Any]]:
    """Every message in the stream, decoded, with its subject and Nats-Msg-Id."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await js.get_msg(stream, seq)
            doc = orjson.loads(msg.data or b"{}")
            assert_valid(doc)  # every scenario's events keep to the published schema
            doc["_subject"] = msg.subject
            doc["_msg_id"] = (msg.headers or {}).get("Nats-Msg-Id")
            doc["_raw"] = msg.data
            out.append(doc)
        return out
    finally:
        await nc.close()


async def probe(
    emulator: Any,
    url: str,
    obj: dict[str, Any],
    timeout: float = 20.0,
    message: Callable[[], str] | None = None,
) -> None:
    """Create ``obj`` and wait until its event is in the stream. A resource's changes
    are decided and published in order, so whatever the bridge would publish of what
    came before (a change it should have suppressed, a restart's republish) is in the
    stream by then: "nothing else came" holds for good, not for a while. The probe
    must be of the resource whose extra events are in question, and in view."""
    emulator.create(obj)
    md, kind = obj["metadata"], obj["kind"]
    subject = f"{md['namespace']}/{md['name']}" if md.get("namespace") else md["name"]

    async def arrived() -> bool:
        return any(
            e.get("subject") == subject and f".{kind}." in e.get("type", "")
            for e in await jetstream_events(url)
        )

    await until(arrived, timeout, message)


def gauge(metrics: str, name: str) -> float:
    """The value of an unlabelled gauge in a /metrics text."""
    match = re.search(rf"^{name} ([0-9.e+-]+)$", metrics, re.M)
    assert match, f"{name} not in metrics"
    return float(match.group(1))


async def is_leader(bridge: BridgeProcess) -> bool:
    try:
        return gauge(await bridge.metrics(), "k8s_bridge_leader") == 1.0
    except Exception:  # the process is gone or not listening yet
        return False


def published(metrics: str, resource: str | None = "v1/pods") -> float:
    """The bridge's events_published_total of ``resource`` (None: of all), every type summed."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("k8s_bridge_events_published_total{") and (
            resource is None or f'resource="{resource}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def published_once(
    bridge: BridgeProcess, want: int, resource: str | None = "v1/pods"
) -> float:
    """The bridge's published count of ``resource`` once it has reached ``want``; the
    caller asserts it is no more. Unlike the stream, which drops a republish of the
    same id, it counts everything the pipeline published."""

    async def reached() -> bool:
        return published(await bridge.metrics(), resource) >= want

    await until(reached, 20, bridge.tail_log)
    return published(await bridge.metrics(), resource)


def without(events: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    """``events`` but those of the probes ``names``."""
    return [e for e in events if str(e.get("subject", "")).rpartition("/")[2] not in names]


def changes(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, change, subject) of each event, in bus order."""
    return [(e["type"].split(".")[-2], e["type"].rsplit(".", 1)[-1], e["subject"]) for e in events]


async def cli(
    *args: str, timeout: float = 30.0, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """``python -m bridge.cli ARGS`` as a process: (exit code, stdout, stderr).

    Without ``env`` it runs in this environment less ``KUBECONFIG``: the config
    under test names its kubeconfig, as it would in production."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"k8s-bridge {' '.join(args)} did not end in {timeout}s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def kill9(proc: BridgeProcess) -> None:
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGKILL)
