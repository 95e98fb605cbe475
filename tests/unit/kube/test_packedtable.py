"""PackedTable: the slim cache's compact map of key to packed state."""

from __future__ import annotations

import os
import random
import tracemalloc

import pytest

from bridge.kube.packedtable import PackedTable, storable


def value(i: int, width: int = 5) -> bytes:
    return i.to_bytes(width, "big")


class TestActsAsADict:
    @pytest.mark.parametrize("seed", range(8))
    def test_random_puts_pops_and_gets_agree_with_a_dict(self, seed: int) -> None:
        rnd = random.Random(seed)
        table, expected = PackedTable(5), {}
        # Short keys, keys that are prefixes or suffixes of others, non-ASCII ones.
        keys = [f"ns{rnd.randrange(4)}/p{rnd.randrange(1500)}" for _ in range(2000)]
        keys += ["a", "b", "ab", "a/b", "/", "é/ü", "x" * 300]
        for step in range(12_000):
            key = rnd.choice(keys)
            op = rnd.random()
            if op < 0.5:
                v = os.urandom(5)
                assert table.put(key, v)
                expected[key] = v
            elif op < 0.7:
                assert table.pop(key) == expected.pop(key, None)
            else:
                assert table.get(key) == expected.get(key)
            if step % 3000 == 0:
                assert len(table) == len(expected)
                assert dict(table.items()) == expected
                assert sorted(table.keys()) == sorted(expected)
        assert len(table) == len(expected)
        assert dict(table.items()) == expected
        assert all((k in table) == (k in expected) for k in keys)

    def test_a_write_right_after_a_read_of_another_key_lands_on_its_own_key(self) -> None:
        table = PackedTable(5)
        table.put("ns/a", value(1))
        table.get("ns/b")  # remembered as absent
        table.put("ns/a", value(2))
        table.put("ns/b", value(3))
        assert (table.get("ns/a"), table.get("ns/b")) == (value(2), value(3))

    def test_clear_empties_it(self) -> None:
        table = PackedTable(5)
        for i in range(1000):
            table.put(f"k{i}", value(i))
        table.clear()
        assert len(table) == 0
        assert table.get("k1") is None
        assert list(table.items()) == []


class TestKeysItCannotHold:
    def test_a_key_with_a_nul_is_refused_and_never_matches_two_neighbours(self) -> None:
        table = PackedTable(5)
        # Two keys whose bucket is also the bucket of "<a>\\0<b>": there, the bytes
        # of the two neighbours are exactly what a search for that key looks for.
        mask = len(table._buckets) - 1
        a = "a"
        b = next(
            b
            for b in (f"b{i}" for i in range(1_000_000))
            if hash(b) & mask == hash(a) & mask == hash(f"{a}\0{b}") & mask
        )
        table.put(a, value(1))
        table.put(b, value(2))
        assert not storable(f"{a}\0{b}")
        assert table.put(f"{a}\0{b}", value(3)) is False
        assert table.get(f"{a}\0{b}") is None
        assert f"{a}\0{b}" not in table
        assert len(table) == 2

    @pytest.mark.parametrize("key", ["a\0b", "ns/\udc80"])
    def test_a_key_it_cannot_hold_is_refused_after_a_read_of_it(self, key: str) -> None:
        """The informer reads a key's old state, then writes its new one: a read of a
        key the table cannot hold must neither fail nor let the write through."""
        table = PackedTable(5)
        for i in range(1000):  # every bucket holds keys
            table.put(f"k{i}", value(i))
        table.put("a", value(1))
        table.put("b", value(2))
        assert table.get(key) is None
        assert key not in table
        assert table.put(key, value(3)) is False
        assert len(table) == 1002
        assert sorted(table.keys()) == sorted([f"k{i}" for i in range(1000)] + ["a", "b"])

    def test_a_key_utf8_cannot_encode_is_refused(self) -> None:
        table = PackedTable(5)
        assert not storable("ns/\udc80")
        assert table.put("ns/\udc80", value(1)) is False
        assert len(table) == 0

    def test_a_value_of_another_width_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="6 bytes in a table of 5-byte values"):
            PackedTable(5).put("k", b"123456")


class TestLoad:
    def test_a_bulk_load_into_an_empty_table_keeps_the_last_value_of_a_key(self) -> None:
        table = PackedTable(5)
        pairs = [(f"ns/p{i}", value(i)) for i in range(5000)] + [("ns/p7", value(99))]
        table.load(pairs, expected=len(pairs))
        assert len(table) == 5000
        assert table.get("ns/p7") == value(99)
        assert dict(table.items()) == dict(pairs)

    def test_a_load_into_a_table_that_holds_keys_adds_to_them(self) -> None:
        table = PackedTable(5)
        table.put("ns/old", value(1))
        table.put("ns/p3", value(2))
        table.load([(f"ns/p{i}", value(i)) for i in range(1000)])
        assert len(table) == 1001
        assert table.get("ns/old") == value(1)
        assert table.get("ns/p3") == value(3)


class TestMemory:
    def test_a_hundred_thousand_keys_cost_well_under_a_dict_of_bytes(self) -> None:
        """A dict of key string to 41-byte value costs ~200 B per key (two objects per
        entry); the table shares a bucket's header among its keys."""
        keys = [f"namespace-{i % 50:02d}/pod-name-{i:08d}" for i in range(100_000)]
        values = [os.urandom(41) for _ in range(100_000)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            table = PackedTable(41)
            for key, v in zip(keys, values, strict=True):
                table.put(key, v)
            per_key = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
        finally:
            tracemalloc.stop()
        # 31 B of key, one separator and 41 B of value are 73 B of the ~90 B.
        assert per_key < 110, f"{per_key:.0f} B per key"

    def test_growing_splits_buckets_in_place_without_a_second_copy(self) -> None:
        """Past 131,072 keys (8 per bucket) the table grows fourfold and moves every
        key; what it holds meanwhile must be one bucket's split, not the table again
        (that held 12 MiB more at a 100k-pod first sync)."""
        v = os.urandom(41)
        tracemalloc.start()  # before the table is built, so that its frees count
        try:
            table = PackedTable(41)
            table.load((f"namespace-{i % 50:02d}/pod-name-{i:08d}", v) for i in range(131_072))
            assert len(table._buckets) == 16_384
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            table.put("namespace-00/one-more", v)  # one key too many: the table grows
            after, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(table._buckets) == 65_536
        # More buckets, each with its header: ~2 MiB more for good.
        assert after - before < 3 << 20, f"grew by {(after - before) >> 10} KiB"
        assert peak - after < 512 << 10, f"growth held {(peak - after) >> 10} KiB more"


class TestLoadColumns:
    def test_columns_load_as_their_pairs_do(self) -> None:
        keys = [f"ns/p{i}" for i in range(5000)]
        values = [value(i) for i in range(5000)]
        table = PackedTable(5)
        table.load_columns(keys, values)
        pairs = PackedTable(5)
        pairs.load(zip(keys, values, strict=True), expected=len(keys))
        assert len(table) == 5000
        assert dict(table.items()) == dict(pairs.items()) == dict(zip(keys, values, strict=True))
        assert table.get("ns/p4999") == value(4999) and table.get("ns/p5000") is None
        table.put("ns/p1", value(7))  # an ordinary table afterwards
        assert table.pop("ns/p2") == value(2) and table.get("ns/p1") == value(7)

    def test_columns_into_a_table_that_holds_keys_add_to_them(self) -> None:
        table = PackedTable(5)
        table.put("ns/old", value(1))
        table.put("ns/p3", value(2))
        table.load_columns([f"ns/p{i}" for i in range(1000)], [value(i) for i in range(1000)])
        assert len(table) == 1001
        assert table.get("ns/old") == value(1) and table.get("ns/p3") == value(3)

    def test_columns_of_other_lengths_or_widths_are_errors(self) -> None:
        with pytest.raises(ValueError, match="2 keys and 1 values"):
            PackedTable(5).load_columns(["a", "b"], [value(1)])
        with pytest.raises(ValueError, match="other lengths in a table of 5-byte values"):
            PackedTable(5).load_columns(["a", "b"], [value(1), b"123456"])
        with pytest.raises(ValueError, match="other lengths"):
            PackedTable(5).load_columns(["a"], [b"1234"])
