"""DeltaFIFO: deltas grouped per key (client-go delta_fifo.go), plus a model check of both FIFOs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.kube.fifo import Delta, DeltaFIFO, DeltaType, FIFOClosedError, RealFIFO
from bridge.kube.objects import DeletedFinalStateUnknown, RawObject, namespace_key
from bridge.kube.store import Indexer


def pod(name: str, rv: int = 1, ns: str = "ns1") -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        },
    }


class Popped:
    """Records what each pop handed over."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Delta], bool]] = []

    async def __call__(self, deltas: list[Delta], is_in_initial_list: bool) -> None:
        self.calls.append((deltas, is_in_initial_list))


async def pop_all(fifo: DeltaFIFO | RealFIFO) -> Popped:
    popped = Popped()
    while len(fifo):
        await asyncio.wait_for(fifo.pop(popped), 1)
    return popped


def types(deltas: list[Delta]) -> list[DeltaType]:
    return [d.type for d in deltas]


# -- grouping and order ---------------------------------------------------------


async def test_keys_pop_in_order_of_first_arrival_with_all_their_deltas() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a", 1))
    await fifo.add(pod("b", 2))
    await fifo.update(pod("a", 3))
    assert fifo.list_keys() == ["ns1/a", "ns1/b"]

    popped = await pop_all(fifo)

    assert [(namespace_key(d[0].object), types(d)) for d, _ in popped.calls] == [
        ("ns1/a", [DeltaType.Added, DeltaType.Updated]),
        ("ns1/b", [DeltaType.Added]),
    ]


async def test_a_key_queued_again_after_its_pop_goes_to_the_back() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a"))
    await fifo.add(pod("b"))
    await fifo.pop(Popped())
    await fifo.update(pod("a", 2))
    assert fifo.list_keys() == ["ns1/b", "ns1/a"]


async def test_checklist_19_add_then_update_are_not_merged() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a", 1))
    await fifo.update(pod("a", 2))
    deltas = fifo.get_by_key("ns1/a")
    assert deltas is not None
    assert types(deltas) == [DeltaType.Added, DeltaType.Updated]
    assert [d.object["metadata"]["resourceVersion"] for d in deltas] == ["1", "2"]


async def test_checklist_19_two_deletes_collapse_keeping_the_real_object_over_a_tombstone() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a"))
    await fifo.delete(DeletedFinalStateUnknown("ns1/a", None))
    await fifo.delete(pod("a", 2))
    deltas = fifo.get_by_key("ns1/a")
    assert deltas is not None
    assert types(deltas) == [DeltaType.Added, DeltaType.Deleted]
    assert deltas[1].object == pod("a", 2)

    # The other way round: the real delete came first and stays.
    await fifo.delete(DeletedFinalStateUnknown("ns1/a", None))
    deltas = fifo.get_by_key("ns1/a")
    assert deltas is not None
    assert types(deltas) == [DeltaType.Added, DeltaType.Deleted]
    assert deltas[1].object == pod("a", 2)


async def test_checklist_19_two_real_deletes_keep_the_first() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a"))
    await fifo.delete(pod("a", 2))
    await fifo.delete(pod("a", 3))
    deltas = fifo.get_by_key("ns1/a")
    assert deltas is not None
    assert [d.object for d in deltas if d.type is DeltaType.Deleted] == [pod("a", 2)]


async def test_delete_of_a_key_neither_queued_nor_known_is_dropped() -> None:
    known = Indexer()
    known.add(pod("k"))
    fifo = DeltaFIFO(known_objects=known)
    await fifo.delete(pod("ghost"))
    await fifo.delete(pod("k"))
    assert fifo.list_keys() == ["ns1/k"]

    bare = DeltaFIFO()
    await bare.delete(pod("ghost"))
    assert len(bare) == 0


# -- replace (relist) -----------------------------------------------------------


async def test_checklist_20_relist_missing_a_known_key_queues_a_tombstone_with_last_known_state() -> (
    None
):
    known = Indexer()
    known.add(pod("kept", 1))
    known.add(pod("gone", 7))
    fifo = DeltaFIFO(known_objects=known)

    await fifo.replace([pod("kept", 1)], "10")

    gone = fifo.get_by_key("ns1/gone")
    assert gone == [Delta(DeltaType.Deleted, DeletedFinalStateUnknown("ns1/gone", pod("gone", 7)))]
    kept = fifo.get_by_key("ns1/kept")
    assert kept == [Delta(DeltaType.Replaced, pod("kept", 1))]


async def test_checklist_20_relist_missing_a_queued_key_uses_its_newest_queued_state() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("q", 1))
    await fifo.update(pod("q", 2))

    await fifo.replace([], "10")

    deltas = fifo.get_by_key("ns1/q")
    assert deltas is not None
    assert deltas[-1] == Delta(DeltaType.Deleted, DeletedFinalStateUnknown("ns1/q", pod("q", 2)))


async def test_checklist_20_a_tombstone_may_carry_no_object() -> None:
    class Forgetful:
        """Lists a key it can no longer return: client-go queues the tombstone anyway."""

        def list_keys(self) -> list[str]:
            return ["ns1/lost"]

        def get_by_key(self, key: str) -> RawObject | None:
            return None

    fifo = DeltaFIFO(known_objects=Forgetful())
    await fifo.replace([], "1")
    assert fifo.get_by_key("ns1/lost") == [
        Delta(DeltaType.Deleted, DeletedFinalStateUnknown("ns1/lost", None))
    ]


async def test_replace_emits_sync_when_replaced_type_is_off() -> None:
    fifo = DeltaFIFO(emit_delta_type_replaced=False)
    await fifo.replace([pod("a")], "1")
    assert fifo.get_by_key("ns1/a") == [Delta(DeltaType.Sync, pod("a"))]


async def test_checklist_22_has_synced_only_after_every_first_list_item_was_processed() -> None:
    known = Indexer()
    known.add(pod("gone"))
    fifo = DeltaFIFO(known_objects=known)
    assert not fifo.has_synced()

    await fifo.replace([pod("a"), pod("b")], "5")
    assert len(fifo) == 3  # two items and one tombstone
    assert not fifo.has_synced()

    seen_synced_while_processing: list[bool] = []
    initial_flags: list[bool] = []

    async def process(deltas: list[Delta], is_in_initial_list: bool) -> None:
        initial_flags.append(is_in_initial_list)
        await asyncio.sleep(0)  # processing takes a turn of the loop
        seen_synced_while_processing.append(fifo.has_synced())

    for _ in range(3):
        await fifo.pop(process)
    # Not even while the last item was being processed.
    assert seen_synced_while_processing == [False, False, False]
    assert initial_flags == [True, True, True]
    assert fifo.has_synced()

    await fifo.add(pod("c"))
    await fifo.pop(process)
    assert initial_flags[-1] is False


async def test_checklist_22_an_empty_first_list_syncs_at_once() -> None:
    fifo = DeltaFIFO()
    waiter = asyncio.create_task(fifo.wait_for_sync())
    await fifo.replace([], "1")
    await asyncio.wait_for(waiter, 1)
    assert fifo.has_synced()


async def test_only_the_first_replace_sets_the_initial_population() -> None:
    fifo = DeltaFIFO()
    await fifo.replace([pod("a")], "1")
    await fifo.pop(Popped())
    assert fifo.has_synced()
    await fifo.replace([pod("a"), pod("b")], "2")
    assert fifo.has_synced()


# -- resync ---------------------------------------------------------------------


async def test_checklist_23_resync_queues_sync_only_for_known_keys_with_nothing_queued() -> None:
    calls: list[str] = []

    class Known:
        """The cache as the FIFO sees it; records every question, to show nothing else is asked."""

        def __init__(self) -> None:
            self.items = {"ns1/idle": pod("idle"), "ns1/busy": pod("busy")}

        def list_keys(self) -> list[str]:
            calls.append("list_keys")
            return list(self.items)

        def get_by_key(self, key: str) -> RawObject | None:
            calls.append(f"get:{key}")
            return self.items.get(key)

    fifo = DeltaFIFO(known_objects=Known())
    await fifo.update(pod("busy", 2))
    calls.clear()

    await fifo.resync()

    assert fifo.get_by_key("ns1/idle") == [Delta(DeltaType.Sync, pod("idle"))]
    assert fifo.get_by_key("ns1/busy") == [Delta(DeltaType.Updated, pod("busy", 2))]
    assert set(calls) <= {"list_keys", "get:ns1/idle"}


async def test_checklist_23_resync_without_known_objects_queues_nothing() -> None:
    fifo = DeltaFIFO()
    await fifo.resync()
    assert len(fifo) == 0


# -- popping, closing, failures, backpressure ---------------------------------------


async def test_pop_waits_for_an_item() -> None:
    fifo = DeltaFIFO()
    popped = Popped()
    waiter = asyncio.create_task(fifo.pop(popped))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await fifo.add(pod("a"))
    await asyncio.wait_for(waiter, 1)
    assert types(popped.calls[0][0]) == [DeltaType.Added]


async def test_close_wakes_a_waiting_pop_and_later_pops_fail() -> None:
    fifo = DeltaFIFO()
    waiter = asyncio.create_task(fifo.pop(Popped()))
    await asyncio.sleep(0)
    fifo.close()
    with pytest.raises(FIFOClosedError):
        await asyncio.wait_for(waiter, 1)
    with pytest.raises(FIFOClosedError):
        await fifo.pop(Popped())


async def test_a_closed_fifo_still_hands_over_what_it_holds() -> None:
    fifo = DeltaFIFO()
    await fifo.add(pod("a"))
    fifo.close()
    popped = Popped()
    await fifo.pop(popped)
    assert len(popped.calls) == 1
    with pytest.raises(FIFOClosedError):
        await fifo.pop(popped)


async def test_a_failing_process_loses_only_its_own_item_and_still_counts_toward_sync() -> None:
    fifo = DeltaFIFO()
    await fifo.replace([pod("a"), pod("b")], "1")

    async def boom(deltas: list[Delta], is_in_initial_list: bool) -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        await fifo.pop(boom)
    assert fifo.list_keys() == ["ns1/b"]
    popped = await pop_all(fifo)
    assert len(popped.calls) == 1
    assert fifo.has_synced()


async def test_backpressure_add_waits_while_max_keys_are_queued() -> None:
    fifo = DeltaFIFO(max_queued=2)
    await fifo.add(pod("a"))
    await fifo.add(pod("b"))
    third = asyncio.create_task(fifo.add(pod("c")))
    await asyncio.sleep(0.01)
    assert not third.done()
    assert fifo.list_keys() == ["ns1/a", "ns1/b"]

    # A relist never waits, even on a full queue.
    await asyncio.wait_for(fifo.replace([pod("a"), pod("b"), pod("d")], "2"), 1)

    while not third.done():
        await asyncio.wait_for(fifo.pop(Popped()), 1)
    await third
    assert "ns1/c" in fifo.list_keys()


async def test_close_releases_a_blocked_producer() -> None:
    fifo = DeltaFIFO(max_queued=1)
    await fifo.add(pod("a"))
    blocked = asyncio.create_task(fifo.update(pod("b")))
    await asyncio.sleep(0)
    fifo.close()
    await asyncio.wait_for(blocked, 1)


# -- model check: both FIFOs feed a cache that ends equal to the latest state --------

ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "update", "delete"]), st.sampled_from("abcde")),
        st.tuples(st.just("replace"), st.frozensets(st.sampled_from("abcde"))),
        st.tuples(st.just("resync"), st.none()),
        st.tuples(st.just("pop"), st.none()),
    ),
    max_size=40,
)


def run_now(coro: Coroutine[Any, Any, None]) -> None:
    """Drive a coroutine that must finish without suspending.

    With no ``max_queued`` and items present, FIFO methods never wait: driving
    them by hand keeps hundreds of examples fast and checks that, too.
    """
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("a FIFO operation suspended where it must not")


def apply(cache: Indexer, deltas: list[Delta]) -> None:
    """HandleDeltas, minus the handlers."""
    for d in deltas:
        if d.type is DeltaType.Deleted:
            cache.delete(d.object)
        else:
            assert not isinstance(d.object, DeletedFinalStateUnknown)
            cache.update(d.object)


@pytest.mark.parametrize("fifo_cls", [DeltaFIFO, RealFIFO])
@settings(max_examples=300, deadline=None)
@given(script=ops)
def test_random_operations_leave_the_cache_equal_to_the_latest_state(
    fifo_cls: type[DeltaFIFO | RealFIFO], script: list[tuple[str, Any]]
) -> None:
    cache = Indexer()
    fifo = fifo_cls(known_objects=cache)
    model: dict[str, RawObject] = {}
    rv = 0

    async def process(deltas: list[Delta], is_in_initial_list: bool) -> None:
        apply(cache, deltas)

    for op, arg in script:
        rv += 1
        if op in ("add", "update"):
            obj = pod(arg, rv)
            run_now(getattr(fifo, op)(obj))
            model[namespace_key(obj)] = obj
        elif op == "delete":
            key = f"ns1/{arg}"
            # The reflector deletes what the server deleted: the last state it saw.
            run_now(fifo.delete(model.get(key, pod(arg, rv))))
            model.pop(key, None)
        elif op == "replace":
            items = [pod(name, rv) for name in sorted(arg)]
            run_now(fifo.replace(items, str(rv)))
            model = {namespace_key(o): o for o in items}
        elif op == "resync":
            run_now(fifo.resync())
        elif op == "pop" and len(fifo):
            run_now(fifo.pop(process))

    while len(fifo):
        run_now(fifo.pop(process))

    assert {k: cache.get_by_key(k) for k in cache.list_keys()} == model
    if script:
        assert fifo.has_synced() or not any(
            op in ("add", "update", "delete", "replace") for op, _ in script
        )
