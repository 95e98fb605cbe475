"""The outbox core, one invariant per test, with fake time and no event loop.

The informer's cache is a plain dict here (``Cache``): the outbox reads digests
from it, as the pipeline's outbox reads them from the informer's store.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from dataclasses import dataclass, field

import pytest

from bridge.delivery.outbox import Batch, Outbox
from bridge.ground.digest import CERTAIN, DELETING, GONE, UNCERTAIN, Digest
from bridge.ground.envelope import Event


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cache:
    """The informer's cache as the outbox sees it: key → digest."""

    items: dict[str, Digest] = field(default_factory=dict)

    def get(self, key: str) -> Digest | None:
        return self.items.get(key)


def event(uid: str, rv: str, kind: str = "modified") -> Event:
    return Event(
        id=f"{uid}:deleted" if kind == "deleted" else f"{uid}:{rv}",
        type=f"io.k8s.core.v1.Pod.{kind}",
        source="k8s://t/v1/pods",
        subject="ns/x",
        time="2024-01-01T00:00:00Z",
        resource_version=rv,
        initial=False,
        # What the contract requires of a change's data (docs/contract/event.schema.json).
        data={
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "x", "namespace": "ns", "uid": uid, "resourceVersion": rv},
            }
        },
    )


class World:
    """An outbox plus the cache it reads, with helpers that act like the informer."""

    def __init__(self, watermark: str = "") -> None:
        self.clock = Clock()
        self.cache = Cache()
        self.outbox = Outbox(self.cache.get, watermark=watermark, clock=self.clock)
        self.queued = 0  # the FIFO's queued_total
        self.processed = 0  # the FIFO's processed_total

    def change(self, key: str, uid: str, rv: int, fp: str = "f") -> None:
        """A watch event queued by the reflector and processed by the informer."""
        self.queued += 1
        self.outbox.observe(self.queued, str(rv))
        self.outbox.progress(self.processed)
        d = Digest(key, uid, str(rv), fp)
        self.cache.items[key] = d
        self.outbox.decide(key, uid, event(uid, str(rv)), d)
        self.processed += 1
        self.outbox.progress(self.processed)

    def delete(self, key: str, uid: str, rv: int) -> None:
        self.queued += 1
        self.outbox.observe(self.queued, str(rv))
        self.cache.items.pop(key, None)
        self.outbox.decide(key, uid, event(uid, str(rv), "deleted"), None)
        self.processed += 1
        self.outbox.progress(self.processed)

    def quiet(self, key: str, rv: int) -> None:
        """An update that publishes nothing (an ignored field): only the RV moves."""
        self.queued += 1
        self.outbox.observe(self.queued, str(rv))
        old = self.cache.items[key]
        self.cache.items[key] = Digest(key, old.uid, str(rv), old.fingerprint)
        self.processed += 1
        self.outbox.progress(self.processed)

    def publish(self, limit: int = 100) -> Batch:
        batch = self.outbox.take(limit)
        assert batch is not None
        self.outbox.acknowledged(batch)
        return batch

    def commit(self) -> tuple[str, dict[str, Digest], list[str]]:
        commit = self.outbox.checkpoint()
        if commit is None:
            return self.outbox.committed_watermark, {}, []
        upserts, deletes = self.outbox.rows(commit.keys, commit.watermark)
        self.outbox.committed(commit)
        return commit.watermark, {d.key: d for d in upserts}, deletes


# -- the watermark -------------------------------------------------------------


def test_watermark_never_passes_an_unacknowledged_event() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.change("b", "ub", 11)
    first = w.outbox.take(1)  # a@10 only
    assert first is not None
    w.outbox.acknowledged(first)
    w.outbox.take(1)  # b@11 taken (written ahead, in flight), never acknowledged
    watermark, upserts, _ = w.commit()
    assert watermark == "10"
    assert set(upserts) == {"a"}  # b is not certain: its event may still be lost


def test_watermark_covers_quiet_updates_and_bookmarks_once_everything_before_is_acked() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.quiet("a", 11)
    w.outbox.observe(w.queued, "15")  # a bookmark: the RV moves, nothing is queued
    w.outbox.progress(w.processed)
    assert w.commit()[0] == ""  # a@10 not yet acknowledged
    w.publish()
    assert w.commit()[0] == "15"


def test_watermark_advances_under_churn_that_never_pauses() -> None:
    """The queue is never empty, yet every commit moves the watermark to what is acked."""
    w = World()
    watermarks = []
    rv = 0
    for _ in range(50):
        for _ in range(10):
            rv += 1
            w.change(f"k{rv % 7}", f"u{rv % 7}", rv)
        w.publish(8)  # a batch leaves; the rest waits while more keeps coming
        assert w.outbox.queued > 0
        watermarks.append(int(w.commit()[0]))
    # Every round the watermark moved, to exactly the last acknowledged event.
    assert watermarks == [8 * r for r in range(1, 51)]


def test_a_mark_waits_for_the_items_queued_before_it() -> None:
    """An RV observed while earlier items are still in the FIFO is not yet a mark."""
    w = World()
    w.outbox.observe(3, "30")  # the reflector queued 3 items and stands at 30
    w.outbox.progress(2)  # the informer has processed only 2 of them
    assert w.commit()[0] == ""
    w.outbox.progress(3)
    assert w.commit()[0] == "30"


def test_lag_is_the_age_of_the_oldest_uncommitted_position() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.clock.now += 1.5
    assert w.outbox.lag() == pytest.approx(1.5)
    w.publish()
    w.commit()
    assert w.outbox.lag() == 0.0


# -- write-ahead -------------------------------------------------------------------


def test_take_writes_ahead_the_state_the_bus_may_hold() -> None:
    w = World()
    w.change("a", "ua", 10, fp="f1")
    w.change("a", "ua", 11, fp="f2")
    w.change("b", "ub", 12)
    batch = w.outbox.take(10)
    assert batch is not None
    rows = {d.key: d for d in batch.ahead}
    assert rows["a"] == Digest("a", "ua", "11", "f2", UNCERTAIN)  # the last state of a in the batch
    assert rows["b"].state == UNCERTAIN


def test_a_delete_is_written_ahead_as_deleting_and_recreate_names_the_prior_uid() -> None:
    w = World()
    w.change("a", "u1", 10)
    w.publish()
    w.delete("a", "u1", 11)
    gone = w.outbox.take(10)
    assert gone is not None
    assert gone.ahead == [Digest("a", "u1", "11", "", DELETING)]
    w.change("a", "u2", 12)  # re-created while the delete is still unacknowledged
    again = w.outbox.take(10)
    assert again is not None
    assert again.ahead == [Digest("a", "u2", "12", "f", UNCERTAIN, prior="u1")]
    w.outbox.acknowledged(gone)
    w.outbox.acknowledged(again)
    _, upserts, deletes = w.commit()
    assert upserts["a"] == Digest("a", "u2", "12", "f", CERTAIN)
    assert deletes == []


def test_an_acknowledged_delete_leaves_the_checkpoint() -> None:
    w = World()
    w.change("a", "u1", 10)
    w.publish()
    w.commit()
    w.delete("a", "u1", 11)
    w.publish()
    watermark, upserts, deletes = w.commit()
    assert (watermark, upserts, deletes) == ("11", {}, ["a"])


# -- failures, order, shutdown ---------------------------------------------------------


def test_a_failed_publish_loses_nothing_and_keeps_order() -> None:
    """The driver retries the batch it holds; the core refuses any other order."""
    w = World()
    for rv in range(10, 15):
        w.change("a", "ua", rv, fp=f"f{rv}")
    first = w.outbox.take(2)
    second = w.outbox.take(2)
    assert first is not None and second is not None
    with pytest.raises(RuntimeError, match="out of order"):
        w.outbox.acknowledged(second)
    # Nothing was lost while the bus was down: the same batch, then the next.
    assert [e.event.id for e in first.entries] == ["ua:10", "ua:11"]
    w.outbox.acknowledged(first)
    w.outbox.acknowledged(second)
    rest = w.outbox.take(10)
    assert rest is not None and [e.event.id for e in rest.entries] == ["ua:14"]
    assert w.outbox.unacknowledged == 1


def test_shutdown_commits_what_was_acknowledged_and_leaves_the_rest_written_ahead() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    w.change("b", "ub", 11)
    w.outbox.take(10)  # in flight when the process stops
    w.change("c", "uc", 12)  # decided, never taken
    watermark, upserts, _ = w.commit()
    assert watermark == "10"
    assert set(upserts) == {"a"}
    assert w.outbox.is_open("b") and w.outbox.is_open("c")


def test_a_key_changed_during_a_commit_stays_dirty() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    commit = w.outbox.checkpoint()
    assert commit is not None
    w.quiet("a", 11)
    w.outbox.touch("a")  # the cache moved while the store was writing
    w.outbox.committed(commit)
    again = w.outbox.checkpoint()
    assert again is not None and [d.resource_version for d in w.outbox.rows(again.keys)[0]] == [
        "11"
    ]


def test_a_failed_commit_offers_its_watermark_again() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    commit = w.outbox.checkpoint()
    assert commit is not None and commit.watermark == "10"
    w.outbox.commit_failed(commit)
    again = w.outbox.checkpoint()
    assert again is not None and again.watermark == "10" and set(again.keys) == {"a"}


def test_the_oldest_unacked_age_counts_from_the_oldest_batch_taken() -> None:
    w = World()
    assert w.outbox.oldest_unacked_age() == 0.0
    w.change("a", "ua", 10)
    first = w.outbox.take(1)
    w.clock.now += 30
    w.change("b", "ub", 11)
    second = w.outbox.take(1)
    w.clock.now += 5
    assert first is not None and second is not None
    assert w.outbox.oldest_unacked_age() == pytest.approx(35)
    w.outbox.acknowledged(first)
    assert w.outbox.oldest_unacked_age() == pytest.approx(5)
    w.outbox.acknowledged(second)
    assert w.outbox.oldest_unacked_age() == 0.0


# -- resume --------------------------------------------------------------------


def test_uncertain_keys_are_never_committed_until_resolved() -> None:
    w = World(watermark="9")
    w.cache.items["a"] = Digest("a", "ua", "", "f")
    w.outbox.restore_uncertain([Digest("a", "ua", "10", "f", UNCERTAIN)])
    w.outbox.touch("a")
    assert w.commit() == ("9", {}, [])
    resolved = w.outbox.resolve("a")
    assert resolved is not None and resolved.resource_version == "10"
    w.change("a", "ua", 10)  # republished with the same id
    w.publish()
    watermark, upserts, _ = w.commit()
    assert upserts["a"].state == CERTAIN and watermark == "10"


def test_a_resent_prior_delete_keeps_the_uncertain_state_of_its_key() -> None:
    """Restart: the row said "uid u2 may be on the bus, and the delete of u1 too"."""
    w = World(watermark="9")
    w.outbox.restore_uncertain([Digest("a", "u2", "12", "g", UNCERTAIN, prior="u1")])
    w.outbox.decide("a", "u1", event("u1", "", "deleted"), None)  # re-sent at once
    batch = w.outbox.take(10)
    assert batch is not None
    # Written ahead again: u2 is still uncertain, and u1's delete is on its way.
    assert batch.ahead == [Digest("a", "u2", "12", "g", UNCERTAIN, prior="u1")]


# -- rows settled with their batch (exactly-once) ---------------------------------


def test_a_deleted_keys_row_stays_gone_until_the_watermark_passes_its_delete() -> None:
    """A commit behind the bus may come while the watermark still lags an acknowledged
    delete: a watch resumed from that watermark would replay the object as new, so its
    row stays (GONE, at the delete) until a commit's watermark passes the delete."""
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    assert w.commit()[0] == "10"
    # The delete at 12 is decided and acknowledged before any mark covers it.
    w.cache.items.pop("a")
    w.outbox.decide("a", "ua", event("ua", "12", "deleted"), None)
    w.publish()
    watermark, upserts, deletes = w.commit()
    assert (watermark, deletes) == ("10", [])
    assert upserts == {"a": Digest("a", "ua", "12", "", GONE)}
    assert w.commit() == ("10", {}, [])  # held, not rewritten at every commit
    w.outbox.observe(w.queued + 1, "13")
    w.outbox.progress(w.queued + 1)
    assert w.commit() == ("13", {}, ["a"])
    assert w.commit() == ("13", {}, [])


def test_a_key_recreated_after_its_delete_is_not_held() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    w.commit()
    w.cache.items.pop("a")
    w.outbox.decide("a", "ua", event("ua", "12", "deleted"), None)
    w.publish()
    assert w.commit()[1]["a"].state == GONE
    w.change("a", "ub", 14)  # a new object of the name
    w.publish()
    watermark, upserts, deletes = w.commit()
    assert (watermark, upserts["a"].uid, upserts["a"].state, deletes) == ("14", "ub", CERTAIN, [])


def test_a_write_ahead_carries_the_rows_acknowledged_since_their_commit() -> None:
    """What a kill leaves uncertain is bounded by the window, not by the commit cadence:
    each write-ahead carries the certain rows of keys acknowledged meanwhile."""
    w = World()
    for i in range(10):
        w.change(f"k{i}", f"u{i}", 10 + i)
    w.publish(6)  # k0..k5 acknowledged; no commit yet
    rows, keys, generation = w.outbox.acknowledged_rows(100)
    assert sorted(keys) == [f"k{i}" for i in range(6)]
    assert all(d.state == CERTAIN for d in rows)
    w.outbox.settled(keys, generation)
    assert w.outbox.acknowledged_rows(100)[1] == []  # once
    commit = w.outbox.checkpoint()
    assert commit is not None and sorted(commit.keys) == []  # k6..k9 in flight; nothing left
    # A key decided again after its rows were read stays dirty for the commit.
    w.change("k0", "u0", 30)
    w.publish()
    rows, keys, generation = w.outbox.acknowledged_rows(100)
    w.change("k0", "u0", 31)
    w.outbox.settled(keys, generation)
    assert "k0" in w.outbox._dirty


def test_settled_rows_are_certain_gone_and_forget_priors() -> None:
    """A store written in one transaction with the batch holds the state after it."""
    w = World()
    w.change("a", "u1", 10)
    w.change("b", "ub", 11)
    w.publish()
    w.delete("a", "u1", 12)
    w.change("a", "u2", 13, fp="g")  # re-created in the same batch
    w.change("c", "uc", 14, fp="h")
    w.delete("b", "ub", 15)
    batch = w.outbox.take(10)
    assert batch is not None
    upserts, deletes = batch.settled_rows()
    assert upserts == [
        Digest("a", "u2", "13", "g"),
        Digest("c", "uc", "14", "h"),
        # Not a tombstone: a watch from an older watermark would bring b back.
        Digest("b", "ub", "15", "", GONE),
    ]
    assert deletes == []


def test_a_refused_last_event_leaves_its_key_out_of_the_settled_rows() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.change("b", "ub", 11)
    w.change("a", "ua", 12, fp="g")
    batch = w.outbox.take(10)
    assert batch is not None
    # b's only event refused: its row stays as it was; a's first event refused but
    # its last landed: a is settled at its last state.
    upserts, deletes = batch.settled_rows(refused={0, 1})
    assert (upserts, deletes) == ([Digest("a", "ua", "12", "g")], [])


def test_a_restarts_unresolved_state_is_settled_as_it_was_written_ahead() -> None:
    w = World(watermark="9")
    row = Digest("a", "u2", "12", "g", UNCERTAIN, prior="u1")
    w.outbox.restore_uncertain([row])
    w.outbox.decide("a", "u1", event("u1", "", "deleted"), None)
    batch = w.outbox.take(10)
    assert batch is not None
    assert batch.settled_rows() == ([row], [])


# -- commits of many keys --------------------------------------------------------


def test_a_commit_reads_its_digests_from_the_cache_a_step_at_a_time() -> None:
    """A commit names its keys; each step's digests are built when the store takes
    that step, and the watermark goes with the last step."""
    built: list[str] = []
    cache: dict[str, tuple[str, str, str]] = {}

    def digest_of(key: str) -> Digest | None:
        built.append(key)
        found = cache.get(key)
        return None if found is None else Digest(key, *found)

    outbox = Outbox(digest_of)
    for i, key in enumerate(("a", "b", "c", "d")):
        cache[key] = (f"u{key}", str(10 + i), "f")
        outbox.decide(key, f"u{key}", event(f"u{key}", str(10 + i)), Digest(key, *cache[key]))
    del cache["b"]  # gone meanwhile (a delete that published nothing of its own)
    outbox.observe(4, "13")
    outbox.progress(4)
    batch = outbox.take(10)
    assert batch is not None
    outbox.acknowledged(batch)
    commit = outbox.checkpoint()
    assert commit is not None and commit.keys == ["a", "b", "c", "d"]
    assert built == []  # nothing built for the commit yet
    steps = commit.steps(2)
    first = next(steps)
    assert built == ["a", "b"]
    assert first.watermark is None  # not before every row is stored
    assert [(d.key, d.resource_version) for d in first.upserts] == [("a", "10")]
    # b's delete waits for the watermark: a row gone before it passes the delete
    # would let a watch from the old watermark replay b as new.
    assert first.deletes == []
    last = next(steps)
    assert built == ["a", "b", "c", "d", "b"]  # b read again, with the last step
    assert last.watermark == "13"
    assert [d.key for d in last.upserts] == ["c", "d"] and last.deletes == ["b"]
    assert next(steps, None) is None


def test_a_held_delete_of_a_key_decided_since_keeps_its_write_ahead_row() -> None:
    w = World()
    for i, key in enumerate("abcd"):
        w.change(key, f"u{key}", 10 + i)
    w.publish()
    w.commit()
    w.delete("b", "ub", 20)
    w.change("c", "uc", 21, fp="g")
    w.publish()
    commit = w.outbox.checkpoint()
    assert commit is not None and commit.keys == ["b", "c"]
    steps = commit.steps(1)
    assert next(steps).deletes == []  # b held
    w.change("b", "ub2", 22)  # re-created: its event is on its way
    last = next(steps)
    assert last.deletes == [] and [d.key for d in last.upserts] == ["c"]


def test_a_key_decided_between_steps_keeps_its_write_ahead_row() -> None:
    """A commit's later step is read after earlier ones are stored; a key decided
    meanwhile has its event on the way, so the step leaves its row (the write-ahead)
    alone, and the key stays dirty for the next commit."""
    w = World()
    w.change("a", "ua", 10)
    w.change("b", "ub", 11)
    w.publish()
    commit = w.outbox.checkpoint()
    assert commit is not None
    steps = commit.steps(1)
    assert [d.key for d in next(steps).upserts] == ["a"]
    w.change("b", "ub", 12)  # decided while the first step was being stored
    ahead = w.outbox.take(10)
    assert ahead is not None and [(d.key, d.state) for d in ahead.ahead] == [("b", UNCERTAIN)]
    last = next(steps)
    assert last.upserts == [] and last.deletes == []  # b's row is the write-ahead's
    w.outbox.committed(commit)
    w.outbox.acknowledged(ahead)
    _, upserts, _ = w.commit()
    assert upserts["b"].resource_version == "12" and upserts["b"].state == CERTAIN


def test_a_commit_with_no_keys_is_one_step_with_its_watermark() -> None:
    w = World()
    w.change("a", "ua", 10)
    w.publish()
    w.commit()
    w.quiet("a", 11)  # the watermark moves; no key's row changes
    commit = w.outbox.checkpoint()
    assert commit is not None and commit.keys == []
    assert list(commit.steps(100)) == [("11", [], [])]


def test_a_commit_of_many_keys_holds_no_digests() -> None:
    """20,000 keys to commit: the commit itself holds their names, not their digests
    (~300 B each, four strings and the digest), which a store builds one at a time."""
    n = 20_000
    cache: dict[str, tuple[str, str]] = {}

    def digest_of(key: str) -> Digest | None:
        # As the pipeline's cache does: a fresh digest from a packed record.
        uid, rv = cache[key]
        return Digest(key, uid + "-0000-0000-0000-000000000000", str(int(rv)), rv * 4)

    outbox = Outbox(digest_of)
    for i in range(n):
        key = f"ns/pod-{i}"
        cache[key] = (f"{i:08d}", f"{10_000_000 + i}")
        outbox.decide(key, "u", event("u", str(i)), Digest(key, "u", str(i), "f"))
    while (batch := outbox.take(5_000)) is not None:
        outbox.acknowledged(batch)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        commit = outbox.checkpoint()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert commit is not None and len(outbox.rows(commit.keys)[0]) == n
    assert held / n < 100, f"{held / n:.0f} B per key"


def test_unacknowledged_bytes_count_the_encoded_events_until_their_ack() -> None:
    """What ``max_pending_bytes`` bounds: the encoded size of what waits for the bus."""
    w = World()
    sizes = {"a": 300, "b": 5000}
    for key, size in sizes.items():
        sealed = dataclasses.replace(event(f"u-{key}", "1"), encoded=b"x" * size)
        w.outbox.decide(f"ns/{key}", f"u-{key}", sealed, Digest(f"ns/{key}", f"u-{key}", "1", "f"))
    assert w.outbox.unacknowledged_bytes == 5300
    batch = w.outbox.take(1)
    assert batch is not None
    assert w.outbox.unacknowledged_bytes == 5300  # taken is not acknowledged
    w.outbox.acknowledged(batch)
    assert w.outbox.unacknowledged_bytes == 5000
    w.publish()
    assert w.outbox.unacknowledged_bytes == 0
