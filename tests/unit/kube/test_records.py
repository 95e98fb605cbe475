"""Compact cache records: exact round trips, the packed layout's size, and their use as ``old``."""

from __future__ import annotations

import gc
import uuid

from hypothesis import given
from hypothesis import strategies as st

from bridge.delivery.changes import ChangeDetector, ChangeKind, Fingerprinter
from bridge.ground.records import (
    LooseRecord,
    PackedRecord,
    make_record,
    pack_columns,
    pack_state,
    unpack_state,
)
from bridge.kube.objects import DeletedFinalStateUnknown, namespace_key, resource_version
from bridge.kube.store import Indexer

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
FP = "00112233445566778899aabbccddeeff"


def fields(r: PackedRecord | LooseRecord) -> tuple[str, str, str, str, bool]:
    return (r.key, r.uid, r.resource_version, r.fingerprint, r.unconfirmed)


def test_canonical_values_pack_into_one_small_bytes_object() -> None:
    r = make_record("ns1/web-0", UID, "123456789", FP)
    assert isinstance(r, PackedRecord)
    assert fields(r) == ("ns1/web-0", UID, "123456789", FP, False)
    assert (r.namespace, r.name) == ("ns1", "web-0")
    # What the store keeps under the key: flags + uid + fingerprint + rv, one untracked bytes.
    assert type(r.packed) is bytes and len(r.packed) == 1 + 16 + 16 + 8
    assert not gc.is_tracked(r.packed)
    u = make_record("ns1/web-0", UID, "123456789", FP, unconfirmed=True)
    assert isinstance(u, PackedRecord) and u.unconfirmed and u != r
    assert u.confirmed() == r and r.confirmed() is r


def test_values_a_packed_record_cannot_give_back_exactly_stay_strings() -> None:
    odd = [
        ("uid-a", "1", FP),  # not a UUID
        (UID.upper(), "1", FP),  # upper case would come back lower case
        (UID.replace("-", ""), "1", FP),  # no dashes
        (UID, "01", FP),  # a leading zero
        (UID, "+1", FP),
        (UID, "-1", FP),
        (UID, str(2**64), FP),
        (UID, "", FP),
        (UID, "abc", FP),
        (UID, "1", FP.upper()),
        (UID, "1", FP[:-2]),
        (UID, "1", "f"),
        ("", "", ""),
    ]
    for uid, rv, fp in odd:
        r = make_record("k", uid, rv, fp, unconfirmed=True)
        assert isinstance(r, LooseRecord), (uid, rv, fp)
        assert fields(r) == ("k", uid, rv, fp, True)
        assert r.confirmed() == LooseRecord("k", uid, rv, fp, False)


@given(
    key=st.text(min_size=1),
    uid=st.one_of(st.uuids().map(str), st.text()),
    rv=st.one_of(st.integers(min_value=0, max_value=2**64 + 5).map(str), st.text()),
    fp=st.one_of(st.binary(min_size=16, max_size=16).map(bytes.hex), st.text()),
    unconfirmed=st.booleans(),
)
def test_every_record_gives_back_exactly_what_it_was_made_of(
    key: str, uid: str, rv: str, fp: str, unconfirmed: bool
) -> None:
    assert fields(make_record(key, uid, rv, fp, unconfirmed)) == (key, uid, rv, fp, unconfirmed)


def test_records_are_kept_by_key() -> None:
    store = Indexer()
    store.add(make_record("ns1/a", UID, "5", FP))
    store.add(make_record("ns2/b", str(uuid.uuid4()), "6", FP))
    store.add(make_record("cluster-wide", "u", "7", "f"))
    assert namespace_key(make_record("ns1/a", UID, "5", FP)) == "ns1/a"
    store.update(make_record("ns1/a", UID, "8", FP))
    assert store.get_by_key("ns1/a") == make_record("ns1/a", UID, "8", FP)
    assert resource_version(store.get_by_key("ns1/a") or {}) == "8"
    # A packed store lists by bucket, not in insertion order (as client-go's map).
    assert {r.key: r for r in store.list()}["ns1/a"] == make_record("ns1/a", UID, "8", FP)
    assert sorted(store.list_keys()) == ["cluster-wide", "ns1/a", "ns2/b"]
    store.delete_by_key("ns1/a")
    assert sorted(store.list_keys()) == ["cluster-wide", "ns2/b"]


def pod(uid: str, rv: str, image: str = "v1") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns1", "uid": uid, "resourceVersion": rv},
        "spec": {"image": image},
    }


def test_change_detection_against_a_record() -> None:
    detector = ChangeDetector(Fingerprinter())
    old = pod(UID, "10")
    record = make_record("ns1/web", UID, "10", detector.fingerprinter.fingerprint(old))
    assert isinstance(record, PackedRecord)
    assert detector.on_update(record, pod(UID, "11")) == []  # only the rv moved
    [c] = detector.on_update(record, pod(UID, "12", image="v2"))
    assert c.kind is ChangeKind.MODIFIED and c.old is None
    # Another object of the same name: the old one's delete carries the record's metadata.
    other = str(uuid.uuid4())
    deleted, added = detector.on_update(record, pod(other, "13"))
    assert deleted.tombstone and deleted.object == {
        "metadata": {"name": "web", "namespace": "ns1", "uid": UID, "resourceVersion": "10"}
    }
    assert added.kind is ChangeKind.ADDED
    # A relist tombstone carrying the record.
    [c] = detector.on_delete(DeletedFinalStateUnknown("ns1/web", record))
    assert c.tombstone and c.object == deleted.object


# Values a checkpoint may hold: canonical ones (packed), near misses that must not
# pack (uppercase, a dash moved, whitespace, "+7", "007", "-7", 2**64, other digits).
_UIDS = st.one_of(
    st.uuids().map(str),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: str(u).replace("-", "", 1) + "-"),
    st.uuids().map(lambda u: " " + str(u)[1:]),
    st.text(),
)
_VERSIONS = st.one_of(
    st.integers(min_value=0, max_value=2**64 + 5).map(str),
    st.integers(min_value=0, max_value=2**64 + 5).map(str),
    st.from_regex(r"[0+-][0-9]{1,3}", fullmatch=True),
    st.sampled_from(
        ["1_0", " 7", "7 ", "\u0663", "", "10000000000000000000", "18446744073709551615"]
    ),
    st.text(),
)
_FPS = st.one_of(
    st.binary(min_size=16, max_size=16).map(bytes.hex),
    st.binary(min_size=16, max_size=16).map(bytes.hex),
    st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper()),
    st.binary(min_size=15, max_size=15).map(lambda b: b.hex() + " 0"),
    st.text(),
)


@given(rows=st.lists(st.tuples(_UIDS, _VERSIONS, _FPS), max_size=40))
def test_packing_columns_is_packing_each_row_or_nothing(rows: list[tuple[str, str, str]]) -> None:
    """A column packs only when every row packs, and then exactly as ``make_record``
    would have packed each (a row that does not read back exactly is never packed)."""
    uids = [r[0] for r in rows]
    versions = [r[1] for r in rows]
    fps = [r[2] for r in rows]
    one_by_one = [pack_state(*row) for row in rows]
    packed = pack_columns(uids, fps, versions)
    if None in one_by_one:
        assert packed is None
    else:
        assert packed == one_by_one
    for (uid, version, fp), state in zip(rows, one_by_one, strict=True):
        record = make_record("ns/a", uid, version, fp)
        assert (state is not None) == isinstance(record, PackedRecord)
        assert record.values() == (uid, version, fp)
        if state is not None:
            assert unpack_state(state) == (uid, version, fp, False)


@given(
    rows=st.lists(
        st.tuples(
            st.uuids().map(str), _VERSIONS, st.binary(min_size=16, max_size=16).map(bytes.hex)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_canonical_columns_pack(rows: list[tuple[str, str, str]]) -> None:
    """Columns of canonical values pack whole: the restart's fast path is taken."""
    rows = [
        r
        for r in rows
        if r[1].isdigit() and r[1].isascii() and str(int(r[1])) == r[1] and len(r[1]) < 20
    ]
    packed = pack_columns([r[0] for r in rows], [r[2] for r in rows], [r[1] for r in rows])
    assert packed == [pack_state(*r) for r in rows]


def test_a_key_moves_between_the_packed_table_and_the_dict_with_its_layout() -> None:
    """Packed records live in the compact table; loose records (and keys the table
    cannot hold) in a dict. A key is in one of them, whichever layout it has now."""
    store = Indexer()
    store.update(make_record("ns/a", UID, "5", FP))
    store.update(make_record("ns/a", "not-a-uuid", "6", FP))  # loose now
    assert len(store) == 1
    assert store.get_by_key("ns/a") == make_record("ns/a", "not-a-uuid", "6", FP)
    store.update(make_record("ns/a", UID, "7", FP))  # packed again
    assert len(store) == 1
    assert store.list() == [make_record("ns/a", UID, "7", FP)]
    assert store.get_by_key("ns/\udc80") is None  # read first, as the informer does
    store.update(make_record("ns/\udc80", UID, "9", FP))  # not UTF-8: the dict takes it
    assert store.get_by_key("ns/\udc80") == make_record("ns/\udc80", UID, "9", FP)
    store.delete_by_key("ns/\udc80")
    store.update(make_record("ns/\0odd", UID, "8", FP))  # a key the table refuses
    assert store.get_by_key("ns/\0odd") == make_record("ns/\0odd", UID, "8", FP)
    assert sorted(store.list_keys()) == ["ns/\0odd", "ns/a"]
    store.delete_by_key("ns/a")
    store.delete_by_key("ns/\0odd")
    assert len(store) == 0
    assert store.list() == []


def test_a_restart_fills_the_packed_table_in_bulk_with_the_last_record_of_a_key() -> None:
    store = Indexer()
    records = [make_record(f"ns/p{i}", str(uuid.uuid4()), str(i + 1), FP) for i in range(3000)]
    records.append(make_record("ns/p7", UID, "9999", FP))
    store.replace(records, "10000")
    assert len(store) == 3000
    assert store.get_by_key("ns/p7") == make_record("ns/p7", UID, "9999", FP)
    assert store.get_by_key("ns/p8") == records[8]


def test_a_restart_listing_a_key_in_both_layouts_keeps_the_last() -> None:
    loose = make_record("ns/a", "not-a-uuid", "6", FP)
    packed = make_record("ns/a", UID, "7", FP)
    for items, last in (([packed, loose], loose), ([loose, packed], packed)):
        store = Indexer()
        store.replace(items, "7")
        assert len(store) == 1
        assert store.list() == [last]
