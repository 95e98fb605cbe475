"""Write charts/k8s-bridge/files/dashboard.json, the Grafana dashboard of k8s-bridge.

Panels are listed here as (title, unit, queries); the JSON around them is the same
for each. A test fails when the committed file and this output differ (run
``python tools/monitoring/dashboard.py`` after changing a panel), and another
checks every query with promtool and against a running bridge's /metrics.

Variables: ``$datasource`` (a Prometheus data source), ``$namespace``, ``$job``
(the release's Service) and ``$resource`` (multi-select, all by default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "charts" / "k8s-bridge" / "files" / "dashboard.json"
UID = "k8s-bridge"

# Every series of the bridge, narrowed by the dashboard's variables.
SEL = 'namespace=~"$namespace", job=~"$job"'
RES = f'{SEL}, resource=~"$resource"'
RATE = "$__rate_interval"


def quantiles(metric: str, by: str, sel: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RATE}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.99)
    ]


# (row, [(title, unit, [(expr, legend)])])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Health",
        [
            ("Ready replicas", "short", [(f"sum(k8s_bridge_ready{{{SEL}}})", "ready")]),
            ("Leaders", "short", [(f"sum(k8s_bridge_leader{{{SEL}}})", "leading")]),
            (
                "Watches up / synced",
                "short",
                [
                    (f"sum by (resource) (k8s_bridge_watch_up{{{RES}}})", "up {{resource}}"),
                    (f"sum by (resource) (k8s_bridge_synced{{{RES}}})", "synced {{resource}}"),
                ],
            ),
            (
                "Restarts",
                "short",
                [
                    (
                        f"sum by (instance) (changes(process_start_time_seconds{{{SEL}}}[1h]))",
                        "process restarts (1h) {{instance}}",
                    ),
                    (
                        f"sum by (resource, reason) (increase(k8s_bridge_watch_restarts_total{{{RES}}}[1h]))",
                        "watch restarts (1h) {{resource}} {{reason}}",
                    ),
                    (
                        f"sum by (resource, reason) (increase(k8s_bridge_relists_total{{{RES}}}[1h]))",
                        "relists (1h) {{resource}} {{reason}}",
                    ),
                ],
            ),
        ],
    ),
    (
        "Events",
        [
            (
                "Events published /s",
                "ops",
                [
                    (
                        f"sum by (resource, type) (rate(k8s_bridge_events_published_total{{{RES}}}[{RATE}]))",
                        "{{resource}} {{type}}",
                    )
                ],
            ),
            (
                "Suppressed and filtered /s",
                "ops",
                [
                    (
                        f"sum by (resource, reason) (rate(k8s_bridge_changes_suppressed_total{{{RES}}}[{RATE}]))",
                        "suppressed {{resource}} {{reason}}",
                    ),
                    (
                        f"sum by (resource) (rate(k8s_bridge_filter_errors_total{{{RES}}}[{RATE}]))",
                        "filter errors {{resource}}",
                    ),
                    (
                        f"sum by (resource) (rate(k8s_bridge_shard_client_filtered_total{{{RES}}}[{RATE}]))",
                        "outside this shard {{resource}}",
                    ),
                ],
            ),
            (
                "Poison events",
                "short",
                [
                    (
                        f"sum by (resource, outcome) (increase(k8s_bridge_poison_events_total{{{RES}}}[{RATE}]))",
                        "{{resource}} {{outcome}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Lag",
        [
            (
                "Checkpoint lag",
                "s",
                [
                    (
                        f"max by (resource) (k8s_bridge_checkpoint_lag_seconds{{{RES}}})",
                        "{{resource}}",
                    )
                ],
            ),
            (
                "Checkpoint behind the watch (resourceVersions)",
                "short",
                [
                    (
                        f"max by (resource) (k8s_bridge_watch_resource_version{{{RES}}}"
                        f" - k8s_bridge_checkpoint_resource_version{{{RES}}})",
                        "{{resource}}",
                    )
                ],
            ),
            (
                "Unacknowledged events",
                "short",
                [
                    (
                        f"sum by (resource) (k8s_bridge_unacknowledged{{{RES}}})",
                        "{{resource}}",
                    )
                ],
            ),
            (
                "Oldest unacknowledged event",
                "s",
                [
                    (
                        f"max by (resource) (k8s_bridge_oldest_unacked_age_seconds{{{RES}}})",
                        "{{resource}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Publishing and checkpoints",
        [
            (
                "Batch size (events per publish)",
                "short",
                [
                    *quantiles("k8s_bridge_publish_batch_size", "resource", RES),
                    (
                        f"sum by (resource) (rate(k8s_bridge_publish_batch_size_sum{{{RES}}}[{RATE}]))"
                        f" / sum by (resource) (rate(k8s_bridge_publish_batch_size_count{{{RES}}}[{RATE}]))",
                        "mean {{resource}}",
                    ),
                ],
            ),
            (
                "Publish latency",
                "s",
                quantiles("k8s_bridge_publish_latency_seconds", "sink", SEL),
            ),
            (
                "Checkpoint commit time",
                "s",
                quantiles("k8s_bridge_checkpoint_commit_seconds", "resource", RES),
            ),
            (
                "Kafka producers fenced",
                "short",
                [
                    (
                        f"sum by (instance) (increase(k8s_bridge_producer_fenced_total{{{SEL}}}[1h]))",
                        "fenced (1h) {{instance}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Memory",
        [
            (
                "Memory per cached object",
                "bytes",
                [
                    (
                        f"sum by (instance) (process_resident_memory_bytes{{{SEL}}})"
                        f" / sum by (instance) (k8s_bridge_cache_objects{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
            ),
            (
                "Resident memory and limit",
                "bytes",
                [
                    (f"process_resident_memory_bytes{{{SEL}}}", "resident {{instance}}"),
                    (f"k8s_bridge_memory_limit_bytes{{{SEL}}}", "limit {{instance}}"),
                ],
            ),
            (
                "Cached objects",
                "short",
                [
                    (
                        f"sum by (resource) (k8s_bridge_cache_objects{{{RES}}})",
                        "{{resource}}",
                    )
                ],
            ),
        ],
    ),
]


def variable(name: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"var-{name}"},
        "definition": query,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*" if multi else None,
        "current": {},
        "sort": 1,
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row, row_panels in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        width = 24 // len(row_panels)
        for i, (title, unit, queries) in enumerate(row_panels):
            panels.append(
                {
                    "id": pid,
                    "type": "timeseries",
                    "title": title,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": width, "x": i * width, "y": y},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {
                            "refId": chr(ord("A") + n),
                            "expr": expr,
                            "legendFormat": legend,
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        }
                        for n, (expr, legend) in enumerate(queries)
                    ],
                }
            )
            pid += 1
        y += 8
    return {
        "uid": UID,
        "title": "k8s-bridge",
        "tags": ["k8s-bridge", "kubernetes"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                variable("namespace", "label_values(k8s_bridge_ready, namespace)"),
                variable("job", 'label_values(k8s_bridge_ready{namespace=~"$namespace"}, job)'),
                variable(
                    "resource",
                    'label_values(k8s_bridge_watch_up{namespace=~"$namespace", job=~"$job"},'
                    " resource)",
                    multi=True,
                ),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every query in ``dashboard``, variables included."""
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [
        (f"variable {v['name']}", v["query"]["query"])
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


if __name__ == "__main__":
    TARGET.write_text(render())
    print(TARGET)
