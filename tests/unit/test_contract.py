"""The published contract (docs/contract/): generated from the code, and what the code emits.

- the committed files equal ``python -m bridge.contract``'s output;
- events from the real builders, in every shape the bridge publishes (each change
  kind, tombstones, old and patch, Secret redaction, projections, truncated copies,
  snapshot announcements, heartbeats), are valid against the JSON Schema (jsonschema,
  draft-07, formats checked), and one with a key the schema does not name is not;
- the AsyncAPI document passes the AsyncAPI CLI's own validation (its strictest
  severity), installed by ``make realdeps`` (tools/realdeps/build).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft7Validator, FormatChecker, ValidationError

from bridge.contract import ASYNCAPI, EVENT_SCHEMA, render
from bridge.contract.schemas import event_schema
from bridge.delivery.changes import Change, ChangeKind
from bridge.delivery.events import EventBuilder
from bridge.delivery.heartbeat import HeartbeatBuilder, HeartbeatTarget
from bridge.delivery.snapshot import snapshot_event
from bridge.delivery.tracing import traced
from bridge.ground.envelope import Event
from tests.doubles.contract import assert_valid
from tests.fixtures.realdeps import cache_dir

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract"


def test_the_committed_contract_is_what_the_code_generates() -> None:
    for name, text in render().items():
        assert (CONTRACT / name).read_text() == text, f"run: python -m bridge.contract ({name})"


def pod(name: str, rv: str = "5", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"app": "web"},
            "annotations": {"note": "x"},
        },
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]},
        **extra,
    }


def builder(**kw: Any) -> EventBuilder:
    defaults: dict[str, Any] = {
        "cluster": "dev",
        "group": "",
        "version": "v1",
        "kind": "Pod",
        "plural": "pods",
    }
    return EventBuilder(**(defaults | kw))


def every_shape() -> list[Event]:
    b = builder(include_old=True, patch=True)
    old, new = pod("a", "5"), pod("a", "6", status={"phase": "Running"})
    events = [
        b.build(Change(ChangeKind.ADDED, old, "default/a", initial=True)),
        b.build(Change(ChangeKind.MODIFIED, new, "default/a", old=old)),
        b.build(Change(ChangeKind.DELETED, new, "default/a")),
        b.build(Change(ChangeKind.FILTERED, new, "default/a")),
        builder().build(Change(ChangeKind.DELETED, pod("t"), "default/t", tombstone=True)),
        builder().build(Change(ChangeKind.ADDED, pod("s"), "default/s"), sealed=True),
        builder(fields=["spec.containers"]).build(Change(ChangeKind.ADDED, pod("f"), "default/f")),
        builder(group="apps", kind="Deployment", plural="deployments").build(
            Change(ChangeKind.ADDED, {**pod("d"), "apiVersion": "apps/v1"}, "default/d")
        ),
        builder(group="example.com", kind="Widget", plural="widgets").build(
            Change(ChangeKind.ADDED, {**pod("w"), "apiVersion": "example.com/v1"}, "default/w")
        ),
    ]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": "default", "uid": "u", "resourceVersion": "1"},
        "data": {"k": "dg=="},
    }
    events.append(
        builder(kind="Secret", plural="secrets").build(
            Change(ChangeKind.ADDED, secret, "default/s")
        )
    )
    events.append(events[1].truncated())
    events.append(events[4].truncated())
    events.append(snapshot_event(builder(), pod("n"), "default/n", "sig-1"))
    hb = HeartbeatBuilder(
        HeartbeatTarget("dev", "", "v1", "Pod", "pods", None),
        30.0,
        clock=lambda: datetime(2026, 1, 1, tzinfo=UTC),
    )
    events.append(hb.build(_Source()))
    return events


class _Source:
    label = "v1/pods"
    resource_id = "core/v1/pods"
    committed_resource_version = "42"

    def sink_healthy(self) -> bool:
        return True

    def has_synced(self) -> bool:
        return True

    def watch_up(self) -> bool:
        return True

    def object_count(self) -> int:
        return 3

    def unacknowledged(self) -> int:
        return 0

    def seconds_since_last_change(self) -> float | None:
        return None

    def checkpoint_lag(self) -> float:
        return 0.25


def test_every_shape_the_builders_make_is_valid() -> None:
    shapes = every_shape()
    kinds = {e.type.rsplit(".", 1)[-1] for e in shapes}
    assert kinds == {"added", "modified", "deleted", "filtered", "snapshot", "heartbeat"}
    for event in shapes:
        assert_valid(orjson.loads(event.to_json()))


@pytest.mark.parametrize(
    "drift",
    [
        lambda d: d | {"extension": "x"},  # an envelope key the schema does not name
        lambda d: d | {"data": d["data"] | {"new": 1}},  # a data key it does not name
        lambda d: d | {"specversion": "0.3"},
        lambda d: d | {"type": "io.k8s.core.v1.Pod.renamed"},
        lambda d: d | {"time": "yesterday"},
        lambda d: {k: v for k, v in d.items() if k != "subject"},
    ],
)
def test_an_event_that_drifts_from_the_contract_is_refused(drift: Any) -> None:
    event = orjson.loads(every_shape()[1].to_json())
    with pytest.raises(AssertionError):
        assert_valid(drift(event))


def test_a_heartbeat_with_a_field_the_schema_does_not_name_is_refused() -> None:
    hb = every_shape()[-1]
    drifted = replace(hb, data={**hb.data, "uptime": 1})
    with pytest.raises(ValidationError):
        Draft7Validator(event_schema(), format_checker=FormatChecker()).validate(
            orjson.loads(drifted.to_json())
        )


def test_the_asyncapi_document_passes_the_asyncapi_cli() -> None:
    home = cache_dir() / "asyncapi"
    cli = home / "node_modules" / ".bin" / "asyncapi"
    if not cli.exists():
        pytest.fail(f"{cli} is missing: run `make realdeps` (tools/realdeps/build) first")
    env = os.environ | {
        "ASYNCAPI_METRICS_CONFIG_PATH": str(home / "analytics.json"),
        "SUPPRESS_NO_CONFIG_WARNING": "1",
    }
    done = subprocess.run(
        [str(cli), "validate", str(CONTRACT / ASYNCAPI), "--fail-severity=info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is valid" in done.stdout and "governance issues" not in done.stdout.replace(
        "don't have governance issues", ""
    ), done.stdout


def test_the_event_schema_file_is_a_valid_draft7_schema() -> None:
    Draft7Validator.check_schema(orjson.loads((CONTRACT / EVENT_SCHEMA).read_bytes()))


def test_traced_events_are_the_same_events_with_the_tracing_extension() -> None:
    traceparent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    shapes = every_shape()
    for plain, with_trace in zip(shapes, traced(shapes, traceparent, "k=v"), strict=True):
        doc = orjson.loads(with_trace.to_json())
        assert_valid(doc)
        assert doc == orjson.loads(plain.to_json()) | {
            "traceparent": traceparent,
            "tracestate": "k=v",
        }
        assert ("ce_traceparent", traceparent.encode()) in with_trace.headers
