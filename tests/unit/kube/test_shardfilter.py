"""The client-side shard filter on raw bytes: LIST items cut at any point, watch lines."""

from __future__ import annotations

import uuid

import orjson
import pytest

from bridge.kube.liststream import ListSplitter
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.shardfilter import ShardFilter
from bridge.kube.sharding import shard_range
from bridge.logging import capture_logs

UIDS = [str(uuid.UUID(int=i * 7919 + 13)) for i in range(60)]
SHARD = shard_range(3, 1, "uid")


def pod(uid: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"p-{uid[:8]}",
            "namespace": "default",
            "uid": uid,
            "ownerReferences": [{"uid": UIDS[0], "name": "owner"}],  # not the object's uid
        },
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }


def body(echo: bool) -> bytes:
    metadata: dict[str, object] = {"resourceVersion": "9"}
    if echo:
        metadata["shardInfo"] = {"selector": SHARD.selector()}
    return orjson.dumps(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": [pod(u) for u in UIDS],
        }
    )


def new_filter() -> ShardFilter:
    return ShardFilter(SHARD, resource="v1/pods", namespace=None)


@pytest.mark.parametrize("chunk", [1, 7, 64, 100_000])
@pytest.mark.parametrize("decoded", [True, False])
def test_list_items_outside_the_shard_are_left_out_however_the_body_is_cut(
    chunk: int, decoded: bool
) -> None:
    f = new_filter()
    decode = ObjectDecoder().object if decoded else orjson.loads
    splitter = ListSplitter(f.item_decoder(decode, lambda: splitter.envelope.get("metadata", {})))
    data = body(echo=False)
    items = []
    for i in range(0, len(data), chunk):
        items += splitter.feed(data[i : i + chunk])
    items += splitter.close()
    inside = [u for u in UIDS if SHARD.contains(u)]
    assert 0 < len(inside) < len(UIDS)
    assert [o["metadata"]["uid"] for o in items] == inside
    assert f.dropped == len(UIDS) - len(inside)


def test_a_list_that_echoes_the_selector_is_trusted() -> None:
    f = new_filter()
    splitter = ListSplitter(
        f.item_decoder(ObjectDecoder().object, lambda: splitter.envelope.get("metadata", {}))
    )
    items = splitter.feed(body(echo=True)) + splitter.close()
    # The server said it filtered: nothing is hashed or dropped here (this body was not
    # filtered, so everything comes through).
    assert len(items) == len(UIDS) and f.dropped == 0


def line(kind: str, uid: str) -> bytes:
    return orjson.dumps({"type": kind, "object": pod(uid)})


@pytest.mark.parametrize("honoured", [None, True])
def test_watch_lines_outside_the_shard_are_dropped_and_say_the_server_ignored_it(
    honoured: bool | None,
) -> None:
    f = new_filter()
    f.honoured = honoured
    decode = f.watch_decoder(ObjectDecoder().watch_event)
    inside = next(u for u in UIDS if SHARD.contains(u))
    outside = next(u for u in UIDS if not SHARD.contains(u))
    bookmark = b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"5"}}}'
    error = (
        b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"code":410}}'
    )
    with capture_logs() as logs:
        kept = [decode(x) for x in (line("ADDED", inside), bookmark, error)]
        assert [e["type"] for e in kept] == ["ADDED", "BOOKMARK", "ERROR"]
        assert f.dropped == 0 and f.honoured is honoured and logs == []
        for kind in ("ADDED", "MODIFIED", "DELETED"):
            assert decode(line(kind, outside))["type"] == ""  # the dropped marker
    assert f.dropped == 3 and f.honoured is False
    assert [e["event"].split(";")[0] for e in logs] == ["the API server ignores shardSelector"]
    assert logs[0]["resource"] == "v1/pods" and logs[0]["shard"] == SHARD.label()


def test_watch_lines_the_peek_cannot_read_are_decoded_and_checked() -> None:
    f = new_filter()
    decode = f.watch_decoder(orjson.loads)
    outside = next(u for u in UIDS if not SHARD.contains(u))
    # The peek reads only the uid: other odd fields do not matter to it.
    odd = orjson.dumps({"type": "ADDED", "object": {"metadata": {"uid": outside, "name": 5}}})
    assert decode(odd)["type"] == "" and f.dropped == 1
    # A uid that is not a string: decoded whole, hashed as "" (the hash of "" is in
    # the last of three shards, not this one).
    assert not SHARD.contains("")
    weird = orjson.dumps({"type": "ADDED", "object": {"metadata": {"uid": 7}}})
    assert decode(weird)["type"] == "" and f.dropped == 2
    # Not JSON: the decoder's own error, as without a shard.
    with pytest.raises(orjson.JSONDecodeError):
        decode(b'{"type":"ADDED","obj')


def test_the_echo_is_the_same_range_in_any_spelling_and_nothing_else() -> None:
    f = new_filter()
    start, end = f"0x{SHARD.start:016x}", f"0x{SHARD.end:016x}"
    assert f.echoed({"shardInfo": {"selector": SHARD.selector()}})
    assert f.echoed(
        {"shardInfo": {"selector": f'shardRange(object.metadata.uid,"{start}","{end}")'}}
    )
    assert not f.echoed({"shardInfo": {"selector": shard_range(3, 2, "uid").selector()}})
    assert not f.echoed({"shardInfo": {"selector": shard_range(3, 1, "namespace").selector()}})
    assert not f.echoed({"shardInfo": {"selector": f"{SHARD.selector()} || {SHARD.selector()}"}})
    assert not f.echoed({"shardInfo": {}}) and not f.echoed({}) and not f.echoed(None)
