"""RealFIFO: strict arrival order across keys, one delta per pop or a run of them (client-go the_real_fifo.go)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.kube.fifo import Delta, DeltaType, FIFOClosedError, RealFIFO
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


async def pop_all(fifo: RealFIFO) -> list[tuple[list[Delta], bool]]:
    calls: list[tuple[list[Delta], bool]] = []

    async def record(deltas: list[Delta], is_in_initial_list: bool) -> None:
        calls.append((deltas, is_in_initial_list))

    while len(fifo):
        await asyncio.wait_for(fifo.pop(record), 1)
    return calls


def described(calls: list[tuple[list[Delta], bool]]) -> list[tuple[str, str]]:
    return [(str(d.type), namespace_key(d.object)) for deltas, _ in calls for d in deltas]


async def test_checklist_24_strict_arrival_order_across_keys_one_delta_per_pop() -> None:
    fifo = RealFIFO()
    await fifo.add(pod("a", 1))
    await fifo.add(pod("b", 2))
    await fifo.update(pod("a", 3))
    await fifo.delete(pod("b", 4))
    assert len(fifo) == 4

    calls = await pop_all(fifo)

    assert all(len(deltas) == 1 for deltas, _ in calls)
    assert described(calls) == [
        ("Added", "ns1/a"),
        ("Added", "ns1/b"),
        ("Updated", "ns1/a"),
        ("Deleted", "ns1/b"),
    ]


async def test_checklist_19_no_deltas_merge_not_even_two_deletes() -> None:
    fifo = RealFIFO()
    await fifo.add(pod("a", 1))
    await fifo.update(pod("a", 2))
    # Neither collapsed (as DeltaFIFO does) nor dropped as never seen.
    await fifo.delete(DeletedFinalStateUnknown("ns1/never-seen", None))
    await fifo.delete(pod("never-seen"))
    assert described(await pop_all(fifo)) == [
        ("Added", "ns1/a"),
        ("Updated", "ns1/a"),
        ("Deleted", "ns1/never-seen"),
        ("Deleted", "ns1/never-seen"),
    ]


async def test_checklist_24_replace_puts_tombstones_before_the_replaced_items() -> None:
    known = Indexer()
    known.add(pod("kept", 1))
    known.add(pod("vanished", 3))
    fifo = RealFIFO(known_objects=known)
    await fifo.add(pod("queued-then-gone", 4))
    await fifo.add(pod("deleted-already", 5))
    await fifo.delete(pod("deleted-already", 6))

    await fifo.replace([pod("kept", 1), pod("new", 7)], "10")

    calls = await pop_all(fifo)
    assert described(calls) == [
        ("Added", "ns1/queued-then-gone"),
        ("Added", "ns1/deleted-already"),
        ("Deleted", "ns1/deleted-already"),
        # Tombstones: queued keys first, then keys only the cache knows.
        ("Deleted", "ns1/queued-then-gone"),
        ("Deleted", "ns1/vanished"),
        ("Replaced", "ns1/kept"),
        ("Replaced", "ns1/new"),
    ]
    tombstones = [d.object for deltas, _ in calls for d in deltas if d.type is DeltaType.Deleted]
    assert tombstones[1:] == [
        DeletedFinalStateUnknown("ns1/queued-then-gone", pod("queued-then-gone", 4)),
        DeletedFinalStateUnknown("ns1/vanished", pod("vanished", 3)),
    ]


async def test_checklist_20_known_key_without_object_gets_an_empty_tombstone() -> None:
    class Forgetful:
        def list_keys(self) -> list[str]:
            return ["ns1/lost"]

        def get_by_key(self, key: str) -> RawObject | None:
            return None

    fifo = RealFIFO(known_objects=Forgetful())
    await fifo.replace([], "1")
    calls = await pop_all(fifo)
    assert calls[0][0] == [Delta(DeltaType.Deleted, DeletedFinalStateUnknown("ns1/lost", None))]


async def test_checklist_20_relist_missing_a_queued_key_uses_its_newest_queued_state() -> None:
    fifo = RealFIFO()
    await fifo.add(pod("q", 1))
    await fifo.update(pod("q", 2))

    await fifo.replace([], "10")

    calls = await pop_all(fifo)
    assert calls[-1][0] == [
        Delta(DeltaType.Deleted, DeletedFinalStateUnknown("ns1/q", pod("q", 2)))
    ]


async def test_checklist_22_an_empty_first_list_syncs_at_once() -> None:
    fifo = RealFIFO()
    waiter = asyncio.create_task(fifo.wait_for_sync())
    await fifo.replace([], "1")
    await asyncio.wait_for(waiter, 1)
    assert fifo.has_synced()


async def test_only_the_first_replace_sets_the_initial_population() -> None:
    fifo = RealFIFO()
    await fifo.replace([pod("a")], "1")
    await pop_all(fifo)
    assert fifo.has_synced()
    await fifo.replace([pod("a"), pod("b")], "2")
    assert fifo.has_synced()


async def test_checklist_22_has_synced_after_everything_queued_by_the_first_replace_is_processed() -> (
    None
):
    known = Indexer()
    known.add(pod("gone"))
    fifo = RealFIFO(known_objects=known)
    await fifo.replace([pod("a"), pod("b")], "1")
    assert len(fifo) == 3
    await fifo.add(pod("later"))  # arrived after the list: not part of it

    flags: list[tuple[bool, bool]] = []

    async def process(deltas: list[Delta], is_in_initial_list: bool) -> None:
        await asyncio.sleep(0)
        flags.append((is_in_initial_list, fifo.has_synced()))

    for _ in range(4):
        await fifo.pop(process)
    assert flags == [(True, False), (True, False), (True, False), (False, True)]


async def test_checklist_23_resync_skips_keys_with_anything_queued() -> None:
    known = Indexer()
    known.add(pod("idle"))
    known.add(pod("busy"))
    fifo = RealFIFO(known_objects=known)
    await fifo.update(pod("busy", 2))

    await fifo.resync()

    calls = await pop_all(fifo)
    assert described(calls) == [("Updated", "ns1/busy"), ("Sync", "ns1/idle")]
    assert calls[1][0][0].object is known.get_by_key("ns1/idle")


async def test_checklist_23_resync_without_known_objects_queues_nothing() -> None:
    fifo = RealFIFO()
    await fifo.resync()
    assert len(fifo) == 0


async def test_pop_waits_for_an_item() -> None:
    fifo = RealFIFO()
    popped: list[list[Delta]] = []

    async def record(deltas: list[Delta], is_in_initial_list: bool) -> None:
        popped.append(deltas)

    waiter = asyncio.create_task(fifo.pop(record))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    await fifo.add(pod("a"))
    await asyncio.wait_for(waiter, 1)
    assert [d.type for d in popped[0]] == [DeltaType.Added]


async def test_a_closed_fifo_still_hands_over_what_it_holds_then_fails() -> None:
    fifo = RealFIFO()
    await fifo.add(pod("a"))
    fifo.close()
    assert described(await pop_all(fifo)) == [("Added", "ns1/a")]
    with pytest.raises(FIFOClosedError):
        await pop_all_or_fail(fifo)


async def pop_all_or_fail(fifo: RealFIFO) -> None:
    async def never(deltas: list[Delta], is_in_initial_list: bool) -> None:
        raise AssertionError("nothing to process")

    await asyncio.wait_for(fifo.pop(never), 1)


async def test_close_releases_a_blocked_producer() -> None:
    fifo = RealFIFO(max_queued=1)
    await fifo.add(pod("a"))
    blocked = asyncio.create_task(fifo.update(pod("b")))
    await asyncio.sleep(0)
    assert not blocked.done()
    fifo.close()
    await asyncio.wait_for(blocked, 1)


async def test_close_wakes_a_waiting_pop() -> None:
    fifo = RealFIFO()

    async def never(deltas: list[Delta], is_in_initial_list: bool) -> None:
        raise AssertionError("nothing to process")

    waiter = asyncio.create_task(fifo.pop(never))
    await asyncio.sleep(0)
    fifo.close()
    with pytest.raises(FIFOClosedError):
        await asyncio.wait_for(waiter, 1)


async def test_a_failing_process_drops_only_its_delta() -> None:
    fifo = RealFIFO()
    await fifo.add(pod("a"))
    await fifo.add(pod("b"))

    async def boom(deltas: list[Delta], is_in_initial_list: bool) -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        await fifo.pop(boom)
    assert described(await pop_all(fifo)) == [("Added", "ns1/b")]


async def test_backpressure_counts_items_not_keys() -> None:
    fifo = RealFIFO(max_queued=2)
    await fifo.add(pod("a", 1))
    await fifo.update(pod("a", 2))
    third = asyncio.create_task(fifo.update(pod("a", 3)))
    await asyncio.sleep(0.01)
    assert not third.done()

    await asyncio.wait_for(fifo.resync(), 1)  # never waits
    await asyncio.wait_for(fifo.replace([pod("a", 2)], "2"), 1)  # never waits

    async def drop(deltas: list[Delta], is_in_initial_list: bool) -> None:
        pass

    # The relist queued one more item of the same key: the producer waits until
    # fewer than two items (not keys) are queued.
    assert len(fifo) == 3
    await fifo.pop(drop)
    await asyncio.sleep(0.01)
    assert not third.done()
    await fifo.pop(drop)
    await asyncio.wait_for(third, 1)


# -- pop_batch: a run of deltas per pop ---------------------------------------------


async def test_a_batch_is_what_was_queued_in_arrival_order_up_to_its_limit() -> None:
    fifo = RealFIFO()
    for i in range(5):
        await fifo.add(pod(f"p{i}", i + 1))
    await fifo.update(pod("p0", 9))  # a key may repeat within a batch
    seen: list[tuple[str, str, bool]] = []

    async def handle(batch: deque[Delta], is_in_initial_list: bool) -> None:
        while batch:
            d = batch.popleft()
            seen.append((str(d.type), namespace_key(d.object), is_in_initial_list))

    await fifo.pop_batch(handle, 4)
    assert len(seen) == 4 and len(fifo) == 2
    await fifo.pop_batch(handle, 4)
    assert [(t, k) for t, k, _ in seen] == [
        *(("Added", f"ns1/p{i}") for i in range(5)),
        ("Updated", "ns1/p0"),
    ]
    assert fifo.processed_total == fifo.queued_total == 6


async def test_a_batch_never_runs_past_the_end_of_the_first_list() -> None:
    """Its deltas share ``is_in_initial_list``: the first list's last item ends a batch."""
    fifo = RealFIFO(known_objects=Indexer(key_func=namespace_key))
    await fifo.replace([pod("a", 1), pod("b", 2), pod("c", 3)], "3")
    await fifo.add(pod("d", 4))
    await fifo.update(pod("a", 5))
    batches: list[tuple[list[str], bool]] = []

    async def handle(batch: deque[Delta], is_in_initial_list: bool) -> None:
        batches.append(([namespace_key(d.object) for d in batch], is_in_initial_list))
        batch.clear()

    await fifo.pop_batch(handle, 100)
    assert batches == [(["ns1/a", "ns1/b", "ns1/c"], True)]
    assert fifo.has_synced()
    await fifo.pop_batch(handle, 100)
    assert batches[1] == (["ns1/d", "ns1/a"], False)


async def test_deltas_left_in_a_cancelled_batch_never_count_as_processed() -> None:
    """Whoever ties a resourceVersion to ``processed_total`` (the watermark) must not
    take the deltas a cancelled batch never reached for done."""
    fifo = RealFIFO(known_objects=Indexer(key_func=namespace_key))
    await fifo.replace([pod(f"p{i}", i + 1) for i in range(5)], "5")
    started = asyncio.Event()

    async def handle(batch: deque[Delta], is_in_initial_list: bool) -> None:
        batch.popleft()
        batch.popleft()  # two taken, as the informer takes each before handling it
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(fifo.pop_batch(handle, 100))
    await asyncio.wait_for(started.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fifo.processed_total == 2
    assert not fifo.has_synced()
    assert fifo.is_idle()  # nothing in process, nothing queued: the three are gone


# -- model check: the FIFO feeds a cache that ends equal to the latest state ----------

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

    With no ``max_queued`` and items present, the FIFO's methods never wait: driving
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


@settings(max_examples=300, deadline=None)
@given(script=ops)
def test_random_operations_leave_the_cache_equal_to_the_latest_state(
    script: list[tuple[str, Any]],
) -> None:
    cache = Indexer()
    fifo = RealFIFO(known_objects=cache)
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
