"""Secrets applied with the real kubectl against kube-apiserver: no value reaches the bus or a log.

The real server keeps a Secret's values in more places than ``data``:

* ``kubectl apply`` (client-side) copies the whole manifest, ``data`` in base64
  and ``stringData`` in plain text, into the
  ``kubectl.kubernetes.io/last-applied-configuration`` annotation;
* a later ``kubectl apply --server-side`` of an object that carries that
  annotation has the API server rewrite the annotation with the new values;
* ``metadata.managedFields`` (filled on every write) names each key of ``data``
  (``f:password``) but never holds a value: keys may be published, values not.

Two bridges watch the test's namespace while the Secrets are applied, re-applied
and deleted: one publishes to JetStream (whole objects parsed: ``includeOld``
and ``patch``) and logs JSON at debug level, the other writes to stdout (the
objects' unread parts spliced in as the server's bytes) and logs for a console
at debug level. Every stored JetStream message is read raw (subject, headers
and payload as the server keeps them), and so is every byte the bridges wrote
to stdout and stderr. Then ``k8s-bridge replay`` from before the first apply
builds every event again from the server's watch history onto the same stream,
and its output is searched too. The values are distinctive (a uuid each) so a search for
them, plain or base64, cannot miss.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.delivery.events import LAST_APPLIED, REDACTED
from tests.e2e.bridge_process import BridgeProcess, cli, write_config
from tests.fixtures.kube import KubeCluster
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

STREAM = "K8S"


class StdoutBridge(BridgeProcess):
    """A bridge whose stdout (the stdout sink's events) is kept in a file."""

    def __init__(self, config: Path) -> None:
        super().__init__(config, keep_stdout=True)


def secret_manifest(
    namespace: str, name: str, data: dict[str, str], string_data: dict[str, str]
) -> str:
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "creds"}},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        "stringData": string_data,
    }
    return orjson.dumps(manifest).decode()  # JSON is YAML: kubectl reads it from stdin


def forms(value: str) -> list[bytes]:
    """The bytes a value may show up as: plain, and base64 as the API server keeps it."""
    return [value.encode(), base64.b64encode(value.encode())]


async def raw_stream_messages(url: str, stream: str = STREAM) -> list[dict[str, Any]]:
    """Every stored message of ``stream`` as JetStream keeps it: subject, raw header block
    and raw payload (the STREAM.MSG.GET API, nothing parsed but its envelope)."""
    import nats

    nc = await nats.connect(url)
    try:
        info = orjson.loads(
            (await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)).data
        )
        if "error" in info:
            return []
        state = info["state"]
        out = []
        for seq in range(state["first_seq"], state["last_seq"] + 1):
            if state["messages"] == 0:
                break
            reply = await nc.request(
                f"$JS.API.STREAM.MSG.GET.{stream}", orjson.dumps({"seq": seq}), timeout=5
            )
            message = orjson.loads(reply.data)["message"]
            out.append(
                {
                    "subject": message["subject"].encode(),
                    "headers": base64.b64decode(message.get("hdrs") or ""),
                    "data": base64.b64decode(message.get("data") or ""),
                }
            )
        return out
    finally:
        await nc.close()


def events_of(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [orjson.loads(m["data"]) for m in raw]


def changes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["subject"], e["type"].rsplit(".", 1)[-1]) for e in events]


async def kubectl(cluster: KubeCluster, *args: str, stdin: str | None = None) -> str:
    proc = await asyncio.to_thread(cluster.kubectl, *args, stdin=stdin)
    return proc.stdout


async def test_applied_secret_values_never_reach_the_bus_or_the_logs(
    tmp_path: Path, kube_cluster: KubeCluster, kube_namespace: str, nats_control: NatsServer
) -> None:
    ns = kube_namespace
    tag = uuid.uuid4().hex
    value = {n: f"{n}-{tag}" for n in ("pw1", "tok1", "pw2", "tok2", "pw3", "tok3", "pw4", "tok4")}
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    secrets = {"apiVersion": "v1", "kind": "Secret", "namespaces": [ns]}
    js_home, out_home = tmp_path / "js", tmp_path / "stdout"
    js_home.mkdir()
    out_home.mkdir()
    to_bus = BridgeProcess(
        write_config(
            js_home / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
            resources=[{**secrets, "includeOld": True, "patch": True}],
            logging={"format": "json", "level": "debug"},
        )
    )
    to_stdout = StdoutBridge(
        write_config(
            out_home / "bridge.yaml",
            kubeconfig=kubeconfig,
            sink={"kind": "stdout"},
            resources=[secrets],
            logging={"format": "console", "level": "debug"},
        )
    )
    await to_bus.start()
    await to_stdout.start()
    try:
        await to_bus.wait_ready(60)
        await to_stdout.wait_ready(60)
        before = kube_cluster.resource_version

        # creds: client-side apply, re-apply changed, then server-side apply over it.
        out = await kubectl(kube_cluster, "apply", "-f", "-", stdin=secret_manifest(
            ns, "creds", {"password": value["pw1"]}, {"token": value["tok1"]}))  # fmt: skip
        assert "secret/creds created" in out
        stored = kube_cluster.get("v1", "Secret", "creds", ns)
        # The premise: the server keeps the values in the annotation, the token in plain text.
        assert value["tok1"] in stored["metadata"]["annotations"][LAST_APPLIED]
        assert forms(value["pw1"])[1].decode() in stored["metadata"]["annotations"][LAST_APPLIED]

        out = await kubectl(kube_cluster, "apply", "-f", "-", stdin=secret_manifest(
            ns, "creds", {"password": value["pw2"], "extra": value["pw3"]},
            {"token": value["tok2"]}))  # fmt: skip
        assert "secret/creds configured" in out

        out = await kubectl(kube_cluster, "apply", "--server-side", "--force-conflicts",
                            "-f", "-", stdin=secret_manifest(
            ns, "creds", {"password": value["pw4"]}, {"token": value["tok3"]}))  # fmt: skip
        assert "serverside-applied" in out
        stored = kube_cluster.get("v1", "Secret", "creds", ns)
        # The API server rewrote kubectl's annotation from the server-side apply.
        assert value["tok3"] in stored["metadata"]["annotations"][LAST_APPLIED]

        # only-ssa: server-side apply alone, so managedFields is the server's record of it.
        out = await kubectl(kube_cluster, "apply", "--server-side", "-f", "-", stdin=secret_manifest(
            ns, "only-ssa", {"password": value["pw1"]}, {"token": value["tok4"]}))  # fmt: skip
        assert "serverside-applied" in out
        stored = kube_cluster.get("v1", "Secret", "only-ssa", ns)
        managed = orjson.dumps(stored["metadata"]["managedFields"])
        assert b'"f:password"' in managed and b'"f:token"' in managed
        for v in value.values():
            for form in forms(v):
                assert form not in managed, "managedFields holds field names only"

        await kubectl(kube_cluster, "delete", "secret", "creds", "only-ssa", "-n", ns)

        async def all_published() -> bool:
            on_bus = events_of(await raw_stream_messages(nats_control.url))
            return all(
                [c for _, c in changes(evs)].count("deleted") == 2
                for evs in (on_bus, to_stdout.stdout_events())
            )

        await until(all_published, 30, lambda: to_bus.tail_log() + "\n" + to_stdout.tail_log())
    finally:
        codes = [await to_bus.stop(), await to_stdout.stop()]
    assert codes == [0, 0]
    live = len(await raw_stream_messages(nats_control.url))
    # Replay from before the first apply: the real server's watch history, built again.
    code, replay_out, replay_err = await cli(
        "replay", "--config", str(to_bus.config), "--resource", "Secret",
        "--from-resource-version", str(before), "--namespace", ns,
    )  # fmt: skip
    assert code == 0, replay_err
    # Stopped: everything the bridges and the replay published or logged is in these bytes.
    everything = await raw_stream_messages(nats_control.url)
    raw, replayed = everything[:live], everything[live:]
    assert changes(events_of(replayed)) == changes(events_of(raw))
    published = changes(events_of(raw))
    assert changes(to_stdout.stdout_events()) == published
    creds = [c for subject, c in published if subject == f"{ns}/creds"]
    # kubectl's server-side apply over a client-side applied object writes twice: the
    # apply, then the move of the client-side manager's fields (extra goes).
    assert creds == ["added", "modified", "modified", "modified", "deleted"], published
    assert [c for subject, c in published if subject == f"{ns}/only-ssa"] == ["added", "deleted"]
    assert all(m["headers"] for m in raw), "the search covers the headers (Nats-Msg-Id)"
    searched = {
        "bus": b"\n".join(m["subject"] + b"\n" + m["headers"] + m["data"] for m in everything),
        "replay's output": (replay_out + replay_err).encode(),
        "stdout": to_stdout.stdout.read_bytes() if to_stdout.stdout else b"",
        "log (JetStream bridge)": to_bus.log.read_bytes(),
        "log (stdout bridge)": to_stdout.log.read_bytes(),
    }
    # The debug logs said something (the search is not over empty files).
    assert b'"level":"debug"' in searched["log (JetStream bridge)"]
    for where, data in searched.items():
        for v in value.values():
            for form in forms(v):
                assert form not in data, f"{form!r} reached the {where}"

    for events in (events_of(raw), events_of(replayed), to_stdout.stdout_events()):
        for event in events:
            objects = [event["data"]["object"], event["data"].get("old")]
            for obj in filter(None, objects):
                assert set(obj["data"].values()) == {REDACTED}, obj["data"]
                assert "stringData" not in obj  # the server folds it into data
                # Keys are not values: managedFields still names them.
                managed = orjson.dumps(obj["metadata"]["managedFields"])
                assert b'"f:data"' in managed
                applied = obj["metadata"].get("annotations", {}).get(LAST_APPLIED)
                if applied is not None:
                    manifest = orjson.loads(applied)
                    assert set(manifest["data"].values()) == {REDACTED}
                    assert set(manifest["stringData"].values()) == {REDACTED}
        added = events[0]["data"]["object"]
        assert set(added["data"]) == {"password", "token"}
        assert orjson.loads(added["metadata"]["annotations"][LAST_APPLIED])["stringData"] == {
            "token": REDACTED
        }
    modified = events_of(raw)[1]["data"]
    assert set(modified["object"]["data"]) == {"password", "extra", "token"}
    assert modified["old"]["data"] == {"password": REDACTED, "token": REDACTED}
    # The patch between two redacted objects names the new key, never a value.
    assert {"op": "add", "path": "/data/extra", "value": REDACTED} in modified["patch"]
