"""Who may call the control endpoint: the settings of ``server.controlAuth``, the static
token, the bearer header, and the CLI's token. The Kubernetes reviews are tested against
the emulator (tests/integration/test_control_auth.py) and kube-apiserver
(tests/real/test_control_auth.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bridge.cli.main import main
from bridge.cli.snapshot import control_bearer
from bridge.emulator.server import write_kubeconfig
from bridge.errors import ConfigError
from bridge.ground.prometheus import Registry
from bridge.service.control import (
    KubernetesAccess,
    StaticToken,
    Unauthenticated,
    bearer_token,
    control_auth,
)
from bridge.service.health import HealthServer
from bridge.service.settings import Settings, load_settings
from tests.fixtures.nats import free_port

BASE: dict[str, Any] = {
    "resources": [{"apiVersion": "v1", "kind": "Pod"}],
    "sink": {"kind": "stdout"},
}


def settings(**server: Any) -> Settings:
    return load_settings(None, {**BASE, "server": server}, env={})


def test_without_a_token_the_endpoint_wants_kubernetes_credentials() -> None:
    assert settings().server.control_mode == "kubernetes"
    assert settings(controlToken="t0ken").server.control_mode == "token"
    assert settings(controlAuth="token", controlToken="t").server.control_mode == "token"
    assert settings(controlAuth="none").server.control_mode == "none"
    assert isinstance(control_auth(settings().server, lambda: None), KubernetesAccess)
    assert isinstance(
        control_auth(settings(controlAuth="none").server, lambda: None), Unauthenticated
    )


@pytest.mark.parametrize(
    ("server", "env", "error"),
    [
        (
            {"controlAuth": "token"},
            {},
            "config error: server.controlToken: required when server.controlAuth is token",
        ),
        ({"controlToken": "  "}, {}, "config error: server.controlToken: must not be empty"),
        # A Secret without the key gives an empty variable: it must not open the endpoint.
        ({}, {"BRIDGE_SERVER__CONTROLTOKEN": ""}, "server.controlToken: must not be empty"),
        (
            {"controlAuth": "none", "controlToken": "s3cret-value"},
            {},
            "config error: server.controlToken: set, but server.controlAuth is none, so it"
            " would not be checked; remove one of them",
        ),
        (
            {"controlAuth": "kubernetes", "controlToken": "s3cret-value"},
            {},
            "server.controlToken: set, but server.controlAuth is kubernetes",
        ),
        (
            {"controlAuth": "rbac"},
            {},
            "config error: server.controlAuth: 'rbac' is not one of kubernetes, token, none",
        ),
    ],
)
def test_a_control_setting_that_does_not_fit_is_one_line_naming_the_key(
    server: dict[str, Any], env: dict[str, str], error: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, {**BASE, "server": server}, env=env)
    assert error in str(e.value) and "\n" not in str(e.value)
    assert "s3cret-value" not in str(e.value)  # the secret is never echoed


def test_the_bearer_token_of_an_authorization_header() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic YWI6Y2Q=") == ""
    assert bearer_token("abc") == ""
    assert bearer_token("") == ""


async def test_the_static_token_lets_in_only_its_own_bearer() -> None:
    check = StaticToken("t0ken")
    assert (await check.check("Bearer t0ken")).status == 200
    assert (await check.check("Bearer t0ken2")).status == 401
    assert (await check.check("t0ken")).status == 401  # not a bearer header
    missing = await check.check("")
    assert missing.status == 401 and "server.controlToken" in missing.message
    with pytest.raises(ValueError, match="empty"):
        StaticToken("")


async def test_a_snapshot_endpoint_is_never_served_without_a_check() -> None:
    async def snapshot(resource: str) -> dict[str, Any]:
        return {}

    with pytest.raises(ValueError, match="control_auth"):
        HealthServer("127.0.0.1", 0, Registry(), lambda: (True, []), snapshot=snapshot)


async def test_a_refused_caller_gets_one_json_line_and_a_bearer_challenge() -> None:
    called: list[str] = []

    async def snapshot(resource: str) -> dict[str, Any]:
        called.append(resource)
        return {}

    server = HealthServer(
        "127.0.0.1",
        0,
        Registry(),
        lambda: (True, []),
        snapshot=snapshot,
        control_auth=StaticToken("t0ken"),
    )
    async with server, aiohttp.ClientSession() as http:
        # No resource either: the check comes first, so nothing of the request is looked at.
        async with http.post(f"{server.url}/snapshot") as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"] == "Bearer"
            assert await r.json() == {
                "error": "unauthorized: send Authorization: Bearer <server.controlToken>"
            }
    assert called == []


# -- the token k8s-bridge snapshot sends ----------------------------------------------------


def write(tmp_path: Path, **doc: Any) -> Settings:
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump({**BASE, **doc}))
    return load_settings(str(path), env={})


async def test_the_cli_sends_the_token_the_bridge_wants(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    s = write(tmp_path, cluster={"kubeconfig": str(kubeconfig)})
    assert await control_bearer(s) == ("emulator", "")  # the kubeconfig's own token
    s = write(tmp_path, server={"controlToken": "t0ken"})
    assert await control_bearer(s) == ("t0ken", "")
    s = write(tmp_path, server={"controlAuth": "none"})
    assert await control_bearer(s) == (None, "")
    s = write(tmp_path, cluster={"kubeconfig": str(tmp_path / "missing")})
    token, why = await control_bearer(s)
    assert token is None and "cluster.kubeconfig" in why and "no such file" in why


async def test_a_401_says_why_the_cli_sent_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def snapshot(resource: str) -> dict[str, Any]:
        return {}

    port = free_port()
    server = HealthServer(
        "127.0.0.1",
        port,
        Registry(),
        lambda: (True, []),
        snapshot=snapshot,
        control_auth=StaticToken("t0ken"),  # any check that refuses a missing token
    )
    path = tmp_path / "bridge.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **BASE,
                "cluster": {"kubeconfig": str(tmp_path / "missing")},
                "server": {"host": "127.0.0.1", "port": port},
            }
        )
    )
    async with server:
        # The CLI runs its own event loop: run it in a thread beside the server's.
        code = await asyncio.to_thread(
            main, ["snapshot", "--config", str(path), "--resource", "Pod"]
        )
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert "refused: unauthorized" in err
    assert "no token sent: cluster.kubeconfig" in err and "--token" in err
