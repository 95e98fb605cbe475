"""ObjectDecoder: objects parsed only as far as a resource reads them.

What must hold: the parts left unparsed come back out byte for byte (events
and fingerprints splice them), the parts a resource reads are real values, a
LIST item and a watch object of the same content fingerprint alike, and bad
input is refused the way orjson refuses it (``ValueError``), with "ends too
early" told apart for the LIST splitter.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from bridge.delivery.changes import Change, ChangeKind, Fingerprinter
from bridge.delivery.events import REDACTED, EventBuilder
from bridge.delivery.filters import Filter
from bridge.delivery.views import fingerprinter_for
from bridge.kube.liststream import ListSplitter
from bridge.kube.rawjson import MANAGED_FIELDS_READ, IncompleteJSON, ObjectDecoder
from bridge.service.wiring import object_decoder

# As a Go API server writes it: HTML characters escaped, U+2028 escaped, non-ASCII raw.
SERVER_POD = (
    b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web","namespace":"default",'
    b'"uid":"0b5c7f3e-5d2a-4c57-9d7e-8f1b6c1f2a3b","resourceVersion":"42",'
    b'"labels":{"app":"web"},"managedFields":[{"manager":"kubectl","time":"2026-01-01T00:00:00Z"}]},'
    b'"spec":{"containers":[{"name":"c","image":"nginx","args":["a \\u003c b \\u0026\\u0026 c","\\u2028","\xc3\xa9"]}]},'
    b'"status":{"phase":"Running","conditions":[{"type":"Ready","lastProbeTime":null}]}}'
)


def watch_line(obj: bytes, type_: str = "MODIFIED") -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + obj + b"}"


def list_item(obj: bytes) -> bytes:
    """The same object as a LIST item: no kind/apiVersion (as the API server sends items)."""
    return obj.replace(b'"kind":"Pod","apiVersion":"v1",', b"")


class TestWhatIsParsed:
    def test_metadata_kind_and_apiversion_are_values_the_rest_fragments(self) -> None:
        obj = ObjectDecoder().watch_event(watch_line(SERVER_POD))["object"]
        assert obj["kind"] == "Pod" and obj["apiVersion"] == "v1"
        assert obj["metadata"]["labels"] == {"app": "web"}
        assert isinstance(obj["spec"], orjson.Fragment)
        assert isinstance(obj["status"], orjson.Fragment)

    def test_keys_a_resource_reads_are_parsed(self) -> None:
        obj = ObjectDecoder({"status"}).watch_event(watch_line(SERVER_POD))["object"]
        assert obj["status"]["phase"] == "Running"
        assert isinstance(obj["spec"], orjson.Fragment)

    def test_a_kind_with_other_top_level_keys_takes_the_general_path(self) -> None:
        event = (
            b'{"kind":"Event","apiVersion":"v1","metadata":{"name":"e"},'
            b'"involvedObject":{"kind":"Pod","name":"web"},"reason":"Started","count":3}'
        )
        obj = ObjectDecoder({"reason"}).watch_event(watch_line(event, "ADDED"))["object"]
        assert obj["reason"] == "Started" and obj["metadata"] == {"name": "e"}
        assert isinstance(obj["involvedObject"], orjson.Fragment)
        assert orjson.loads(orjson.dumps(obj)) == orjson.loads(event)
        item = ObjectDecoder({"reason"}).object(event)
        assert orjson.dumps(item) == orjson.dumps(obj)

    def test_a_parsed_key_of_the_common_kinds(self) -> None:
        secret = b'{"metadata":{"name":"s"},"type":"Opaque","data":{"k":"dg=="}}'
        obj = ObjectDecoder({"data", "stringData"}).object(secret)
        assert obj["data"] == {"k": "dg=="}
        assert isinstance(obj["type"], orjson.Fragment)

    def test_an_error_line_is_parsed_whole(self) -> None:
        for status in (
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
            b'"message":"too old resource version","reason":"Expired","code":410}',
            # Only keys the fast path knows: still a plain Status.
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure"}',
        ):
            event = ObjectDecoder().watch_event(watch_line(status, "ERROR"))
            assert event == {"type": "ERROR", "object": orjson.loads(status)}

    def test_a_bookmark_keeps_its_metadata(self) -> None:
        line = (
            b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":'
            b'{"resourceVersion":"77","annotations":{"k8s.io/initial-events-end":"true"}}}}'
        )
        obj = ObjectDecoder().watch_event(line)["object"]
        assert obj["metadata"]["resourceVersion"] == "77"


class TestBytesComeBackAsTheyCame:
    def test_event_encoding_splices_the_server_bytes(self) -> None:
        obj = ObjectDecoder().watch_event(watch_line(SERVER_POD))["object"]
        encoded = orjson.dumps({"object": obj})
        # The escapes the server chose survive (a re-encode would write "<" and "&").
        assert b"a \\u003c b \\u0026\\u0026 c" in encoded
        assert orjson.loads(encoded)["object"] == orjson.loads(SERVER_POD)

    def test_a_list_item_and_a_watch_object_fingerprint_alike(self) -> None:
        decoder = ObjectDecoder(Fingerprinter(["status.conditions"]).reads() or ())
        watched = decoder.watch_event(watch_line(SERVER_POD))["object"]
        listed = decoder.object(list_item(SERVER_POD))
        listed.update(kind="Pod", apiVersion="v1")  # as ListBody fills them in
        fp = Fingerprinter(["status.conditions"])
        assert fp.fingerprint(watched) == fp.fingerprint(listed)

    def test_what_the_fingerprint_ignores_inside_a_parsed_key_is_ignored(self) -> None:
        fp = Fingerprinter(["status.conditions"])
        decoder = ObjectDecoder(fp.reads() or ())
        before = decoder.object(SERVER_POD)
        after = decoder.object(
            SERVER_POD.replace(b'"lastProbeTime":null', b'"lastProbeTime":"2026-02-02T00:00:00Z"')
        )
        assert fp.fingerprint(before) == Fingerprinter(["status.conditions"]).fingerprint(after)

    def test_a_change_in_an_unparsed_key_changes_the_fingerprint(self) -> None:
        fp = Fingerprinter()
        decoder = ObjectDecoder(fp.reads() or ())
        before = decoder.object(SERVER_POD)
        after = decoder.object(SERVER_POD.replace(b'"image":"nginx"', b'"image":"nginx:2"'))
        assert fp.fingerprint(before) != Fingerprinter().fingerprint(after)

    def test_resource_version_and_managed_fields_do_not_count(self) -> None:
        decoder = ObjectDecoder()
        before = decoder.object(SERVER_POD)
        after = decoder.object(
            SERVER_POD.replace(b'"resourceVersion":"42"', b'"resourceVersion":"43"').replace(
                b'"manager":"kubectl"', b'"manager":"helm"'
            )
        )
        assert Fingerprinter().fingerprint(before) == Fingerprinter().fingerprint(after)


class TestBadInput:
    @pytest.mark.parametrize(
        "data", [b"[1,2]", b'"text"', b"null", b'{"metadata":{}}x', b"{bad}", b""]
    )
    def test_not_one_object_is_a_value_error(self, data: bytes) -> None:
        with pytest.raises(ValueError) as raised:
            ObjectDecoder().object(data)
        if data:
            assert not isinstance(raised.value, IncompleteJSON)

    def test_bytes_that_end_inside_the_object_are_incomplete(self) -> None:
        for cut in (10, len(SERVER_POD) // 2, len(SERVER_POD) - 1):
            with pytest.raises(IncompleteJSON):
                ObjectDecoder().object(SERVER_POD[:cut])

    def test_a_watch_line_that_is_not_json_is_a_value_error(self) -> None:
        with pytest.raises(ValueError):
            ObjectDecoder().watch_event(b'{"type":"ADDED","object":{"metadata":')


class TestListSplitterWithTheDecoder:
    @pytest.mark.parametrize("size", [1, 7, 64, 333, 100_000])
    def test_items_split_at_any_chunking_come_out_whole(self, size: int) -> None:
        items = [list_item(SERVER_POD).replace(b'"web"', f'"web-{i}"'.encode()) for i in range(5)]
        # An item of another shape in the middle: the exact scanner takes over there.
        items.insert(2, b'{ "metadata" : {"name":"odd"} , "spec" : {"x":[1,{"y":"}{"}]} }')
        body = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":['
        body += b",".join(items) + b"]}"
        splitter = ListSplitter(ObjectDecoder().object)
        out: list[Any] = []
        for i in range(0, len(body), size):
            out.extend(splitter.feed(body[i : i + size]))
        out.extend(splitter.close())
        assert [orjson.loads(orjson.dumps(o)) for o in out] == [orjson.loads(i) for i in items]
        assert all(isinstance(o["spec"], orjson.Fragment) for o in out)
        assert splitter.envelope["metadata"] == {"resourceVersion": "9"}

    def test_a_body_cut_short_is_refused(self) -> None:
        body = b'{"items":[' + list_item(SERVER_POD) + b"," + list_item(SERVER_POD)[:50]
        splitter = ListSplitter(ObjectDecoder().object)
        with pytest.raises(ValueError):
            for i in range(0, len(body), 40):
                splitter.feed(body[i : i + 40])
            splitter.close()


class TestManagedFields:
    """``metadata.managedFields`` (1-3 KB on real objects) stay the server's bytes
    unless a reader looks inside them."""

    def test_kept_as_bytes_in_the_servers_order(self) -> None:
        obj = ObjectDecoder().watch_event(watch_line(SERVER_POD))["object"]
        md = obj["metadata"]
        assert isinstance(md["managedFields"], orjson.Fragment)
        assert list(md) == [
            "name", "namespace", "uid", "resourceVersion", "labels", "managedFields"
        ]  # fmt: skip
        assert orjson.loads(orjson.dumps(obj)) == orjson.loads(SERVER_POD)
        assert orjson.dumps(ObjectDecoder().object(SERVER_POD)) == orjson.dumps(obj)

    def test_the_fingerprint_is_that_of_the_whole_object(self) -> None:
        fp = Fingerprinter()
        lazy = ObjectDecoder().object(SERVER_POD)
        parsed = ObjectDecoder({MANAGED_FIELDS_READ}).object(SERVER_POD)
        assert isinstance(parsed["metadata"]["managedFields"], list)
        assert fp.fingerprint(lazy) == fp.fingerprint(parsed)
        without = SERVER_POD.replace(
            b',"managedFields":[{"manager":"kubectl","time":"2026-01-01T00:00:00Z"}]', b""
        )
        assert without != SERVER_POD
        assert fp.fingerprint(lazy) == fp.fingerprint(ObjectDecoder().object(without))

    def test_an_unknown_metadata_key_parses_metadata_whole(self) -> None:
        odd = SERVER_POD.replace(b'"labels":', b'"clusterName":"old","labels":')
        obj = ObjectDecoder().object(odd)
        assert obj["metadata"]["clusterName"] == "old"
        assert isinstance(obj["metadata"]["managedFields"], list)
        assert orjson.loads(orjson.dumps(obj)) == orjson.loads(odd)

    def test_readers_that_look_inside_say_so(self) -> None:
        def looks(reads: frozenset[str] | None) -> bool:
            assert reads is not None
            return MANAGED_FIELDS_READ in reads

        assert not looks(Fingerprinter().reads())
        assert not looks(Fingerprinter(["metadata.managedFields"]).reads())
        assert looks(Fingerprinter(["metadata.managedFields.time"]).reads())
        assert looks(fingerprinter_for(trigger=["metadata.managedFields.manager"]).reads())
        assert looks(builder(mask_paths=["metadata.managedFields.manager"]).reads())
        assert not looks(builder(mask_paths=["metadata.annotations"]).reads())
        assert looks(Filter("object.metadata.managedFields.size() > 0").reads())
        assert looks(Filter("has(object.metadata.uid) && object.metadata != null").reads())
        assert not looks(Filter("object.metadata.name == 'web'").reads())

    def test_a_mask_inside_them_applies(self) -> None:
        b = builder(mask_paths=["metadata.managedFields.manager"])
        decoder = object_decoder(Fingerprinter(), b, None)
        assert decoder is not None
        obj = decoder.watch_event(watch_line(SERVER_POD))["object"]
        event = b.build(Change(ChangeKind.MODIFIED, obj, "default/web"))
        managed = orjson.loads(event.to_json())["data"]["object"]["metadata"]["managedFields"]
        assert managed == [{"manager": REDACTED, "time": "2026-01-01T00:00:00Z"}]


def builder(**kwargs: Any) -> EventBuilder:
    return EventBuilder(cluster="c", group="", version="v1", kind="Pod", plural="pods", **kwargs)


def test_a_resource_of_another_shape_stops_trying_the_metadata_struct() -> None:
    """Events (top-level keys of their own) fail the first attempt every time: after a
    few, the decoder stops making it; Pods keep it. Both decode the same either way."""
    event = (
        b'{"kind":"Event","apiVersion":"v1","metadata":{"name":"e","managedFields":[]},'
        b'"involvedObject":{"kind":"Pod","name":"web"},"reason":"Started"}'
    )
    events, pods = ObjectDecoder(), ObjectDecoder()
    for _ in range(40):
        assert orjson.loads(orjson.dumps(events.object(event))) == orjson.loads(event)
        assert orjson.loads(orjson.dumps(pods.object(SERVER_POD))) == orjson.loads(SERVER_POD)
    assert events._object_meta is None and events._line_meta is None
    assert pods._object_meta is not None
    line = watch_line(event)
    assert orjson.loads(orjson.dumps(events.watch_event(line)["object"])) == orjson.loads(event)


def test_after_a_run_without_managed_fields_plain_dicts_come_first() -> None:
    """Objects that carry no managedFields (an emulator's) skip the struct after a
    run of them; the first object with managedFields brings it back."""
    bare = SERVER_POD.replace(
        b',"managedFields":[{"manager":"kubectl","time":"2026-01-01T00:00:00Z"}]', b""
    )
    decoder = ObjectDecoder()
    for _ in range(20):
        assert orjson.loads(orjson.dumps(decoder.object(bare))) == orjson.loads(bare)
    assert not decoder._meta_first
    first = decoder.object(SERVER_POD)  # parsed this once, and the struct comes back
    assert isinstance(first["metadata"]["managedFields"], list)
    again = decoder.watch_event(watch_line(SERVER_POD))["object"]
    assert isinstance(again["metadata"]["managedFields"], orjson.Fragment)
    assert orjson.dumps(first) == orjson.dumps(again)
