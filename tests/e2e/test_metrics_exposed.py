"""Every metric the chart's alerts and dashboard name is one a running bridge exposes.

``k8s-bridge run`` as a process, against the emulator over HTTP and a real
nats-server, with heartbeats on and one object too large for the bus (a poison
event, truncated); after the events land, its ``/metrics`` is read with
prometheus_client's own text parser. The names come from what ``helm template``
renders (the PrometheusRule, the dashboard's ConfigMap), so a metric renamed in
the product or misspelt in a rule fails here. Then promtool evaluates the rules
over that scrape held for 30 minutes: a healthy bridge fires none of them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, until, write_config
from tests.fixtures.nats import NatsServer
from tests.unit.chart.test_monitoring import MONITORING, as_promql, promtool, render

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Names of series in a PromQL expression: ours and the process collector's. `up` is
# Prometheus's own (K8sBridgeDown), made by the scrape, not by the bridge.
NAME = re.compile(r"\b(k8s_bridge_[a-z_]+|process_[a-z_]+)\b")

# Declared (HELP/TYPE), and counted only once their event happens, or not here.
NO_SAMPLE_HERE = {
    # The test machine's cgroup sets no memory limit (a pod with resources.limits has one).
    "k8s_bridge_memory_limit_bytes",
    # Set by the stall detection; the family is registered whatever sets it.
    "k8s_bridge_oldest_unacked_age_seconds",
    # Counted only by a sharded bridge.
    "k8s_bridge_shard_client_filtered_total",
    # Labelled counters: a series appears with the first restart, relist, filter
    # failure, suppressed delta of its resource.
    "k8s_bridge_watch_restarts_total",
    "k8s_bridge_relists_total",
    "k8s_bridge_filter_errors_total",
    "k8s_bridge_changes_suppressed_total",
}


def named_metrics() -> set[str]:
    rule = render(MONITORING, "templates/prometheusrule.yaml")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    board = json.loads(render(MONITORING, "templates/dashboard.yaml")["data"]["k8s-bridge.json"])
    exprs += [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return {m for e in exprs for m in NAME.findall(as_promql(e))}


def exposed(text: str) -> tuple[set[str], set[str]]:
    """(names a query may use for the declared families, names that have a sample)."""
    declared: set[str] = set()
    sampled: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        declared.update(family.name + s for s in suffixes.get(family.type, ()))
        sampled.update(s.name for s in family.samples)
    return declared, sampled


def pod(name: str, annotation: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotation:
        meta["annotations"] = {"big": annotation}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
    }


def quiet_rule_tests(text: str, named: set[str], job: str, namespace: str) -> dict[str, Any]:
    """A promtool test file: this scrape held for 30 minutes (gauges as they are,
    heartbeats counting up as they do), and no alert firing at its end."""
    series = [
        {"series": f'up{{job="{job}", namespace="{namespace}", instance="a"}}', "values": "1x30"}
    ]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in named:
                continue
            labels = {**sample.labels, "job": job, "namespace": namespace, "instance": "a"}
            selector = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            step = "+1" if sample.name == "k8s_bridge_heartbeats_sent_total" else "+0"
            series.append(
                {"series": f"{sample.name}{{{selector}}}", "values": f"{sample.value}{step}x30"}
            )
    rule = render(MONITORING, "templates/prometheusrule.yaml")
    names = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return {
        "rule_files": ["alerts.rendered.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "30m", "alertname": n} for n in names],
            }
        ],
    }


def heartbeats(metrics: str) -> float:
    """The heartbeats the bus took so far (the family is there at 0 from the start)."""
    beats = re.search(r"k8s_bridge_heartbeats_sent_total\{[^}]*\} (\S+)", metrics)
    return float(beats.group(1)) if beats is not None else 0.0


async def test_a_running_bridge_exposes_every_metric_the_alerts_and_dashboard_name(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator, nats_control: NatsServer
) -> None:
    config = write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "nats", "nats": {"servers": [nats_control.url]}},
    )
    text = config.read_text().replace("kind: Pod\n", "kind: Pod\n  heartbeatInterval: 0.5\n", 1)
    config.write_text(text)
    named = named_metrics()
    assert len(named) > 20, named
    emulator.create(pod("before"))
    bridge = BridgeProcess(config)
    await bridge.start()
    try:
        await bridge.wait_ready()
        emulator.create(pod("web"))
        # Over nats-server's max_payload (1 MB): refused for good, published truncated.
        emulator.create(pod("huge", annotation="x" * 1_500_000))
        metrics = ""

        async def settled() -> bool:
            nonlocal metrics
            metrics = await bridge.metrics()
            _, sampled = exposed(metrics)
            return (
                {
                    "k8s_bridge_poison_events_total",
                    "k8s_bridge_heartbeats_sent_total",
                    "k8s_bridge_checkpoint_commit_seconds_count",
                }
                <= sampled
                and 'type="added"' in metrics
                and heartbeats(metrics) >= 1
            )

        await until(settled, 30, bridge.tail_log)
    finally:
        assert await bridge.stop() == 0
    declared, sampled = exposed(metrics)
    assert named - declared == set(), "named by the alerts or dashboard, not exposed"
    # Everything else has a sample after this run: the pipelines' gauges and
    # histograms, heartbeats, the poison event, the process collector.
    assert named - sampled <= NO_SAMPLE_HERE, "exposed but without a sample"
    assert re.search(r'k8s_bridge_poison_events_total\{[^}]*outcome="truncated"', metrics)
    assert heartbeats(metrics) >= 1, metrics

    # A healthy bridge sits on the quiet side of every alert (ready, leading, synced,
    # watching, checkpoint close behind, nothing waiting): promtool says none fires.
    rule = render(MONITORING, "templates/prometheusrule.yaml")
    (tmp_path / "alerts.rendered.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "quiet_test.yaml").write_text(
        yaml.safe_dump(quiet_rule_tests(metrics, named, "bridge-k8s-bridge", "bridge"))
    )
    out = promtool("test", "rules", "quiet_test.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
