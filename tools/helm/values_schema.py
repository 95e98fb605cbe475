"""Write charts/k8s-bridge/values.schema.json.

The chart's ``config`` value is the bridge's own config file, so its schema is
the one the bridge validates with (``bridge.service.settings.settings_json_schema``);
the rest describes the chart's knobs. A test fails when the committed file and
this output differ: run ``python tools/helm/values_schema.py`` after changing
settings or chart values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "charts" / "k8s-bridge" / "values.schema.json"


# prometheusRule.thresholds: the placeholders of charts/k8s-bridge/files/alerts.yaml.
_ALERT_DURATIONS = (
    "downFor",
    "notReadyFor",
    "notSyncedFor",
    "watchDownFor",
    "checkpointLagFor",
    "unacknowledgedWindow",
    "stallFor",
    "poisonWindow",
    "fencedWindow",
    "noLeaderFor",
    "heartbeatsAbsentFor",
    "memoryFor",
)
_ALERT_NUMBERS = (
    "checkpointLagSeconds",
    "checkpointLagResourceVersions",
    "unacknowledgedMin",
    "stallSeconds",
    "memoryRatio",
)


def _obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **extra}


def build() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from bridge.mirror.settings import mirror_json_schema
    from bridge.service.settings import settings_json_schema

    mirror_config = mirror_json_schema()
    mirror_defs = mirror_config.pop("$defs", {})
    mirror_config.pop("title", None)
    mirror_config["description"] = "The mirror configuration, rendered verbatim as mirror.yaml"
    config = settings_json_schema()
    shared = set(mirror_defs) & set(config.get("$defs", {}))
    assert all(mirror_defs[k] == config["$defs"][k] for k in shared), shared
    defs = config.pop("$defs", {})
    config.pop("title", None)
    config["description"] = "The bridge configuration, rendered verbatim as bridge.yaml"
    string = {"type": "string"}
    boolean = {"type": "boolean"}
    anything = {"type": "object"}
    # A Prometheus duration: 90s, 15m, 1h30m.
    duration = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "k8s-bridge chart values",
        "type": "object",
        "required": ["config", "image"],
        "properties": {
            "config": config,
            "image": _obj(
                {
                    "repository": {"type": "string", "minLength": 1},
                    "tag": string,
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                },
                required=["repository"],
                additionalProperties=False,
            ),
            "imagePullSecrets": {"type": "array"},
            "nameOverride": string,
            "fullnameOverride": string,
            "replicaCount": {"type": "integer", "minimum": 0},
            "leaderElection": _obj({"enabled": boolean}, additionalProperties=False),
            "mirror": _obj(
                {
                    "enabled": boolean,
                    "config": mirror_config,
                    "envFromSecrets": {"type": "array", "items": string},
                    "extraEnv": {"type": "array", "items": anything},
                    "resources": anything,
                },
                additionalProperties=False,
            ),
            "sharding": _obj(
                {
                    "replicas": {"type": "integer", "minimum": 0},
                    "by": {"enum": ["uid", "namespace"]},
                    "standby": boolean,
                },
                additionalProperties=False,
            ),
            "serviceAccount": _obj(
                {
                    "create": boolean,
                    "name": string,
                    "annotations": anything,
                    "automountServiceAccountToken": boolean,
                },
                additionalProperties=False,
            ),
            "rbac": _obj(
                {
                    "create": boolean,
                    "selfSubjectAccessReview": boolean,
                    "snapshotCallers": {
                        "type": "array",
                        "items": _obj(
                            {
                                "kind": {"enum": ["ServiceAccount", "User", "Group"]},
                                "name": {"type": "string", "minLength": 1},
                                "namespace": string,
                                "apiGroup": string,
                            },
                            required=["kind", "name"],
                            additionalProperties=False,
                        ),
                    },
                },
                additionalProperties=False,
            ),
            "persistence": _obj(
                {
                    "enabled": boolean,
                    "mountPath": {"type": "string", "pattern": "^/"},
                    "existingClaim": string,
                    "storageClassName": string,
                    "accessModes": {"type": "array", "items": string, "minItems": 1},
                    "size": string,
                },
                additionalProperties=False,
            ),
            "envFromSecrets": {"type": "array", "items": string},
            "extraEnv": {"type": "array", "items": anything},
            "service": _obj(
                {
                    "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "annotations": anything,
                },
                additionalProperties=False,
            ),
            "serviceMonitor": _obj(
                {
                    "enabled": boolean,
                    "interval": string,
                    "scrapeTimeout": string,
                    "labels": anything,
                },
                additionalProperties=False,
            ),
            "prometheusRule": _obj(
                {
                    "enabled": boolean,
                    "labels": anything,
                    "alertLabels": anything,
                    "disabled": {"type": "array", "items": string},
                    "runbookBaseUrl": string,
                    "thresholds": _obj(
                        {
                            **{name: duration for name in _ALERT_DURATIONS},
                            **{name: {"type": "number", "minimum": 0} for name in _ALERT_NUMBERS},
                        },
                        additionalProperties=False,
                    ),
                },
                additionalProperties=False,
            ),
            "dashboard": _obj(
                {"enabled": boolean, "labels": anything, "annotations": anything},
                additionalProperties=False,
            ),
            "pdb": _obj(
                {
                    "enabled": boolean,
                    "minAvailable": {"type": ["integer", "string"]},
                    "maxUnavailable": {"type": ["integer", "string"]},
                },
                additionalProperties=False,
            ),
            "podAnnotations": anything,
            "podLabels": anything,
            "podSecurityContext": anything,
            "securityContext": anything,
            "resources": anything,
            "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
            "nodeSelector": anything,
            "tolerations": {"type": "array"},
            "affinity": anything,
            "priorityClassName": string,
        },
        # The mirror's source reuses the bridge's sink sections: the same definitions.
        "$defs": {**mirror_defs, **defs},
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
