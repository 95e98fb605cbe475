"""Shard ranges and the hash agree with the API server's (k8s.io/apimachinery/pkg/sharding)."""

from __future__ import annotations

import itertools

import pytest

from bridge.kube.sharding import (
    FIELD_PATHS,
    HASH_SPACE,
    ShardRange,
    fnv1a64,
    parse_selector,
    shard_range,
    shard_ranges,
)

# sharding.HashField of apimachinery v0.37.2 (the inputs of its hash_test.go and
# selector_test.go, and a few uids and namespaces), printed by a Go program
# against that module.
GO_HASHES = {
    "": "cbf29ce484222325",
    "a": "af63dc4c8601ec8c",
    "abc": "e71fa2190541574b",
    "test": "f9e6e6ef197c2b25",
    "different": "88f38c6c33321162",
    "test-uid-12345": "d4c53b72f9287c28",
    "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee": "93754b7248a00eb9",
    "test-uid-123": "d0ba679834556c0b",
    "kube-system": "df65c7bc1d82b35e",
    "default": "ebada5168620c5fe",
    "6f1c5e2a-9b7d-4c3e-8a1f-2d4b6c8e0f13": "b1fe696db5e6dba5",
}


@pytest.mark.parametrize(("value", "expected"), sorted(GO_HASHES.items()))
def test_hash_is_the_api_servers(value: str, expected: str) -> None:
    assert f"{fnv1a64(value.encode()):016x}" == expected


def test_two_and_four_shards_are_the_api_documentations_split() -> None:
    # ListOptions.shardSelector's doc comment (apimachinery meta/v1 types.go).
    uid = "object.metadata.uid"
    assert [r.selector() for r in shard_ranges(2, "uid")] == [
        f"shardRange({uid}, '0x0000000000000000', '0x8000000000000000')",
        f"shardRange({uid}, '0x8000000000000000', '0x10000000000000000')",
    ]
    assert [r.selector() for r in shard_ranges(4, "uid")] == [
        f"shardRange({uid}, '0x0000000000000000', '0x4000000000000000')",
        f"shardRange({uid}, '0x4000000000000000', '0x8000000000000000')",
        f"shardRange({uid}, '0x8000000000000000', '0xc000000000000000')",
        f"shardRange({uid}, '0xc000000000000000', '0x10000000000000000')",
    ]


def test_selector_is_written_as_the_server_echoes_it() -> None:
    # shardSelector.String(): "shardRange(%s, '%s', '%s')", one space after each comma.
    r = ShardRange("namespace", 0, 0x80 << 56)
    assert r.selector() == (
        "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')"
    )
    assert parse_selector(r.selector()) == r
    assert parse_selector("shardRange(object.metadata.uid, '0x00', '0x80')") == ShardRange(
        "uid", 0, 0x80
    )
    assert parse_selector(f"{r.selector()} || {r.selector()}") is None
    assert parse_selector("shardRange(object.metadata.name, '0x00', '0x80')") is None


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 7, 16])
@pytest.mark.parametrize("field", sorted(FIELD_PATHS))
def test_ranges_cover_the_space_once(shards: int, field: str) -> None:
    ranges = shard_ranges(shards, field)  # type: ignore[arg-type]
    assert ranges[0].start == 0 and ranges[-1].end == HASH_SPACE
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    assert [shard_range(shards, i, field) for i in range(shards)] == ranges  # type: ignore[arg-type]
    values = [f"ns-{i}" for i in range(300)] + list(GO_HASHES)
    for value in values:
        assert sum(r.contains(value) for r in ranges) == 1
    assert len({r.label() for r in ranges}) == shards


def test_contains_is_the_hash_in_start_inclusive_end_exclusive() -> None:
    h = int(GO_HASHES["test-uid-123"], 16)
    assert ShardRange("uid", h, h + 1).contains("test-uid-123")
    assert not ShardRange("uid", h + 1, HASH_SPACE).contains("test-uid-123")
    assert not ShardRange("uid", 0, h).contains("test-uid-123")
    obj = {"uid": "test-uid-123", "namespace": "default"}
    assert ShardRange("uid", h, h + 1).contains_object(obj)
    d = int(GO_HASHES["default"], 16)
    assert ShardRange("namespace", d, d + 1).contains_object(obj)
    # A cluster-scoped object has no namespace: the server hashes "".
    empty = int(GO_HASHES[""], 16)
    assert ShardRange("namespace", empty, empty + 1).contains_object({"uid": "x"})


def test_overlaps_and_labels() -> None:
    two, three = shard_ranges(2, "uid"), shard_ranges(3, "uid")
    assert [r.label() for r in two] == ["uid:0000-8000", "uid:8000-10000"]
    assert [[a.overlaps(b) for b in three] for a in two] == [
        [True, True, False],
        [False, True, True],
    ]
    assert not two[0].overlaps(shard_ranges(2, "namespace")[0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: ShardRange("uid", 5, 5),
        lambda: ShardRange("uid", 0, HASH_SPACE + 1),
        lambda: ShardRange("name", 0, 1),  # type: ignore[arg-type]
        lambda: shard_range(0, 0, "uid"),
        lambda: shard_range(3, 3, "uid"),
    ],
)
def test_bad_ranges_say_why(make: object) -> None:
    with pytest.raises(ValueError, match="shard"):
        make()  # type: ignore[operator]
