"""A Secret made with the real ``kubectl apply``: no value of it reaches the bus or the log.

kubectl apply copies the whole manifest, values included, into the
``kubectl.kubernetes.io/last-applied-configuration`` annotation; redacting
``data``/``stringData`` alone would publish them from there.
"""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from bridge.delivery.events import LAST_APPLIED, REDACTED
from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, jetstream_events, probe, without, write_config
from tests.e2e.kubectl import kubectl
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
]

MANIFEST = """\
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
type: Opaque
data: {password: PASSWORD_B64}
stringData: {token: TOKEN}
"""

PROBE = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "probe", "namespace": "default"},
    "type": "Opaque",
}


def write_manifest(path: Path, password: str, token: str) -> Path:
    b64 = base64.b64encode(password.encode()).decode()
    path.write_text(MANIFEST.replace("PASSWORD_B64", b64).replace("TOKEN", token))
    return path


def forms(value: str) -> list[bytes]:
    """The bytes a value may show up as: plain, and base64 as the API server stores it."""
    return [value.encode(), base64.b64encode(value.encode())]


async def test_kubectl_applied_secret_values_never_reach_the_bus(
    tmp_path: Path, emulator: Emulator, kubeconfig: Path, nats_control: NatsServer
) -> None:
    secrets = ["hunter2-first", "t0ken-first", "hunter2-second", "t0ken-second"]
    manifest = write_manifest(tmp_path / "secret.yaml", secrets[0], secrets[1])
    out = await kubectl(tmp_path, kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert "secret/creds created" in out
    stored = emulator.get("v1", "Secret", "creds", "default")
    # The premise: the annotation holds a value in plain text.
    assert secrets[1] in stored["metadata"]["annotations"][LAST_APPLIED]

    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        resources=[{"apiVersion": "v1", "kind": "Secret", "includeOld": True, "patch": True}],
    )
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        write_manifest(manifest, secrets[2], secrets[3])
        out = await kubectl(tmp_path, kubeconfig, "apply", "--validate=false", "-f", str(manifest))
        assert "secret/creds configured" in out
        await kubectl(tmp_path, kubeconfig, "delete", "-f", str(manifest))

        async def three_events() -> bool:
            return len(await jetstream_events(nats_control.url)) >= 3

        await until(three_events, 20, bridge.tail_log)
        # Anything extra about "creds" would be in the stream before the probe.
        await probe(emulator, nats_control.url, PROBE, message=bridge.tail_log)
        events = without(await jetstream_events(nats_control.url), "probe")
    finally:
        assert await bridge.stop() == 0
    assert [e["type"].rsplit(".", 1)[-1] for e in events] == ["added", "modified", "deleted"]
    published = b"".join(e["_raw"] for e in events)
    logged = bridge.log.read_bytes()
    for secret in secrets:
        for raw in forms(secret):
            assert raw not in published, f"{raw!r} reached the bus"
            assert raw not in logged, f"{raw!r} reached the log"
    modified = events[1]["data"]
    for obj in (modified["object"], modified["old"]):
        applied = orjson.loads(obj["metadata"]["annotations"][LAST_APPLIED])
        assert applied["data"] == {"password": REDACTED}
        assert applied["stringData"] == {"token": REDACTED}
        assert obj["data"] == {"password": REDACTED, "token": REDACTED}
