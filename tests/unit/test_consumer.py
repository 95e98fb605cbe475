"""The consumer side without a bus: dropping redeliveries by id, and reading events back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from bridge.consumer import Deduplicator, ReceivedEvent, _matches
from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.kube.objects import DeletedFinalStateUnknown

detector = ChangeDetector(Fingerprinter([]))


def widget(name: str, rv: int, size: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"size": size},
    }


widgets = EventBuilder(
    cluster="c1", group="example.com", version="v1", kind="Widget", plural="widgets"
)
pods = EventBuilder(cluster="c1", group="", version="v1", kind="Pod", plural="pods")


# -- Deduplicator ---------------------------------------------------------------


def test_first_delivery_is_new_and_redelivery_is_seen() -> None:
    d = Deduplicator()
    assert d.seen("u1:5:added") is False
    assert d.seen("u1:5:added") is True
    assert d.seen("u1:5:added") is True
    # Same object, later change: a different id, so not a redelivery.
    assert d.seen("u1:6:modified") is False


def test_capacity_forgets_the_oldest_id_first() -> None:
    d = Deduplicator(capacity=3)
    for i in range(3):
        assert d.seen(f"id{i}") is False
    assert d.seen("id3") is False  # evicts id0
    assert len(d) == 3
    assert d.seen("id0") is False  # forgotten: counts as new again (and evicts id1)
    assert d.seen("id2") is True
    assert d.seen("id1") is False


def test_a_redelivery_refreshes_its_id() -> None:
    d = Deduplicator(capacity=2)
    d.seen("a")
    d.seen("b")
    assert d.seen("a") is True  # "a" is now the newest, "b" the oldest
    d.seen("c")  # evicts "b", not "a"
    assert d.seen("a") is True
    assert d.seen("b") is False


def test_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Deduplicator(capacity=0)


# -- ReceivedEvent.parse --------------------------------------------------------


def test_parse_reads_back_what_the_builder_encoded() -> None:
    (change,) = detector.on_add(widget("w1", 7), initial=True)
    sent = widgets.build(change)
    got = ReceivedEvent.parse(sent.to_json())
    assert got.id == sent.id == "uid-w1:7"
    assert (got.type, got.source, got.subject) == (sent.type, sent.source, "ns/w1")
    assert got.time == sent.time
    assert got.resource_version == "7"
    assert got.initial is True
    assert got.change == "added"
    # The group has dots: the kind is still found from the right of the type.
    assert got.kind == "Widget"
    assert got.object["spec"] == {"size": 1}
    assert got.raw == sent.to_json()


def test_parse_of_a_tombstone_delete() -> None:
    (change,) = detector.on_delete(DeletedFinalStateUnknown("ns/w1", widget("w1", 9)))
    got = ReceivedEvent.parse(widgets.build(change).to_json())
    assert got.change == "deleted"
    assert got.data["tombstone"] is True
    assert got.initial is False
    assert got.object["metadata"]["name"] == "w1"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (orjson.dumps({"type": "t", "source": "s"}), "no id"),
        (orjson.dumps({"id": "x"}), "no type, source"),
    ],
)
def test_parse_refuses_what_is_not_a_cloudevent(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ReceivedEvent.parse(raw)


def test_parse_tolerates_missing_optional_attributes() -> None:
    got = ReceivedEvent.parse(
        orjson.dumps({"id": "x", "type": "io.k8s.core.v1.Pod.added", "source": "s", "data": [1]})
    )
    assert (got.subject, got.resource_version, got.initial, got.data, got.object) == (
        "",
        "",
        False,
        {},
        {},
    )


# -- --resource filter ------------------------------------------------------------


@pytest.mark.parametrize(
    ("wanted", "widget_matches", "pod_matches"),
    [
        (None, True, True),
        ("Widget", True, False),
        ("widget", True, False),
        ("example.com/v1/Widget", True, False),
        ("other.io/v1/Widget", False, False),
        ("v1/Pod", False, True),
        ("apps/v1/Pod", False, False),
    ],
)
def test_resource_filter_by_kind_or_api_version_and_kind(
    wanted: str | None, widget_matches: bool, pod_matches: bool
) -> None:
    w = ReceivedEvent.parse(widgets.build(detector.on_add(widget("w", 1))[0]).to_json())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "uid": "u", "resourceVersion": "2"},
    }
    p = ReceivedEvent.parse(pods.build(detector.on_add(pod)[0]).to_json())
    assert _matches(w, wanted) is widget_matches
    assert _matches(p, wanted) is pod_matches
