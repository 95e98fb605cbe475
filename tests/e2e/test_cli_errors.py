"""Bad input and hostile surroundings: one line on stderr and an exit code, never a traceback.

Exit 2 for a value that cannot work (a name that does not resolve, a file
that is not a kubeconfig, a rate of 0), 1 for a condition of the moment (a
port another process holds), and 141 when the reader of stdout went away,
as a shell reports for any tool that SIGPIPE ended.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.ground.envelope import Event
from bridge.sinks.nats import NatsSink
from tests.e2e.bridge_process import cli, write_config
from tests.fixtures.nats import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process (here: a socket of the test) is listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def config_with(path: Path, kubeconfig: Path, **sections: Any) -> Path:
    """A stdout-sink config; logging at error so stderr holds only what the CLI says."""
    config = write_config(
        path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "stdout"},
        logging={"format": "json", "level": "error"},
    )
    doc = yaml.safe_load(config.read_text())
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    config.write_text(yaml.safe_dump(doc))
    return config


# -- run: the health server's address ------------------------------------------------


async def test_run_with_the_health_port_taken_exits_1_naming_server_port(
    tmp_path: Path, kubeconfig: Path, taken_port: int
) -> None:
    config = config_with(tmp_path, kubeconfig, server={"host": "127.0.0.1", "port": taken_port})
    rc, _, err = await cli("run", "--config", str(config))
    assert rc == 1
    line = one_line(err)
    assert f"server.port: port {taken_port} on 127.0.0.1 is already in use" in line


async def test_run_with_a_server_host_that_does_not_resolve_exits_2_naming_server_host(
    tmp_path: Path, kubeconfig: Path
) -> None:
    config = config_with(tmp_path, kubeconfig, server={"host": "no-such-host.invalid"})
    rc, _, err = await cli("run", "--config", str(config))
    assert rc == 2
    line = one_line(err)
    assert line.startswith("config error: server.host: 'no-such-host.invalid' does not resolve")


# -- kubeconfig ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("clusters: [\n  - oops", "invalid YAML at line 2"),
        ("- a\n- b\n", "not a kubeconfig"),
        ("", "the file is empty"),
        (None, "cannot read"),  # a directory
    ],
    ids=["yaml-syntax", "a-list", "empty", "a-directory"],
)
async def test_a_malformed_kubeconfig_exits_2_naming_the_key_and_the_file(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    bad = tmp_path / "kubeconfig"
    if content is None:
        bad.mkdir()
    else:
        bad.write_text(content)
    config = config_with(tmp_path, bad)
    rc, _, err = await cli("run", "--config", str(config))
    assert rc == 2
    line = one_line(err)
    assert line.startswith("config error: cluster.kubeconfig: ")
    assert str(bad) in line and expected in line


async def test_a_missing_kubeconfig_says_no_such_file_and_the_path(tmp_path: Path) -> None:
    """Issue 9: it said "Expected key current-context" instead."""
    missing = tmp_path / "nowhere" / "kubeconfig"
    config = config_with(tmp_path, missing)
    rc, _, err = await cli("run", "--config", str(config))
    assert rc == 2
    assert one_line(err) == f"config error: cluster.kubeconfig: {missing}: no such file"


async def test_a_missing_kubeconfig_from_the_environment_names_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    config = config_with(tmp_path, missing)
    doc = yaml.safe_load(config.read_text())
    del doc["cluster"]["kubeconfig"]
    config.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env["KUBECONFIG"] = str(missing)
    rc, _, err = await cli("run", "--config", str(config), env=env)
    assert rc == 2
    assert one_line(err) == f"config error: $KUBECONFIG: {missing}: no such file"


# -- the reader of stdout goes away --------------------------------------------------


async def pipe_into_head(args: list[str], tmp_path: Path, timeout: float = 40.0) -> tuple[str, int]:
    """``k8s-bridge ARGS | head -1`` in a shell: (what head printed, k8s-bridge's exit code).

    k8s-bridge's stderr must stay empty: no traceback, no "Exception ignored".
    """
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bridge.cli", *args])
    err, status = tmp_path / "stderr", tmp_path / "status"
    script = f'{command} 2>{err} | head -1; echo "${{PIPESTATUS[0]}}" >{status}'
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{script} did not end in {timeout}s") from None
    assert err.read_text() == ""
    return out.decode(), int(status.read_text())


async def test_tail_into_head_ends_quietly(
    tmp_path: Path, kubeconfig: Path, nats_control: NatsServer
) -> None:
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        logging={"format": "json", "level": "error"},
    )
    # More than a pipe buffer holds (64 KiB), so tail is still writing when head has gone.
    sink = NatsSink(nats_control.url)
    await sink.start()
    try:
        await sink.publish(pod_events(400))
    finally:
        await sink.close()
    out, status = await pipe_into_head(["tail", "--config", str(config), "--from-start"], tmp_path)
    assert len(out.splitlines()) == 1 and out.startswith("{")
    assert status == 141


def pod_events(n: int) -> list[Event]:
    builder = EventBuilder(cluster="e2e", group="", version="v1", kind="Pod", plural="pods")
    detector = ChangeDetector(Fingerprinter([]))
    out: list[Event] = []
    for i in range(n):
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        }
        obj["metadata"]["resourceVersion"] = str(i + 1)
        out.extend(builder.build(c) for c in detector.on_add(obj))
    return out


async def test_demo_json_into_head_ends_quietly(tmp_path: Path) -> None:
    out, status = await pipe_into_head(
        ["demo", "--json", "--rate", "50", "--duration", "30"], tmp_path
    )
    assert len(out.splitlines()) == 1
    assert status == 141


# -- argument values -----------------------------------------------------------------


async def test_demo_rate_0_is_refused_at_parse_time() -> None:
    rc, out, err = await cli("demo", "--rate", "0", timeout=10)
    assert rc == 2
    assert out == ""
    assert one_line(err) == (
        "k8s-bridge demo: argument --rate: must be > 0, got '0' (see k8s-bridge demo --help)"
    )


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [("--count", "-1", "must be >= 0, got '-1'"), ("--timeout", "-5", "must be >= 0, got '-5'")],
)
async def test_tail_refuses_negative_counts_and_timeouts(flag: str, value: str, why: str) -> None:
    rc, out, err = await cli("tail", "--config", "unused.yaml", flag, value, timeout=10)
    assert rc == 2
    assert out == ""
    assert one_line(err) == f"k8s-bridge tail: argument {flag}: {why} (see k8s-bridge tail --help)"


# -- the emulator ------------------------------------------------------------------------


async def test_emulator_on_a_port_in_use_exits_1_naming_the_port(taken_port: int) -> None:
    rc, out, err = await cli("emulator", "--port", str(taken_port), timeout=10)
    assert rc == 1
    assert out == ""
    assert one_line(err) == (
        f"k8s-bridge emulator: --port: port {taken_port} on 127.0.0.1 is already in use"
    )


async def test_emulator_module_on_a_port_in_use_exits_1_naming_the_port(taken_port: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge.emulator",
        "--port",
        str(taken_port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert out == b""
    assert proc.returncode == 1
    assert one_line(err.decode()) == (
        f"python -m bridge.emulator: --port: port {taken_port} on 127.0.0.1 is already in use"
    )


# -- run: a bus that refuses everything for good --------------------------------------


async def test_run_with_a_missing_stream_it_may_not_create_exits_1_in_one_line(
    tmp_path: Path, kubeconfig: Path, nats_control: NatsServer
) -> None:
    """Not "unavailable, retrying forever": a person must create the stream or allow it."""
    config = config_with(
        tmp_path,
        kubeconfig,
        sink={
            "kind": "nats",
            "nats": {"servers": [nats_control.url], "stream": "ABSENT", "createStream": False},
        },
    )
    rc, _, err = await cli("run", "--config", str(config))
    assert rc == 1
    line = one_line(err)
    assert "'ABSENT'" in line and "create" in line.lower()
