"""The Helm chart, checked with the real helm CLI and the Kubernetes API schemas.

helm is the one ``tools/realdeps/build`` builds from the Go module proxy (first
on PATH under ``make test``); a missing binary fails these tests, never skips
them. Each case runs ``helm lint --strict`` and ``helm template`` with its values.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bridge.service.settings import load_settings
from tests.fixtures.realdeps import binary

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "k8s-bridge"
KUBE_VERSION = "1.33.0"  # validate manifests against a recent, widely deployed API

sys.path.insert(0, str(ROOT / "tools" / "helm"))
import values_schema  # noqa: E402

DEFAULT_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

HA_NAMESPACED: dict[str, Any] = {
    "replicaCount": 2,
    "leaderElection": {"enabled": True},
    "persistence": {"enabled": False},
    "pdb": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "envFromSecrets": ["bridge-kafka-credentials"],
    "config": {
        "cluster": {"name": "prod"},
        "resources": [
            {"apiVersion": "v1", "kind": "Pod", "namespaces": ["team-a", "team-b"]},
            {"apiVersion": "apps/v1", "kind": "Deployment", "namespaces": ["team-a"]},
            {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "namespaces": ["team-b"]},
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "namespaces": ["team-a"],
            },
            {"apiVersion": "v1", "kind": "Endpoints", "namespaces": ["team-b"]},
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "namespaces": ["team-a"],
            },
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "plural": "widgetz",
                "namespaces": ["team-b"],
            },
        ],
        "sink": {"kind": "kafka", "kafka": {"bootstrapServers": ["kafka:9092"]}},
        "checkpoint": {"kind": "nats-kv"},
    },
}

CLUSTER_WIDE: dict[str, Any] = {
    "config": {
        "resources": [
            {"apiVersion": "v1", "kind": "Node"},
            {"apiVersion": "v1", "kind": "Secret", "namespaces": ["ops"]},
            {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass"},
            {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget"},
            {"apiVersion": "v1", "kind": "Pod"},
            # Same kind again (other selectors: a config the bridge accepts): one rule.
            {"apiVersion": "v1", "kind": "Pod", "namespaces": ["x"], "labelSelector": "tier=web"},
        ],
        "sink": {"kind": "stdout"},
    },
    "rbac": {"selfSubjectAccessReview": False},
}


def kafka_only_values() -> dict[str, Any]:
    """The two-replica, Kafka-only, exactly-once values docs/operations.md shows."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("A two-replica deployment with Kafka alone", 1)[1]
    values: dict[str, Any] = yaml.safe_load(block.split("```yaml\n", 1)[1].split("```", 1)[0])
    return values


SELECTING: dict[str, Any] = {
    "config": {
        "resources": [
            {"group": "apps", "exclude": ["ControllerRevision"]},
            {"group": "", "kinds": ["ConfigMap", "Service"], "namespaces": ["shop"]},
            {"apiVersion": "batch/v1", "kinds": ["CronJob"]},
            {"allKinds": True, "exclude": ["Secret"], "namespaces": ["ops"]},
            {"apiVersion": "v1", "kind": "Pod", "namespaces": ["shop"]},
            # Granted by the group's "*" cluster-wide already: no Role of its own.
            {"apiVersion": "apps/v1", "kind": "Deployment", "namespaces": ["shop"]},
        ],
        "sink": {"kind": "stdout"},
    },
}

CASES: dict[str, dict[str, Any]] = {
    "selecting": {"values": SELECTING, "namespace": "bridge"},
    "default": {"values": {}, "namespace": "bridge"},
    "kafka-only": {"values": kafka_only_values(), "namespace": "bridge"},
    "ha-namespaced": {"values": HA_NAMESPACED, "namespace": "bridge"},
    "cluster-wide": {"values": CLUSTER_WIDE, "namespace": "bridge"},
    "bad-sink": {"values": {"config": {"sink": {"kind": "rabbit"}}}, "namespace": "bridge"},
    "bad-key": {"values": {"config": {"sinks": {}}}, "namespace": "bridge"},
    "replicas-without-election": {
        "values": {"replicaCount": 2, "persistence": {"enabled": False}},
        "namespace": "bridge",
    },
    "replicas-on-sqlite": {
        "values": {
            "replicaCount": 2,
            "leaderElection": {"enabled": True},
            "persistence": {"enabled": False},
        },
        "namespace": "bridge",
    },
    "sharded": {"values": {"sharding": {"replicas": 3, "by": "namespace"}}, "namespace": "bridge"},
    "sharded-standby": {
        "values": {
            "sharding": {"replicas": 4, "standby": True},
            "persistence": {"enabled": False},
            "config": {**DEFAULT_VALUES["config"], "checkpoint": {"kind": "nats-kv"}},
        },
        "namespace": "bridge",
    },
    "mirror": {
        "values": {
            "mirror": {
                "enabled": True,
                "envFromSecrets": ["mirror-postgres"],
                "config": {
                    "source": {"kind": "kafka", "kafka": {"bootstrapServers": ["kafka:9092"]}},
                    "postgres": {"dsn": "postgresql://mirror@pg:5432/k8s"},
                    "history": True,
                    "keepDeleted": True,
                    "server": None,  # null drops the default: no server, no probes
                },
            }
        },
        "namespace": "bridge",
    },
    "mirror-default": {"values": {"mirror": {"enabled": True}}, "namespace": "bridge"},
    "mirror-bad-key": {
        "values": {"mirror": {"enabled": True, "config": {"postgres": {"dsnn": "x"}}}},
        "namespace": "bridge",
    },
    "sharded-standby-sqlite": {
        "values": {"sharding": {"replicas": 2, "standby": True}},
        "namespace": "bridge",
    },
}


def helm_env(home: Path) -> dict[str, str]:
    """helm's cache, config and data under ``home``: nothing read from or written to ~."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    return env


def run_helm(helm: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def lint_messages(output: str, level: str) -> list[str]:
    """The ``[LEVEL] path: message`` entries of ``helm lint`` (an entry may span lines)."""
    blocks: list[list[str]] = []
    for line in output.splitlines():
        if line.startswith("[") or not line.strip() or line.startswith("Error:"):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks if b[0].startswith(f"[{level}]")]


def helm_case(helm: str, env: dict[str, str], workdir: Path, name: str) -> dict[str, Any]:
    case = CASES[name]
    values = workdir / f"{name}.values.json"
    values.write_text(json.dumps(case["values"]))
    common = ["-f", str(values), "--namespace", case["namespace"], "--kube-version", KUBE_VERSION]
    lint = run_helm(helm, env, "lint", "--strict", str(CHART), *common)
    lint_out = lint.stdout + lint.stderr
    result: dict[str, Any] = {
        "lint": {
            "code": lint.returncode,
            "output": lint_out,
            "errors": lint_messages(lint_out, "ERROR"),
            "warnings": lint_messages(lint_out, "WARNING"),
        }
    }
    rendered = run_helm(helm, env, "template", case.get("release", "bridge"), str(CHART), *common)
    if rendered.returncode == 0:
        result["manifests"] = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    else:
        result["renderError"] = rendered.stderr.strip() or f"helm exited {rendered.returncode}"
    return result


@pytest.fixture(scope="module")
def helm_results() -> Iterator[dict[str, Any]]:
    helm = binary("helm")
    with tempfile.TemporaryDirectory(prefix="k8s-bridge-helm-") as tmp:
        workdir = Path(tmp)
        env = helm_env(workdir)
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(helm_case, helm, env, workdir, name) for name in CASES}
            yield {name: f.result() for name, f in futures.items()}


def docs(case: dict[str, Any]) -> list[dict[str, Any]]:
    assert "renderError" not in case, case.get("renderError")
    manifests: list[dict[str, Any]] = case["manifests"]
    return manifests


def find(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    out = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.add(
                    (
                        group,
                        resource,
                        tuple(sorted(rule["verbs"])),
                        tuple(rule.get("resourceNames", [])),
                    )
                )
    return out


WATCH = ("list", "watch")


# --- lint ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["default", "ha-namespaced", "cluster-wide", "sharded", "sharded-standby"]
)
def test_helm_lint_strict_is_clean(helm_results: dict[str, Any], name: str) -> None:
    lint = helm_results[name]["lint"]
    assert lint["errors"] == [] and lint["warnings"] == [], lint["output"]
    assert lint["code"] == 0, lint["output"]


@pytest.mark.parametrize(
    ("name", "needle"),
    [("bad-sink", "/config/sink/kind"), ("bad-key", "sinks")],
)
def test_values_schema_rejects_bad_bridge_config(
    helm_results: dict[str, Any], name: str, needle: str
) -> None:
    lint = helm_results[name]["lint"]
    assert lint["code"] != 0, lint["output"]
    assert needle in " ".join(lint["errors"]), lint["output"]
    assert needle in helm_results[name]["renderError"]


def test_replicas_without_leader_election_refuse_to_render(helm_results: dict[str, Any]) -> None:
    assert "leaderElection.enabled" in helm_results["replicas-without-election"]["renderError"]


def test_replicas_on_a_sqlite_checkpoint_refuse_to_render(helm_results: dict[str, Any]) -> None:
    # SQLite is one file on one host: across pods each would resume from its own.
    error = helm_results["replicas-on-sqlite"]["renderError"]
    assert "config.checkpoint.kind: sqlite" in error and "nats-kv or kafka" in error, error


# --- every manifest is valid Kubernetes ------------------------------------------------


@pytest.mark.parametrize(
    "name", ["default", "ha-namespaced", "cluster-wide", "sharded", "sharded-standby"]
)
def test_every_manifest_validates_against_kubernetes_schema(
    helm_results: dict[str, Any], name: str
) -> None:
    objs = docs(helm_results[name])
    assert objs
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            # A CRD kubernetes-validate has no schema for: check the fields it relies on.
            assert obj["kind"] == "ServiceMonitor"
            assert obj["spec"]["endpoints"][0]["port"] == "http"
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(
    "name", ["default", "ha-namespaced", "cluster-wide", "sharded", "sharded-standby"]
)
def test_configmap_holds_a_config_the_bridge_accepts(
    helm_results: dict[str, Any], name: str, tmp_path: Path
) -> None:
    (cm,) = find(docs(helm_results[name]), "ConfigMap")
    path = tmp_path / "bridge.yaml"
    path.write_text(cm["data"]["bridge.yaml"])
    settings = load_settings(str(path), env={})
    values = copy.deepcopy(DEFAULT_VALUES)
    expected_resources = (CASES[name]["values"].get("config") or values["config"])["resources"]
    assert [r.kind for r in settings.resources] == [r["kind"] for r in expected_resources]
    if name == "ha-namespaced":
        le = settings.leader_election
        assert le.enabled and le.namespace == "bridge" and le.lease_name == "bridge-k8s-bridge"
        assert settings.checkpoint.kind == "nats-kv"


# --- deployment hardening and wiring ---------------------------------------------------


def test_deployment_is_hardened_and_probed(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["default"])
    (deploy,) = find(objs, "Deployment")
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["args"] == ["run", "--config", "/etc/k8s-bridge/bridge.yaml"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/k8s-bridge" and mounts["tmp"] == "/tmp"
    volumes = {v["name"]: v for v in spec["volumes"]}
    (pvc,) = find(objs, "PersistentVolumeClaim")
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    assert len(pod["metadata"]["annotations"]["checksum/config"]) == 64
    assert not find(objs, "PodDisruptionBudget") and not find(objs, "ServiceMonitor")


def test_config_checksum_follows_the_config(helm_results: dict[str, Any]) -> None:
    sums = {
        name: find(docs(helm_results[name]), "Deployment")[0]["spec"]["template"]["metadata"][
            "annotations"
        ]["checksum/config"]
        for name in ("default", "ha-namespaced", "cluster-wide")
    }
    assert len(set(sums.values())) == 3


def test_ha_variant_wiring(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["ha-namespaced"])
    (deploy,) = find(objs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in container["env"]}
    assert env["BRIDGE_LEADERELECTION__IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.name"
    )
    assert container["envFrom"] == [
        {"secretRef": {"name": "bridge-kafka-credentials", "optional": True}}
    ]
    assert {v["name"]: v for v in spec["volumes"]}["state"] == {"name": "state", "emptyDir": {}}
    assert not find(objs, "PersistentVolumeClaim")
    (pdb,) = find(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    (monitor,) = find(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


# --- sharding.replicas: a StatefulSet, the pod index is the shard ----------------------------


def _shard_sets(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in find(objs, "StatefulSet")}


def test_sharded_mode_runs_a_statefulset_whose_pod_index_is_the_shard(
    helm_results: dict[str, Any],
) -> None:
    objs = docs(helm_results["sharded"])
    assert not find(objs, "Deployment") and not find(objs, "PersistentVolumeClaim")
    (sts,) = _shard_sets(objs).values()
    assert sts["spec"]["replicas"] == 3
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert env["BRIDGE_SHARDING__SHARDINDEX"]["value"] == "$(POD_INDEX)"
    # Each shard its own SQLite volume; the chart owns shards and by.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert "state" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    (cm,) = find(objs, "ConfigMap")
    config = yaml.safe_load(cm["data"]["bridge.yaml"])
    assert config["sharding"] == {"shards": 3, "by": "namespace"}


def test_sharded_standby_pairs_elect_on_a_lease_per_shard(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["sharded-standby"])
    sets = _shard_sets(objs)
    assert set(sets) == {"bridge-k8s-bridge", "bridge-k8s-bridge-standby"}
    selectors = [s["spec"]["selector"]["matchLabels"] for s in sets.values()]
    assert selectors[0] != selectors[1], "two StatefulSets must not adopt each other's pods"
    for sts in sets.values():
        assert sts["spec"]["replicas"] == 4
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["BRIDGE_SHARDING__SHARDINDEX"]["value"] == "$(POD_INDEX)"
        assert "volumeClaimTemplates" not in sts["spec"]
    (role,) = find(objs, "Role", "-leader-election")
    leases = tuple(f"bridge-k8s-bridge-shard-{i}" for i in range(4))
    assert ("coordination.k8s.io", "leases", ("get", "update"), leases) in rule_set(role["rules"])
    (cm,) = find(objs, "ConfigMap")
    config = yaml.safe_load(cm["data"]["bridge.yaml"])
    assert config["leaderElection"]["enabled"] is True
    assert config["sharding"] == {"shards": 4, "by": "uid"}


def test_sharded_standby_refuses_a_per_pod_sqlite_file(helm_results: dict[str, Any]) -> None:
    error = helm_results["sharded-standby-sqlite"].get("renderError", "")
    assert "cannot share a SQLite file" in error and "nats-kv" in error


# --- RBAC equals what the resource list needs ---------------------------------------------


def test_rbac_namespaced_roles_grant_exactly_list_watch(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["ha-namespaced"])
    assert not find(objs, "ClusterRole", "-watch") and not find(
        objs, "ClusterRoleBinding", "-watch"
    )
    roles = {r["metadata"]["namespace"]: r for r in find(objs, "Role", "-watch")}
    assert set(roles) == {"team-a", "team-b"}
    assert rule_set(roles["team-a"]["rules"]) == {
        ("", "pods", WATCH, ()),
        ("apps", "deployments", WATCH, ()),
        ("networking.k8s.io", "networkpolicies", WATCH, ()),
        ("gateway.networking.k8s.io", "gateways", WATCH, ()),
    }
    assert rule_set(roles["team-b"]["rules"]) == {
        ("", "pods", WATCH, ()),
        ("networking.k8s.io", "ingresses", WATCH, ()),
        ("", "endpoints", WATCH, ()),
        ("example.com", "widgetz", WATCH, ()),
    }
    bindings = {b["metadata"]["namespace"]: b for b in find(objs, "RoleBinding", "-watch")}
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "bridge-k8s-bridge", "namespace": "bridge"}
        ]


def test_rbac_leader_election_lease_access(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["ha-namespaced"])
    (role,) = find(objs, "Role", "-leader-election")
    assert role["metadata"]["namespace"] == "bridge"
    assert rule_set(role["rules"]) == {
        ("coordination.k8s.io", "leases", ("create",), ()),
        ("coordination.k8s.io", "leases", ("get", "update"), ("bridge-k8s-bridge",)),
    }
    (binding,) = find(objs, "RoleBinding", "-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert not find(docs(helm_results["default"]), "Role", "-leader-election")


def test_rbac_cluster_wide_only_for_resources_that_span_all_namespaces(
    helm_results: dict[str, Any],
) -> None:
    objs = docs(helm_results["cluster-wide"])
    (role,) = find(objs, "ClusterRole", "-watch")
    assert rule_set(role["rules"]) == {
        ("", "nodes", WATCH, ()),
        ("", "pods", WATCH, ()),
        ("storage.k8s.io", "storageclasses", WATCH, ()),
        ("policy", "poddisruptionbudgets", WATCH, ()),
    }
    assert len(role["rules"]) == 4, "duplicate resource entries give one rule"
    # Secrets are configured in "ops" only: a Role there, never Secrets cluster-wide.
    # The Pod entry limited to "x" adds no Role: the ClusterRole grants pods anyway.
    (secrets,) = find(objs, "Role", "-watch")
    assert secrets["metadata"]["namespace"] == "ops"
    assert rule_set(secrets["rules"]) == {("", "secrets", WATCH, ())}
    (binding,) = find(objs, "RoleBinding", "-watch")
    assert binding["metadata"]["namespace"] == "ops"
    assert binding["roleRef"]["name"] == secrets["metadata"]["name"]
    assert not find(objs, "ClusterRole", "-check"), "selfSubjectAccessReview: false"


def test_rbac_self_subject_access_review_for_check(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["default"])
    (role,) = find(objs, "ClusterRole", "-check")
    assert rule_set(role["rules"]) == {
        ("authorization.k8s.io", "selfsubjectaccessreviews", ("create",), ())
    }
    (watch,) = find(objs, "ClusterRole", "-watch")
    assert rule_set(watch["rules"]) == {("", "pods", WATCH, ()), ("apps", "deployments", WATCH, ())}


# --- no helm needed ----------------------------------------------------------------------


def test_values_schema_is_in_sync_with_settings() -> None:
    committed = (CHART / "values.schema.json").read_text()
    assert committed == values_schema.render(), "run: python tools/helm/values_schema.py"


def test_default_values_config_is_a_valid_bridge_config(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(DEFAULT_VALUES["config"]))
    settings = load_settings(str(path), env={})
    assert settings.checkpoint.path.startswith(DEFAULT_VALUES["persistence"]["mountPath"] + "/")


def test_the_kafka_only_deployment_of_the_docs_renders_and_loads(
    helm_results: dict[str, Any], tmp_path: Path
) -> None:
    result = helm_results["kafka-only"]
    assert result["lint"]["code"] == 0, result["lint"]["output"]
    objs = docs(result)
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    (deploy,) = find(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert not find(objs, "PersistentVolumeClaim")
    (cm,) = find(objs, "ConfigMap")
    path = tmp_path / "bridge.yaml"
    path.write_text(cm["data"]["bridge.yaml"])
    settings = load_settings(str(path), env={})
    assert settings.sink.kafka.exactly_once and settings.checkpoint.kind == "kafka"
    assert settings.leader_election.enabled


# --- k8s-bridge mirror ----------------------------------------------------------------


def test_mirror_renders_a_hardened_deployment_with_a_config_the_mirror_accepts(
    helm_results: dict[str, Any], tmp_path: Path
) -> None:
    from bridge.mirror.settings import load_mirror_settings

    case = helm_results["mirror"]
    lint = case["lint"]
    assert lint["errors"] == [] and lint["warnings"] == [] and lint["code"] == 0, lint["output"]
    objs = docs(case)
    for obj in objs:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    (cm,) = find(objs, "ConfigMap", "-mirror")
    path = tmp_path / "mirror.yaml"
    path.write_text(cm["data"]["mirror.yaml"])
    settings = load_mirror_settings(str(path))
    assert settings.source.identity == "kafka:k8s-events" and settings.history
    (deploy,) = find(objs, "Deployment", "-mirror")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["mirror", "--config", "/etc/k8s-bridge-mirror/mirror.yaml"]
    assert container["envFrom"] == [{"secretRef": {"name": "mirror-postgres", "optional": True}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    # The case's mirror.config drops the server: no port, no probes.
    assert "ports" not in container and "readinessProbe" not in container
    # The bridge's Service and Deployment select none of the mirror's pods.
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    (service,) = find(objs, "Service")
    (bridge,) = [d for d in find(objs, "Deployment") if d is not deploy]
    for selector in (service["spec"]["selector"], bridge["spec"]["selector"]["matchLabels"]):
        assert not all(labels.get(k) == v for k, v in selector.items()), selector
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_default_mirror_is_probed_on_its_server(helm_results: dict[str, Any]) -> None:
    (deploy,) = find(docs(helm_results["mirror-default"]), "Deployment", "-mirror")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_no_mirror_unless_enabled(helm_results: dict[str, Any]) -> None:
    assert not find(docs(helm_results["default"]), "Deployment", "-mirror")


def test_values_schema_rejects_a_bad_mirror_key(helm_results: dict[str, Any]) -> None:
    lint = helm_results["mirror-bad-key"]["lint"]
    assert lint["code"] != 0 and "dsnn" in " ".join(lint["errors"]), lint["output"]


def test_rbac_of_entries_selecting_kinds(helm_results: dict[str, Any]) -> None:
    objs = docs(helm_results["selecting"])
    (watch,) = find(objs, "ClusterRole", "-watch")
    # A pattern (kinds: ["*"], the default) grants the group's every resource; named
    # kinds grant each; the kinds exist only in discovery, so exclude narrows nothing.
    assert rule_set(watch["rules"]) == {("apps", "*", WATCH, ()), ("batch", "cronjobs", WATCH, ())}
    roles = {r["metadata"]["namespace"]: r for r in find(objs, "Role", "-watch")}
    assert rule_set(roles["ops"]["rules"]) == {("*", "*", WATCH, ())}
    assert rule_set(roles["shop"]["rules"]) == {
        ("", "configmaps", WATCH, ()),
        ("", "services", WATCH, ()),
        ("", "pods", WATCH, ()),
    }
    # Following the cluster: CRDs and APIServices watched, only with a selecting entry.
    (kinds,) = find(objs, "ClusterRole", "-kinds")
    assert rule_set(kinds["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", WATCH, ()),
        ("apiregistration.k8s.io", "apiservices", WATCH, ()),
    }
    (binding,) = find(objs, "ClusterRoleBinding", "-kinds")
    assert binding["roleRef"]["name"] == kinds["metadata"]["name"]
    assert not find(docs(helm_results["default"]), "ClusterRole", "-kinds")
