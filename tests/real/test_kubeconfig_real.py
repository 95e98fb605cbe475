"""The bridge's own kubeconfig reader (bridge/kube/kubeconfig.py) against a real kube-apiserver.

Each way of proving who the bridge is that kubectl's kubeconfigs hold is tried
on the real server, and the server itself says who it took the caller for (a
SelfSubjectReview): an inline CA with an inline client certificate, an exec
credential plugin (run again when its token expires), a token file read
again when the server refuses the token it held (rotated).
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.errors import UnauthorizedError
from bridge.kube.client import KubeClient
from tests.fixtures.kube import KubeCluster

pytestmark = [pytest.mark.timeout(120)]


def kubeconfig(path: Path, cluster: KubeCluster, user: dict[str, Any], **extra: Any) -> str:
    ca = base64.b64encode(cluster.ca_file.read_bytes()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "real", "cluster": {"server": cluster.url, "certificate-authority-data": ca}}
        ],
        "users": [{"name": "who", "user": user}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "who"}}],
        "current-context": "real",
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def whoami(path: str, times: int = 1) -> str:
    """Who the server takes the kubeconfig's user for; ``times`` requests by one client."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    names = set()
    async with await KubeClient.from_kubeconfig(path) as client:
        for _ in range(times):
            out = await client.request_json(
                "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review
            )
            names.add(out["status"]["userInfo"]["username"])
    (name,) = names
    return str(name)


async def test_inline_ca_and_client_certificate(tmp_path: Path, kube_cluster: KubeCluster) -> None:
    pki = kube_cluster.workdir / "pki"
    run = lambda *a: subprocess.run(["openssl", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/O=system:masters/CN=cert-user",
        "-keyout", "c.key", "-out", "c.csr")  # fmt: skip
    run("x509", "-req", "-in", "c.csr", "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "1", "-out", "c.crt")  # fmt: skip
    user = {
        "client-certificate-data": base64.b64encode((tmp_path / "c.crt").read_bytes()).decode(),
        "client-key-data": base64.b64encode((tmp_path / "c.key").read_bytes()).decode(),
    }
    assert await whoami(kubeconfig(tmp_path / "kc", kube_cluster, user)) == "cert-user"
    # The same as files named relative to the kubeconfig's folder.
    files = {"client-certificate": "c.crt", "client-key": "c.key"}
    assert await whoami(kubeconfig(tmp_path / "kc2", kube_cluster, files)) == "cert-user"


async def test_exec_plugin_run_again_when_its_token_expires(
    tmp_path: Path, kube_cluster: KubeCluster
) -> None:
    namespace = kube_cluster.namespace("exec")
    token = kube_cluster.service_account_token(namespace, "plugged")
    runs = tmp_path / "runs"
    # Each run appends a line; the credential it prints has already expired, so
    # every request runs the plugin again.
    plugin = tmp_path / "plugin.py"
    expired = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)).isoformat()
    plugin.write_text(
        "import json, os, sys\n"
        f"open({str(runs)!r}, 'a').write(os.environ['KUBERNETES_EXEC_INFO'] + '\\n')\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
        " 'kind': 'ExecCredential',"
        f" 'status': {{'token': os.environ['TOKEN'], 'expirationTimestamp': {expired!r}}}}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin)],
            "env": [{"name": "TOKEN", "value": token}],
            "interactiveMode": "Never",
        }
    }
    path = kubeconfig(tmp_path / "kc", kube_cluster, user)
    assert await whoami(path, times=2) == f"system:serviceaccount:{namespace}:plugged"
    infos = [json.loads(line) for line in runs.read_text().splitlines()]
    assert len(infos) == 2
    assert infos[0]["kind"] == "ExecCredential"
    assert infos[0]["apiVersion"] == "client.authentication.k8s.io/v1"


async def test_token_file_read_again_after_a_401(tmp_path: Path, kube_cluster: KubeCluster) -> None:
    namespace = kube_cluster.namespace("tokfile")
    token = tmp_path / "token"
    token.write_text("not-a-token\n")
    path = kubeconfig(tmp_path / "kc", kube_cluster, {"tokenFile": "token"})
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    async with await KubeClient.from_kubeconfig(path) as client:
        with pytest.raises(UnauthorizedError):
            await client.request_json("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                      body=review)  # fmt: skip
        # Rotated (as the kubelet rotates a projected token): the 401 makes it read again.
        token.write_text(kube_cluster.service_account_token(namespace, "filed") + "\n")
        out = await client.request_json(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review
        )
    assert out["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:filed"
