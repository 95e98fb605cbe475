"""Which parts of an object a resource parses, chosen once at configuration time.

Everything a resource's fingerprint, events or filter read must arrive parsed;
the rest may stay the server's bytes. Each rule is checked where it matters:
the Secret values that must be redacted, the ignored field that must not
count, the filter path that must be evaluated.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from bridge.delivery.changes import Change, ChangeKind, Fingerprinter
from bridge.delivery.events import LAST_APPLIED, REDACTED, EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.views import fingerprinter_for
from bridge.service.wiring import object_decoder


def builder(kind: str = "Pod", **kw: Any) -> EventBuilder:
    return EventBuilder(
        cluster="c", group="", version="v1", kind=kind, plural=kind.lower() + "s", **kw
    )


def parsed(fp: Fingerprinter | None = None, b: EventBuilder | None = None, f: Any = None) -> Any:
    decoder = object_decoder(fp or Fingerprinter(), b or builder(), f)
    return None if decoder is None else decoder.parsed - {"apiVersion", "kind", "metadata"}


class TestWhatEachReaderNeeds:
    def test_a_plain_resource_parses_only_the_metadata(self) -> None:
        assert parsed() == frozenset()

    @pytest.mark.parametrize(
        ("kw", "keys"),
        [
            ({"ignore_fields": ["status.conditions"]}, {"status"}),
            ({"trigger": ["spec.nodeName"]}, {"spec"}),
            ({"generation_only": True}, set()),
            ({"fields": ["spec.replicas"]}, {"spec"}),
            ({"ignore_fields": ["status.x"], "trigger": ["spec.y"]}, {"spec", "status"}),
        ],
    )
    def test_fingerprint_paths(self, kw: dict[str, Any], keys: set[str]) -> None:
        assert parsed(fingerprinter_for(**kw)) == keys

    def test_event_paths(self) -> None:
        assert parsed(b=builder(fields=["status.phase"])) == {"status"}
        assert parsed(b=builder(mask_paths=["spec.token"])) == {"spec"}
        assert parsed(b=builder("Secret")) == {"data", "stringData"}
        assert parsed(b=builder("Secret", redact_secrets=False)) == frozenset()
        assert parsed(b=builder(include_old=True)) == frozenset()

    def test_a_patch_compares_whole_objects(self) -> None:
        assert parsed(b=builder(patch=True)) is None

    def test_filter_paths(self) -> None:
        assert parsed(f=Filter("object.status.phase == 'Running'")) == {"status"}
        assert parsed(f=Filter("has(oldObject.spec.x) || object.metadata.name == 'a'")) == {"spec"}
        assert parsed(f=Filter("size(object) > 2")) is None


def secret_bytes() -> bytes:
    applied = orjson.dumps(
        {"apiVersion": "v1", "kind": "Secret", "data": {"password": "aHVudGVyMg=="}}
    ).decode()
    return orjson.dumps(
        {
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {
                "name": "db",
                "namespace": "default",
                "uid": "0b5c7f3e-5d2a-4c57-9d7e-8f1b6c1f2a3b",
                "resourceVersion": "5",
                "annotations": {LAST_APPLIED: applied + "\n"},
            },
            "type": "Opaque",
            "data": {"password": "aHVudGVyMg=="},
            "stringData": {"token": "plain-secret"},
        }
    )


class TestWhereItMatters:
    def test_secret_values_never_leave_and_their_keys_stay(self) -> None:
        b = builder("Secret")
        decoder = object_decoder(Fingerprinter(), b, None)
        assert decoder is not None
        obj = decoder.watch_event(b'{"type":"ADDED","object":' + secret_bytes() + b"}")["object"]
        event = b.build(Change(ChangeKind.ADDED, obj, "default/db"), sealed=True)
        assert b"aHVudGVyMg==" not in event.encoded and b"plain-secret" not in event.encoded
        published = orjson.loads(event.encoded)["data"]["object"]
        assert published["data"] == {"password": REDACTED}
        assert published["stringData"] == {"token": REDACTED}
        assert published["type"] == "Opaque"

    def test_an_ignored_field_under_a_top_level_key_does_not_count(self) -> None:
        fp = fingerprinter_for(ignore_fields=["spec.replicas"])
        decoder = object_decoder(fp, builder(), None)
        assert decoder is not None
        base = b'{"metadata":{"name":"d","resourceVersion":"%d"},"spec":{"replicas":%d,"x":1}}'
        one = decoder.object(base % (1, 1))
        two = decoder.object(base % (2, 3))
        assert fp.fingerprint(one) == fingerprinter_for(
            ignore_fields=["spec.replicas"]
        ).fingerprint(two)

    def test_a_filter_sees_the_values_it_reads(self) -> None:
        f = Filter("object.spec.nodeName == 'n1'")
        decoder = object_decoder(Fingerprinter(), builder(), f)
        assert decoder is not None
        obj = decoder.object(b'{"metadata":{"name":"p"},"spec":{"nodeName":"n1"},"status":{}}')
        assert f.matches(obj)
        assert f.errors == 0
