"""KubeClient and Discovery over HTTP: kubeconfig, auth header, error translation, discovery."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from bridge.emulator import Emulator
from bridge.emulator.server import write_kubeconfig
from bridge.errors import (
    ConfigError,
    KubeConnectionError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    UnknownKindError,
)
from bridge.kube.client import KubeClient
from bridge.kube.discovery import Discovery

pytestmark = pytest.mark.integration


async def _serve_pods(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> tuple[web.AppRunner, int]:
    """A server answering GET /api/v1/pods with ``handler``, on a free port."""
    app = web.Application()
    app.router.add_get("/api/v1/pods", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def test_client_from_the_emulators_kubeconfig(emulator: Emulator, client: KubeClient) -> None:
    assert client.host == emulator.url
    body = await client.request_json("GET", "/api/v1/namespaces")
    assert {n["metadata"]["name"] for n in body["items"]} >= {"default", "kube-system"}
    created = await client.request_json(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    )
    assert created["metadata"]["name"] == "c"


async def test_errors_are_translated_at_the_boundary(
    emulator: Emulator, client: KubeClient
) -> None:
    with pytest.raises(NotFoundError) as nf:
        await client.request_json("GET", "/api/v1/namespaces/default/pods/nope")
    assert nf.value.reason == "NotFound"
    emulator.chaos.fail_next(1, 429, retry_after=3)
    with pytest.raises(TooManyRequestsError) as tm:
        await client.request_json("GET", "/api/v1/pods")
    assert tm.value.retry_after == 3
    emulator.chaos.fail_next(1, 500)
    with pytest.raises(ServerError):
        await client.request_json("GET", "/api/v1/pods")
    emulator.chaos.fail_next(1, 500)
    with pytest.raises(ServerError):
        async with client.stream("GET", "/api/v1/pods", {"watch": 1}):
            pass


async def test_connection_refused_is_a_kube_connection_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    async with await KubeClient.from_kubeconfig(str(path)) as c:
        with pytest.raises(KubeConnectionError):
            await c.request_json("GET", "/api/v1/pods")
        with pytest.raises(KubeConnectionError):
            async with c.stream("GET", "/api/v1/pods", {"watch": 1}):
                pass


async def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        await KubeClient.from_kubeconfig(str(tmp_path / "absent"))


async def test_bearer_token_and_a_two_mib_line_over_a_dribbling_stream(tmp_path: Path) -> None:
    """Checklist 14: a 2 MiB line arriving in 1 KiB chunks comes out whole."""
    seen_auth: list[str] = []
    big = b'{"type":"ADDED","object":{"blob":"' + b"x" * (2 * 1024 * 1024) + b'"}}\n'

    async def handler(request: web.Request) -> web.StreamResponse:
        seen_auth.append(request.headers.get("Authorization", ""))
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        payload = b'{"type":"BOOKMARK","object":{}}\n' + big + b'{"type":"DELETED","object":{}}\n'
        for i in range(0, len(payload), 1024):
            await resp.write(payload[i : i + 1024])
        await resp.write_eof()
        return resp

    runner, port = await _serve_pods(handler)
    kc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump(kc))
    try:
        async with await KubeClient.from_kubeconfig(str(path), context="x") as c:
            async with c.stream("GET", "/api/v1/pods", {"watch": 1}) as lines:
                got = [line async for line in lines]
            async with c.stream_decoded("GET", "/api/v1/pods", {"watch": 1}) as events:
                types = [e["type"] async for e in events]
    finally:
        await runner.cleanup()
    assert seen_auth == ["Bearer s3cret-token"] * 2
    assert [len(x) for x in got] == [31, len(big) - 1, 30]
    assert types == ["BOOKMARK", "ADDED", "DELETED"]


@pytest.mark.parametrize("compression", [False, True])
async def test_answers_come_gzipped_only_when_compression_is_asked(
    tmp_path: Path, compression: bool
) -> None:
    """kube-apiserver gzips watch streams for a client that accepts it, one flush per
    event: off by default (``cluster.compression``), every request asks for identity."""
    seen: list[str] = []
    sent: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        accepted = request.headers.get("Accept-Encoding", "")
        seen.append(accepted)
        resp = web.StreamResponse()
        if "gzip" in accepted:
            resp.enable_compression(web.ContentCoding.gzip)
        await resp.prepare(request)
        sent.append(resp.headers.get("Content-Encoding"))
        for i in range(3):
            await resp.write(b'{"type":"ADDED","object":{"n":%d}}\n' % i)
        await resp.write_eof()
        return resp

    runner, port = await _serve_pods(handler)
    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    try:
        async with await KubeClient.from_kubeconfig(str(path), compression=compression) as c:
            async with c.stream_decoded("GET", "/api/v1/pods", {"watch": 1}) as events:
                got = [e["object"]["n"] async for e in events]
    finally:
        await runner.cleanup()
    assert got == [0, 1, 2]
    if compression:
        assert "gzip" in seen[0] and sent == ["gzip"]
    else:
        assert seen == ["identity"] and sent == [None]


async def test_discovery_resolves_builtin_and_custom_kinds(
    emulator: Emulator, client: KubeClient
) -> None:
    d = Discovery(client)
    pods = await d.resolve("v1", "Pod")
    assert (pods.plural, pods.namespaced, pods.api_version) == ("pods", True, "v1")
    assert "watch" in pods.verbs
    assert pods.path("ns1") == "/api/v1/namespaces/ns1/pods"
    assert pods.path() == "/api/v1/pods"
    widget = await d.resolve("example.com/v1", "Widget")
    assert (widget.group, widget.plural, widget.namespaced) == ("example.com", "widgets", True)
    assert widget.path("a") == "/apis/example.com/v1/namespaces/a/widgets"
    ns = await d.resolve("v1", "Namespace")
    assert ns.path("ignored") == "/api/v1/namespaces"


async def test_discovery_rereads_once_for_a_kind_installed_later(
    emulator: Emulator, client: KubeClient
) -> None:
    d = Discovery(client)
    await d.resolve("example.com/v1", "Widget")
    emulator.register_resource(group="example.com", version="v1", kind="Gadget", plural="gadgets")
    gadget = await d.resolve("example.com/v1", "Gadget")
    assert gadget.plural == "gadgets"


async def test_unknown_kind_names_kind_api_version_and_what_is_served(
    emulator: Emulator, client: KubeClient
) -> None:
    d = Discovery(client)
    with pytest.raises(UnknownKindError) as e:
        await d.resolve("example.com/v1", "Wodget")
    msg = str(e.value)
    assert "Wodget" in msg and "example.com/v1" in msg and "Widget" in msg
    assert "\n" not in msg
    with pytest.raises(UnknownKindError, match=r"does not serve nope\.io/v1"):
        await d.resolve("nope.io/v1", "Thing")
