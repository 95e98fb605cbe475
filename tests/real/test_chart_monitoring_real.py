"""The chart with its monitoring options on, accepted by a real kube-apiserver.

``helm template`` with the ServiceMonitor, the PrometheusRule and the dashboard
ConfigMap enabled; every object it renders goes to the API server as a
server-side dry run with strict field validation (``kubectl apply
--dry-run=server --validate=strict``): admission, defaulting and schema checks
run, nothing is stored, and a field the schema does not know is an error.

The Prometheus Operator's CRDs are not installed from upstream: minimal
structural CRDs of our own stand for them. The PrometheusRule's schema spells
out the rule file's fields (groups of rules: alert/record, expr, for, labels,
annotations as strings), so the rendered rules are checked field by field; the
ServiceMonitor's keeps its spec as given (x-kubernetes-preserve-unknown-fields).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bridge_process import until
from tests.fixtures.kube import KubeCluster
from tests.fixtures.realdeps import binary
from tests.real.test_chart_rbac import CHART, helm

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GROUP = "monitoring.coreos.com"
STRING = {"type": "string"}
STRING_MAP = {"type": "object", "additionalProperties": STRING}


def crd(kind: str, plural: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec},
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


RULE = {
    "type": "object",
    "properties": {
        "alert": STRING,
        "record": STRING,
        "expr": {"x-kubernetes-int-or-string": True},
        "for": STRING,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    "required": ["expr"],
}
CRDS = [
    crd(
        "PrometheusRule",
        "prometheusrules",
        {
            "type": "object",
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": STRING,
                            "interval": STRING,
                            "rules": {"type": "array", "items": RULE},
                        },
                        "required": ["name", "rules"],
                    },
                }
            },
            "required": ["groups"],
        },
    ),
    crd(
        "ServiceMonitor",
        "servicemonitors",
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    ),
]


@pytest.fixture
def monitoring_crds(kube_cluster: KubeCluster) -> Iterator[None]:
    for c in CRDS:
        kube_cluster.create(c)
    try:
        yield
    finally:
        for c in CRDS:
            kube_cluster.raw(
                "DELETE",
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c['metadata']['name']}",
            )


def established(kube_cluster: KubeCluster, name: str) -> bool:
    got = kube_cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    conditions = (got.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def dry_run(kubeconfig: Path, ns: str, manifest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            binary("kubectl"), "--kubeconfig", str(kubeconfig), "-n", ns,
            "apply", "--dry-run=server", "--validate=strict", "-f", str(manifest),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_the_monitoring_objects_pass_a_server_side_dry_run(
    kube_cluster: KubeCluster, kube_namespace: str, monitoring_crds: None, tmp_path: Path
) -> None:
    for c in CRDS:
        name = c["metadata"]["name"]
        await until(
            lambda n=name: established(kube_cluster, n), 30, lambda n=name: f"{n} not established"
        )
    ns = kube_namespace
    values = {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "alertLabels": {"team": "platform"}},
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "k8s-bridge"}},
        "pdb": {"enabled": True},
    }
    (tmp_path / "values.json").write_text(json.dumps(values))
    admin = kube_cluster.write_kubeconfig(tmp_path / "admin.kubeconfig")
    rendered = helm(
        admin, tmp_path / "helm", "template", ns, str(CHART), "-n", ns,
        "-f", str(tmp_path / "values.json"),
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered.stdout)

    out = dry_run(admin, ns, manifest)
    assert out.returncode == 0, out.stderr
    accepted = [line for line in out.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(docs), out.stdout
    fullname = f"{ns}-k8s-bridge"
    for obj in (
        f"prometheusrule.{GROUP}/{fullname}",
        f"servicemonitor.{GROUP}/{fullname}",
        f"configmap/{fullname}-dashboard",
    ):
        assert f"{obj} created (server dry run)" in accepted, out.stdout
    # Nothing was stored.
    assert kube_cluster.list(f"{GROUP}/v1", "PrometheusRule", namespace=ns)["items"] == []

    # The dry run has teeth: a misspelt rule field is refused by the schema.
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["exper"] = "up == 0"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(rule))
    refused = dry_run(admin, ns, bad)
    assert refused.returncode != 0 and "exper" in refused.stderr, refused.stdout + refused.stderr
