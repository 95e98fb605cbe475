"""The README and docs/ say what the code does: their configuration examples load,
the configuration reference names every key, the command and metric tables name
every command and metric, and every link between the pages lands."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.cli.main import build_parser
from bridge.ground.envelope import ReceivedEvent
from bridge.ground.prometheus import Registry
from bridge.mirror.settings import load_mirror_settings
from bridge.service.metrics import Metrics
from bridge.service.settings import load_settings, settings_json_schema

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
OPERATIONS = ROOT / "docs" / "operations.md"

YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def yaml_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)} block {i}", m.group(1))
        for page in PAGES
        for i, m in enumerate(YAML_BLOCK.finditer(page.read_text()))
    ]


@pytest.mark.parametrize(("where", "text"), yaml_blocks(), ids=lambda v: str(v)[:40])
def test_every_configuration_example_loads(where: str, text: str, tmp_path: Path) -> None:
    # A fragment (say, one resource's filter) is shown without a sink: give it one.
    data = yaml.safe_load(text)
    if "postgres" in data and "source" in data:  # a k8s-bridge mirror config (docs/mirror.md)
        path = tmp_path / "mirror.yaml"
        path.write_text(text)
        load_mirror_settings(str(path))
        return
    if "replicaCount" in data:  # chart values: the bridge's config is under config:
        data = data["config"]
    elif "prometheusRule" in data:
        # Chart values of monitoring alone (operations.md, "Alerts and dashboard"):
        # tests/unit/chart/test_monitoring.py renders them with helm.
        assert "config" not in data, where
        return
    data.setdefault("sink", {"kind": "stdout"})
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_settings(str(path), env={}).resources, where


def _schema_keys(node: dict[str, Any], defs: dict[str, Any], prefix: str, out: set[str]) -> None:
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    for choice in node.get("anyOf", []):
        _schema_keys(choice, defs, prefix, out)
    if "items" in node:
        _schema_keys(node["items"], defs, prefix + "[]", out)
    for key, sub in node.get("properties", {}).items():
        out.add(f"{prefix}.{key}")
        _schema_keys(sub, defs, f"{prefix}.{key}", out)


def _document_keys(value: Any, prefix: str, out: set[str]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            out.add(f"{prefix}.{key}")
            _document_keys(sub, f"{prefix}.{key}", out)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                _document_keys(item, prefix + "[]", out)


def test_the_configuration_reference_names_every_key_and_no_other() -> None:
    schema = settings_json_schema()
    expected: set[str] = set()
    _schema_keys(schema, schema.get("$defs", {}), "", expected)
    reference = YAML_BLOCK.search(CONFIGURATION.read_text())
    assert reference is not None
    documented: set[str] = set()
    _document_keys(yaml.safe_load(reference.group(1)), "", documented)
    assert sorted(expected - documented) == [], "keys the reference does not show"
    assert sorted(documented - expected) == [], "keys the reference shows that do not exist"


def test_the_command_table_names_every_command() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = set(getattr(sub, "choices", {}))
    table = OPERATIONS.read_text().split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    rows = set(re.findall(r"^\| `(\w+)[ `]", table, re.M))
    assert commands <= rows, f"commands without a row: {sorted(commands - rows)}"
    assert rows <= commands, f"rows of no command: {sorted(rows - commands)}"


def test_the_metrics_table_names_every_metric() -> None:
    metrics = Metrics(Registry())
    names = set()
    for family in metrics.registry.collect():
        # As exposed: a counter's name ends in _total.
        names.add(family.name.removeprefix("k8s_bridge_"))
    table = OPERATIONS.read_text().split("## Metrics and health", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(\w+)`", table))
    missing = names - documented
    assert missing == set(), f"metrics the table does not name: {sorted(missing)}"
    rows = set(re.findall(r"^\| `(\w+)`", table, re.M))
    assert rows <= names, f"rows of no metric: {sorted(rows - names)}"


def _anchor(heading: str) -> str:
    """The id GitHub gives a heading: lowercase, punctuation dropped, spaces → '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_every_link_between_the_pages_lands() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_anchor_rule() -> None:
    assert _anchor("Who may ask: `server.controlAuth`") == "who-may-ask-servercontrolauth"
    assert _anchor("Change triggers and projections") == "change-triggers-and-projections"


def test_the_event_examples_are_events_with_the_ids_the_page_states() -> None:
    blocks = re.findall(r"```json\n(.*?)```", (ROOT / "docs" / "events.md").read_text(), re.S)
    assert blocks
    for text in blocks:
        event = ReceivedEvent.parse(text.encode())
        if event.type == "io.k8s.bridge.heartbeat":
            assert event.id.startswith("hb:")
            continue
        meta = event.object["metadata"]
        assert event.id == f"{meta['uid']}:{meta['resourceVersion']}"
        assert event.resource_version == meta["resourceVersion"]
        assert event.subject == f"{meta['namespace']}/{meta['name']}"
