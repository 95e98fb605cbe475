"""The chart's alerts and dashboard, judged by the real promtool and helm.

The rules are what ``helm template`` renders (files/alerts.yaml with the values'
thresholds); promtool checks them (``check rules``) and runs the unit tests of
alerts_test.yaml, where every alert fires once and stays quiet once. Every
dashboard query goes through promtool's parser in a throwaway recording-rule
file. Both binaries come from ``tools/realdeps/build``; a missing one fails.
Whether the metrics they name exist is tests/e2e/test_metrics_exposed.py's part.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.realdeps import binary
from tests.unit.chart.test_chart import CHART, ROOT, helm_env, run_helm

sys.path.insert(0, str(ROOT / "tools" / "monitoring"))
import dashboard

HERE = Path(__file__).resolve().parent
UNIT_TESTS = HERE / "alerts_test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
RELEASE = "bridge"
NAMESPACE = "bridge"
MONITORING = {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}


def render(values: dict[str, Any], show: str) -> dict[str, Any]:
    """One template of the chart rendered by helm with ``values``."""
    with tempfile.TemporaryDirectory(prefix="k8s-bridge-helm-") as tmp:
        workdir = Path(tmp)
        values_file = workdir / "values.json"
        values_file.write_text(json.dumps(values))
        out = run_helm(
            binary("helm"),
            helm_env(workdir),
            "template", RELEASE, str(CHART), "-n", NAMESPACE,
            "-f", str(values_file), "--show-only", show,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = yaml.safe_load(out.stdout)
    return doc


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def rule() -> dict[str, Any]:
    """The PrometheusRule of the default thresholds."""
    return render(MONITORING, "templates/prometheusrule.yaml")


@pytest.fixture
def rules_dir(rule: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The rendered rules as a Prometheus rule file beside a copy of the unit tests."""
    (tmp_path / "alerts.rendered.yaml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    yield tmp_path


def alerts(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]


# --- the rules ------------------------------------------------------------------------


def test_the_rendered_rules_pass_promtool_check(rules_dir: Path) -> None:
    out = promtool("check", "rules", "alerts.rendered.yaml", cwd=rules_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout, out.stdout


def test_every_alert_passes_its_promtool_unit_tests(rules_dir: Path) -> None:
    out = promtool("test", "rules", UNIT_TESTS.name, cwd=rules_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_case_firing_and_a_case_quiet(rule: dict[str, Any]) -> None:
    cases = [
        case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]  # fmt: skip
    for a in alerts(rule):
        mine = [c for c in cases if c["alertname"] == a["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{a['alert']}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{a['alert']}: no quiet case"


def test_every_alert_links_a_runbook_section_of_operations_md(rule: dict[str, Any]) -> None:
    text = OPERATIONS.read_text()
    # GitHub's anchors: the heading lowercased, punctuation dropped, spaces as dashes.
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    for a in alerts(rule):
        url = a["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{a['alert'].lower()}", url
        assert a["alert"].lower() in anchors, f"docs/operations.md has no section {a['alert']}"
        section = text.split(f"### {a['alert']}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**Means**", "**Check**", "**Do**"):
            assert part in section, f"runbook of {a['alert']} lacks {part}"


def test_thresholds_labels_and_disabled_alerts_come_from_values() -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "prometheus"},
            "alertLabels": {"team": "platform", "severity": "page"},
            "disabled": ["K8sBridgeMemoryNearLimit"],
            "runbookBaseUrl": "https://runbooks.example/k8s-bridge",
            "thresholds": {"stallSeconds": 900, "stallFor": "7m", "memoryRatio": 0.8},
        }
    }
    rule = render(values, "templates/prometheusrule.yaml")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    by_name = {a["alert"]: a for a in alerts(rule)}
    assert "K8sBridgeMemoryNearLimit" not in by_name and len(by_name) == 12
    stalled = by_name["K8sBridgeStalled"]
    assert "k8s_bridge_oldest_unacked_age_seconds > 900)" in stalled["expr"]
    assert stalled["for"] == "7m"
    # Added to every alert; an alert's own severity wins.
    assert stalled["labels"] == {"severity": "critical", "team": "platform"}
    assert stalled["annotations"]["runbook_url"] == (
        "https://runbooks.example/k8s-bridge#k8sbridgestalled"
    )


def test_the_operations_md_example_renders_both() -> None:
    text = OPERATIONS.read_text().split("## Alerts and dashboard", 1)[1]
    values = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    rule = render(values, "templates/prometheusrule.yaml")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    stalled = next(a for a in alerts(rule) if a["alert"] == "K8sBridgeStalled")
    assert "> 600)" in stalled["expr"] and stalled["labels"]["team"] == "platform"
    cm = render(values, "templates/dashboard.yaml")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


# --- the dashboard --------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard_json() -> dict[str, Any]:
    cm = render(MONITORING, "templates/dashboard.yaml")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board: dict[str, Any] = json.loads(cm["data"]["k8s-bridge.json"])
    return board


def test_the_dashboard_file_is_what_its_generator_writes() -> None:
    committed = (CHART / "files" / "dashboard.json").read_text()
    assert committed == dashboard.render(), "run python tools/monitoring/dashboard.py"


def test_the_configmap_carries_the_dashboard(dashboard_json: dict[str, Any]) -> None:
    assert dashboard_json == dashboard.build()


def as_promql(expr: str) -> str:
    """A dashboard query as Prometheus would get it from Grafana: variables filled,
    label_values(selector, label) asked as the selector."""
    expr = re.sub(r"^label_values\((.*), *\w+\)$", r"\1", expr.strip(), flags=re.S)
    return (
        expr.replace("$__rate_interval", "2m")
        .replace("$namespace", "bridge")
        .replace("$job", "bridge-k8s-bridge")
        .replace("$resource", ".*")
    )


def test_every_dashboard_query_parses_with_promtool(
    dashboard_json: dict[str, Any], tmp_path: Path
) -> None:
    queries = dashboard.queries(dashboard_json)
    assert len(queries) > 20
    rules = [
        {"record": f"dashboard:query_{i}", "expr": as_promql(expr)}
        for i, (_, expr) in enumerate(queries)
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    out = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


def test_helm_lint_strict_is_clean_with_monitoring_on(tmp_path: Path) -> None:
    values = tmp_path / "values.json"
    values.write_text(json.dumps({**MONITORING, "serviceMonitor": {"enabled": True}}))
    out = run_helm(
        binary("helm"), helm_env(tmp_path), "lint", "--strict", str(CHART), "-f", str(values)
    )
    assert out.returncode == 0 and "[WARNING]" not in out.stdout, out.stdout + out.stderr
