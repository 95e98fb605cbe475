"""The kubeconfig reader's choices that need no server: the in-cluster account, the
context a kubeconfig names, what it hands to kubernetes-asyncio, one-line errors.
(On the real server: tests/real/test_kubeconfig_real.py.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from bridge.errors import ConfigError
from bridge.kube import kubeconfig


def doc(user: dict[str, Any], **cluster: Any) -> dict[str, Any]:
    return {
        "clusters": [{"name": "c", "cluster": {"server": "https://k:6443/", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "a", "context": {"cluster": "c", "user": "u"}},
            {"name": "b", "context": {"cluster": "missing", "user": "u"}},
        ],
        "current-context": "a",
    }


async def test_in_cluster_reads_the_account_and_brackets_an_ipv6_host(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("x")
    (tmp_path / "token").write_text("tok\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    endpoint, creds = kubeconfig.in_cluster(env, tmp_path)
    assert endpoint.host == "https://[fd00::1]:443"
    assert endpoint.ca_file == str(tmp_path / "ca.crt")
    assert await creds.authorization() == "Bearer tok"
    (tmp_path / "token").write_text("rotated\n")
    assert await creds.renew() is True
    assert await creds.authorization() == "Bearer rotated"


def test_in_cluster_without_its_environment_is_one_line() -> None:
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"):
        kubeconfig.in_cluster({}, Path("/nonexistent"))


async def test_the_named_context_its_files_and_basic_auth(tmp_path: Path) -> None:
    user = {"username": "a", "password": "b", "client-certificate": "c.crt"}
    path = str(tmp_path / "kc")
    found = kubeconfig.from_document(doc(user, **{"tls-server-name": "n"}), path, None, "k")
    assert found is not None
    endpoint, creds = found
    assert endpoint.host == "https://k:6443"
    assert endpoint.cert_file == str(tmp_path / "c.crt")  # relative to the kubeconfig
    assert endpoint.server_name == "n" and endpoint.verify
    assert await creds.authorization() == "Basic " + base64.b64encode(b"a:b").decode()
    with pytest.raises(ConfigError, match="no cluster named 'missing' in clusters"):
        kubeconfig.from_document(doc(user), path, "b", "cluster.kubeconfig")
    with pytest.raises(ConfigError, match="no context named 'z' in contexts"):
        kubeconfig.from_document(doc(user), path, "z", "cluster.kubeconfig")


def test_an_auth_provider_user_is_left_to_kubernetes_asyncio(tmp_path: Path) -> None:
    user = {"auth-provider": {"name": "oidc", "config": {"id-token": "t"}}}
    assert kubeconfig.from_document(doc(user), str(tmp_path / "kc"), None, "k") is None


def test_inline_data_that_is_not_base64_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="certificate-authority-data is not base64"):
        kubeconfig.from_document(
            doc({"token": "t"}, **{"certificate-authority-data": "%%%"}), "kc", None, "k"
        )
