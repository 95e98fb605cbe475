"""ListSplitter: a LIST body cut into items as it arrives, on tricky JSON and any chunking."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.errors import KubeConnectionError
from bridge.kube.liststream import ListBody, ListBodyError, ListSplitter


def split(chunks: Iterable[bytes]) -> tuple[list[Any], dict[str, Any]]:
    splitter = ListSplitter()
    items: list[Any] = []
    for chunk in chunks:
        items.extend(splitter.feed(chunk))
    items.extend(splitter.close())
    return items, splitter.envelope


def pieces(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def pod(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"}, **extra}


TRICKY = [
    pod("braces", data={"s": "}{][ },{ ]}", "t": '},{"metadata":{"name":"fake"}}'}),
    pod("quotes", data={"q": 'say "hi" \\"', "bs": "\\", "bs2": "\\\\", "end": 'x\\"}'}),
    pod("nested", spec={"a": [[1, [2, [3, {"b": [{}, []]}]]], {"c": None}], "e": [], "o": {}}),
    pod("unicode", data={"é": "ünïcødé ✓ 😀", "cjk": "漢字", "esc": "\u2028\u0000"}),
    # An inner array of objects starting with the items' first key: a false candidate.
    pod("vct", volumeClaimTemplates=[{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]),
    pod("numbers", n=[0, -1, 1.5e10, 12345678901234567890, True, False, None]),
]


def body_of(items: list[Any], *, meta_first: bool = True, **dumps: Any) -> bytes:
    meta = {"resourceVersion": "42", "continue": 'tok"}]'}
    head = {"kind": "PodList", "apiVersion": "v1"}
    doc = (
        {**head, "metadata": meta, "items": items}
        if meta_first
        else {**head, "items": items, "metadata": meta}
    )
    return json.dumps(doc, **dumps).encode() if dumps else orjson.dumps(doc)


@pytest.mark.parametrize("meta_first", [True, False], ids=["metadata-first", "metadata-last"])
def test_tricky_items_split_at_every_byte_boundary(meta_first: bool) -> None:
    body = body_of(TRICKY, meta_first=meta_first)
    for cut in range(1, len(body)):
        items, envelope = split([body[:cut], body[cut:]])
        assert items == TRICKY, cut
        assert envelope["metadata"] == {"resourceVersion": "42", "continue": 'tok"}]'}
        assert envelope["kind"] == "PodList"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 4096])
def test_fed_byte_by_byte_or_in_small_pieces(size: int) -> None:
    items, _ = split(pieces(body_of(TRICKY, meta_first=False), size))
    assert items == TRICKY


def test_utf8_sequences_cut_in_the_middle() -> None:
    items_in = [pod(f"p{i}", data={"v": "😀é漢" * (i + 1)}) for i in range(20)]
    body = body_of(items_in)
    # Every cut inside a multi-byte sequence: its continuation bytes are >= 0x80.
    cuts = [i for i in range(1, len(body)) if body[i] >= 0x80]
    assert cuts
    for cut in cuts[:200]:
        assert split([body[:cut], body[cut:]])[0] == items_in


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"3"},"items":[]}',
        b'{"items":[],"metadata":{"resourceVersion":"3"}}',
        b'{"metadata":{"resourceVersion":"3"},"items":null}',
        b'{"metadata":{"resourceVersion":"3"}}',
        b' \n{ "metadata" : { "resourceVersion" : "3" } , "items" : [ ] } \n',
    ],
)
def test_empty_lists(body: bytes) -> None:
    for size in (1, len(body)):
        items, envelope = split(pieces(body, size))
        assert items == []
        assert envelope["metadata"] == {"resourceVersion": "3"}


@pytest.mark.parametrize("indent", [None, 1, 4])
def test_whitespace_between_tokens(indent: int | None) -> None:
    body = body_of(TRICKY, meta_first=False, indent=indent, ensure_ascii=False)
    for size in (7, 1000):
        assert split(pieces(body, size))[0] == TRICKY


def test_items_with_different_first_keys() -> None:
    items_in: list[Any] = [
        {"metadata": {"name": "a"}},
        {"apiVersion": "v1", "metadata": {"name": "b"}},
        {"metadata": {"name": "c"}},
        {},
        {"metadata": {"name": "d"}},
        {"metadata": {"name": "e"}},
    ]
    for size in (1, 3, 10, 10_000):
        assert split(pieces(body_of(items_in), size))[0] == items_in


def test_one_item_far_larger_than_the_others() -> None:
    small = [pod(f"p{i}") for i in range(50)]
    huge = pod("huge", data={"blob": "x" * 2_000_000, "tricky": '},{"metadata":'})
    items_in = [*small[:25], huge, *small[25:]]
    body = body_of(items_in)
    splitter = ListSplitter()
    got: list[Any] = []
    for chunk in pieces(body, 64 * 1024):
        got.extend(splitter.feed(chunk))
        # Never more than the unfinished item and one piece are held.
        assert len(splitter._buf) <= len(orjson.dumps(huge)) + 64 * 1024
    got.extend(splitter.close())
    assert got == items_in


def test_items_come_out_as_soon_as_they_are_complete() -> None:
    items_in = [pod(f"p{i}") for i in range(10)]
    body = body_of(items_in)
    splitter = ListSplitter()
    seen = 0
    for cut in range(1, len(body) + 1):
        seen += len(splitter.feed(body[cut - 1 : cut]))
        done = body[:cut]
        # Every item whose following comma has arrived is out (the last waits for the end).
        complete = sum(
            1 for i in range(len(items_in) - 1) if orjson.dumps(items_in[i]) + b"," in done
        )
        assert seen >= complete, cut
    seen += len(splitter.close())
    assert seen == len(items_in)


def test_buffer_holds_one_piece_and_one_item_not_the_body() -> None:
    items_in = [pod(f"p{i}", data={"x": "y" * 2000}) for i in range(2000)]
    body = body_of(items_in)
    splitter = ListSplitter()
    n = 0
    for chunk in pieces(body, 16 * 1024):
        n += len(splitter.feed(chunk))
        assert len(splitter._buf) < 16 * 1024 + 4096
    n += len(splitter.close())
    assert n == 2000


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "ended early"),
        (b'{"items":[{"metadata":{}}', "ended early"),
        (b'{"items":[{"metadata":{}},', "ended early"),
        (b'{"metadata":{"resourceVersion":"1"},"items":[{}]', "ended early"),
        (b'{"items":[{"a":"unterminated}]}', "ended inside an item"),
        (b"[]", "not a JSON object"),
        (b'{"items":[1,2]}', "not an object"),
        (b'{"items":[{}],}', "expected a key"),
        (b'{"items":[{},]}', "not an object"),
        (b'{"items":{"a":1}}', "items is not an array"),
        (b'{"items":[{"a":}]}', "undecodable item"),
        (b'{"items":[]} x', "content after"),
        (b'{"items":[] "metadata":{}}', "expected ',' or '}'"),
        (b'{"it\\xems":[]}', "undecodable key"),
    ],
)
def test_malformed_or_cut_bodies(body: bytes, message: str) -> None:
    for size in (1, max(1, len(body))):
        with pytest.raises(ListBodyError, match=message):
            split(pieces(body, size))


# -- property: any JSON items, any chunking ---------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from('ab{}[]",:\\ é😀\n\t/')),
)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["metadata", "spec", "a", '"}', "é"]), inner, max_size=4)
    ),
    max_leaves=20,
)
_item = st.dictionaries(st.sampled_from(["metadata", "apiVersion", "x"]), _json, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(_item, max_size=12),
    meta_first=st.booleans(),
    pretty=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=5000), max_size=12),
)
def test_property_same_items_as_a_whole_body_parse(
    items: list[Any], meta_first: bool, pretty: bool, cuts: list[int]
) -> None:
    body = body_of(items, meta_first=meta_first, **({"indent": 1} if pretty else {}))
    bounds = sorted({c % len(body) for c in cuts} | {0, len(body)})
    chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
    got, envelope = split(chunks)
    assert got == orjson.loads(body)["items"]
    assert envelope["metadata"]["resourceVersion"] == "42"


# -- ListBody: the async side ------------------------------------------------


async def _chunks(parts: list[bytes], error: BaseException | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if error is not None:
        raise error


async def test_list_body_batches_fill_kind_and_give_metadata_at_the_end() -> None:
    items_in = [pod("a"), {**pod("b"), "kind": "Pod", "apiVersion": "v1"}]
    body = ListBody(
        _chunks(pieces(body_of(items_in, meta_first=False), 10)),
        kind="Pod",
        api_version="v1",
        what="GET /api/v1/pods",
    )
    with pytest.raises(RuntimeError):
        _ = body.metadata
    got = [item async for batch in body for item in batch]
    assert [i["metadata"]["name"] for i in got] == ["a", "b"]
    assert all(i["kind"] == "Pod" and i["apiVersion"] == "v1" for i in got)
    assert body.metadata["resourceVersion"] == "42"


async def test_list_body_errors_are_connection_errors_naming_the_request() -> None:
    truncated = body_of([pod("a"), pod("b")])[:-10]
    body = ListBody(_chunks([truncated]), kind="Pod", api_version="v1", what="GET /api/v1/pods")
    with pytest.raises(KubeConnectionError, match=r"GET /api/v1/pods: answer is not a list"):
        async for _ in body:
            pass


def test_orjson_still_says_where_a_candidate_stopped() -> None:
    """The fast path tells "ended inside the item" from other failures by orjson's message;
    if that wording changes, every such guess goes to the exact scanner (right, but slow)."""
    from bridge.kube.liststream import _INCOMPLETE

    for inside in (b'{"a":{"b":1}', b'{"a":[{"b":1}', b'{"a":"},{'):
        with pytest.raises(orjson.JSONDecodeError) as info:
            orjson.loads(inside)
        assert info.value.msg.startswith(_INCOMPLETE)
    with pytest.raises(orjson.JSONDecodeError) as info:
        orjson.loads(b'{"a":1},{"metadata":')
    assert not info.value.msg.startswith(_INCOMPLETE)
