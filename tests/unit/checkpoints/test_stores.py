"""Checkpoint stores (memory, sqlite): roundtrip, atomic watermark+digests, deletes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.checkpoints import Checkpoint, CheckpointStore
from bridge.checkpoints.base import load_bulk
from bridge.checkpoints.memory import MemoryCheckpointStore
from bridge.checkpoints.sqlite import SqliteCheckpointStore
from bridge.errors import CheckpointError
from bridge.ground.digest import UNCERTAIN, Digest


def d(key: str, rv: str = "1", fp: str = "f") -> Digest:
    return Digest(key, f"uid-{key}", rv, fp)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    s: CheckpointStore = (
        MemoryCheckpointStore()
        if request.param == "memory"
        else SqliteCheckpointStore(tmp_path / "cp.db")
    )
    await s.open()
    yield s
    await s.close()


async def test_unknown_resource_loads_none(store: CheckpointStore) -> None:
    assert await store.load("v1/pods") is None


async def test_commit_load_roundtrip(store: CheckpointStore) -> None:
    await store.commit("v1/pods", "100", [d("ns/a"), d("ns/b")], [])
    cp = await store.load("v1/pods")
    assert cp == Checkpoint("100", {"ns/a": d("ns/a"), "ns/b": d("ns/b")})


async def test_later_commits_upsert_and_delete(store: CheckpointStore) -> None:
    await store.commit("v1/pods", "100", [d("ns/a"), d("ns/b"), d("ns/c")], [])
    await store.commit("v1/pods", "120", [d("ns/a", "110", "g")], ["ns/b", "ns/missing"])
    cp = await store.load("v1/pods")
    assert cp is not None
    assert cp.resource_version == "120"
    assert cp.digests == {"ns/a": d("ns/a", "110", "g"), "ns/c": d("ns/c")}


async def test_delete_and_recreate_in_one_flush_keeps_the_new_digest(
    store: CheckpointStore,
) -> None:
    await store.commit("r", "1", [d("k", "1")], [])
    await store.commit("r", "2", [d("k", "2")], ["k"])
    cp = await store.load("r")
    assert cp is not None and cp.digests["k"].resource_version == "2"


async def test_resources_are_kept_apart(store: CheckpointStore) -> None:
    await store.commit("v1/pods", "5", [d("ns/a")], [])
    await store.commit("apps/v1/deployments", "9", [d("ns/a", "9")], [])
    await store.commit("v1/pods", "6", [], ["ns/a"])
    pods, deps = await store.load("v1/pods"), await store.load("apps/v1/deployments")
    assert pods == Checkpoint("6", {})
    assert deps == Checkpoint("9", {"ns/a": d("ns/a", "9")})


async def test_loaded_checkpoint_is_a_copy(store: CheckpointStore) -> None:
    await store.commit("r", "1", [d("a")], [])
    cp = await store.load("r")
    assert cp is not None
    cp.digests.clear()
    again = await store.load("r")
    assert again is not None and "a" in again.digests


async def test_sqlite_survives_reopen_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cp.db"
    s = SqliteCheckpointStore(path)
    await s.open()
    await s.commit("r", "7", [d(f"ns/o{i}") for i in range(1000)], [])
    await s.close()
    s = SqliteCheckpointStore(path)
    await s.open()
    cp = await s.load("r")
    await s.close()
    assert cp is not None and cp.resource_version == "7" and len(cp.digests) == 1000
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_sqlite_commit_is_atomic_a_failed_flush_leaves_watermark_and_digests(
    tmp_path: Path,
) -> None:
    s = SqliteCheckpointStore(tmp_path / "cp.db")
    await s.open()
    await s.commit("r", "1", [d("a")], [])
    # Drop the digests table behind the store's back: the next commit fails in SQL,
    # after its deletes ran, and must leave the watermark where it was.
    raw = sqlite3.connect(tmp_path / "cp.db")
    raw.execute("ALTER TABLE digests RENAME COLUMN fingerprint TO fp_gone")
    raw.commit()
    raw.close()
    with pytest.raises(CheckpointError, match=r"cp\.db"):
        await s.commit("r", "2", [d("b", "2")], ["a"])
    raw = sqlite3.connect(tmp_path / "cp.db")
    assert raw.execute("SELECT resource_version FROM watermarks").fetchall() == [("1",)]
    assert raw.execute("SELECT key FROM digests").fetchall() == [("a",)]
    raw.close()
    await s.close()


async def test_sqlite_errors_are_checkpoint_errors(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(CheckpointError, match=r"dir\.db"):
        await SqliteCheckpointStore(tmp_path / "dir.db").open()
    with pytest.raises(CheckpointError, match="not open"):
        await SqliteCheckpointStore(tmp_path / "x.db").load("r")


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "checkpoint-reader"]


async def test_a_sqlite_bulk_load_that_fails_raises_and_leaves_no_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error, in the reader thread or while packing what it read, reaches the caller
    as a ``CheckpointError``; the thread is gone when ``load_bulk`` returns."""
    from bridge.checkpoints import sqlite

    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    await store.commit("pods", "42", [d(f"ns/p{i:04d}") for i in range(5_000)], ())
    monkeypatch.setattr(sqlite, "_CHUNK", 500)  # ten chunks: the reader is ahead
    real_pack = sqlite._pack_plain
    for fail_at in (0, 3):
        calls = iter(range(100))

        def pack(bulk: Any, cols: Any, _n: Any = calls, _at: int = fail_at) -> bool:
            if next(_n) == _at:
                raise sqlite3.OperationalError("disk I/O error")
            return real_pack(bulk, cols)

        monkeypatch.setattr(sqlite, "_pack_plain", pack)
        with pytest.raises(CheckpointError, match="disk I/O error"):
            await load_bulk(store, "pods")
        assert not _readers()
    monkeypatch.setattr(sqlite, "_pack_plain", real_pack)
    monkeypatch.setattr(sqlite, "_OTHER_ROWS", "SELECT * FROM no_such_table WHERE ?1")
    with pytest.raises(CheckpointError, match="no_such_table"):
        await load_bulk(store, "pods")
    assert not _readers()
    monkeypatch.undo()
    bulk = await load_bulk(store, "pods")  # the store still reads
    assert bulk is not None and len(bulk) == 5_000 and not bulk.packed  # uids "uid-…": loose
    await store.close()


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each call in the submitting thread, before ``submit`` returns."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


async def test_sqlite_close_waits_for_a_cancelled_call_still_running_in_its_thread(
    tmp_path: Path,
) -> None:
    """A call cancelled at shutdown goes on in its worker thread (a thread cannot be
    stopped): closing the connection under it crashed the process (SIGSEGV in a
    checkpoint load while the app exited). ``close`` waits for it."""
    store = SqliteCheckpointStore(tmp_path / "cp.db")
    await store.open()
    started, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def slow(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(5)
        try:
            seen.append(conn.execute("SELECT 1").fetchone()[0])
        except sqlite3.Error as exc:
            seen.append(exc)

    call = asyncio.create_task(store._run(slow))
    await asyncio.to_thread(started.wait, 5)
    # From now on a thread call runs at once, inside the step that makes it: a close
    # that did not wait would have closed the connection by its first suspension.
    asyncio.get_running_loop().set_default_executor(InlineExecutor())
    call.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the call
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0)  # a turn of the loop: the close takes its first step
    assert not closing.done(), "the connection was closed while a call was still using it"
    release.set()
    await closing
    assert seen == [1]
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_sqlite_read_only_reads_beside_the_writer_that_holds_the_lock(
    tmp_path: Path,
) -> None:
    """Replay beside a running bridge: it announced its fallback, then exited 1 with
    "checkpoint store … is in use by another k8s-bridge process". A reader takes no
    lock (WAL serves readers beside the writer) and sees each commit once made."""
    path = tmp_path / "cp.db"
    writer = SqliteCheckpointStore(path)
    await writer.open()
    try:
        await writer.commit("r", "5", [d("ns/a"), d("ns/b")], [])
        with pytest.raises(CheckpointError, match="in use by another k8s-bridge process"):
            await SqliteCheckpointStore(path).open()
        reader = SqliteCheckpointStore(path, read_only=True)
        await reader.open()
        try:
            assert await reader.load("r") == Checkpoint("5", {"ns/a": d("ns/a"), "ns/b": d("ns/b")})
            # The writer goes on while the reader is open, and the reader sees it.
            await writer.commit("r", "6", [d("ns/c", "6")], ["ns/a"])
            cp = await reader.load("r")
            assert cp is not None and cp.resource_version == "6"
            assert sorted(cp.digests) == ["ns/b", "ns/c"]
            with pytest.raises(CheckpointError, match="read-only"):
                await reader.commit("r", "7", [], ["ns/b"])
        finally:
            await reader.close()
        # The writer's lock was never taken from it: a second writer is still refused.
        with pytest.raises(CheckpointError, match="in use by another k8s-bridge process"):
            await SqliteCheckpointStore(path).open()
        await writer.commit("r", "8", [], [])
    finally:
        await writer.close()
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT resource_version FROM watermarks").fetchall() == [("8",)]
    raw.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


async def test_sqlite_read_only_creates_and_changes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "cp.db"
    with pytest.raises(CheckpointError, match=r"cp\.db: cannot open for reading"):
        await SqliteCheckpointStore(missing, read_only=True).open()
    assert not missing.parent.exists()

    path = tmp_path / "cp.db"
    writer = SqliteCheckpointStore(path)
    await writer.open()
    await writer.commit("r", "3", [d("ns/a")], [])
    await writer.close()
    before = _files(tmp_path)
    reader = SqliteCheckpointStore(path, read_only=True)
    await reader.open()
    try:
        assert await reader.load("r") == Checkpoint("3", {"ns/a": d("ns/a")})
        assert await reader.load("other") is None
    finally:
        await reader.close()
    # The database and the writer's lock file are as they were (SQLite may leave an
    # empty -wal and its -shm index beside them: no data, the next writer takes them).
    after = {name: data for name, data in _files(tmp_path).items() if name in before}
    assert after == before
    writer = SqliteCheckpointStore(path)
    await writer.open()
    try:
        assert await writer.load("r") == Checkpoint("3", {"ns/a": d("ns/a")})
    finally:
        await writer.close()


@pytest.mark.parametrize("sync_write_ahead", [True, False])
async def test_sqlite_syncs_write_ahead_rows_and_leaves_watermark_commits_to_the_wal(
    tmp_path: Path, sync_write_ahead: bool
) -> None:
    """A write-ahead row lost to a power loss is a delete never published, so each
    write-ahead commit runs at synchronous=FULL (its WAL frames fsynced before it
    returns; strace shows one fdatasync per write-ahead batch, none per watermark
    commit); a watermark commit stays NORMAL (lost, it only replays redeliveries)."""
    store = SqliteCheckpointStore(tmp_path / "cp.db", sync_write_ahead=sync_write_ahead)
    await store.open()
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)
    try:

        async def level_of(*commit: Any) -> list[str]:
            """The synchronous level each statement of one commit ran at."""
            statements.clear()
            await store.commit("v1/pods", *commit)
            level, levels = "NORMAL", []
            for sql in statements:
                if sql.startswith("PRAGMA synchronous="):
                    level = sql.split("=", 1)[1]
                else:
                    levels.append(level)
            assert level == "NORMAL", statements  # the connection is left as it was
            return levels

        ahead = await level_of(None, [d(f"ns/{i}") for i in range(3)], [])
        # A write-ahead of more rows than one statement holds: one transaction, synced.
        many = await level_of(None, [d(f"ns/{i}") for i in range(2_500)], [])
        step = await level_of("100", [d("ns/0", "2")], ["ns/1"])
    finally:
        await store.close()
    want = "FULL" if sync_write_ahead else "NORMAL"
    assert ahead == [want], statements
    assert set(many) == {want} and len(many) >= 4, many
    assert set(step) == {"NORMAL"}, step


async def test_sqlite_lists_resources_with_only_rows_written_ahead(tmp_path: Path) -> None:
    """A resource whose first list never completed has digests and no watermark:
    re-sharding must still find it among the ids."""
    store = SqliteCheckpointStore(tmp_path / "ids.db")
    await store.open()
    try:
        for rid in ("core/v1/pods~uid-2of3", "a/v1/x", "core/v1/pods~uid-0of3"):
            await store.commit(rid, None, [Digest("ns/a", "u", "1", "f", UNCERTAIN)], [])
        await store.commit("b/v1/y", "5", [], [])
        assert await store.resource_ids() == [
            "a/v1/x",
            "b/v1/y",
            "core/v1/pods~uid-0of3",
            "core/v1/pods~uid-2of3",
        ]
    finally:
        await store.close()


async def test_sqlite_runs_small_commits_on_the_loop_and_moves_them_off_it_when_slow(
    tmp_path: Path,
) -> None:
    """A steady rate's write-ahead commits run on the loop's thread (no hop to a worker
    and back); a burst's large ones, and every commit for a minute once they take over
    2 ms on average (a slow disk's fsync), run in the worker thread, so the loop is
    never held long; one slow commit alone (SQLite folding its WAL into the file, a
    core busy elsewhere) changes nothing. Where each ran is told by the thread its
    statements ran on; how long each took, by the store's timer, set here."""
    now, took = [0.0], [0.0001]

    class Timer:
        """Each commit on the loop reads it twice (start, end): ``took`` apart."""

        def __init__(self) -> None:
            self.t, self.started = 0.0, False

        def __call__(self) -> float:
            if self.started:
                self.t += took[0]
            self.started = not self.started
            return self.t

    store = SqliteCheckpointStore(tmp_path / "cp.db", clock=lambda: now[0], timer=Timer())
    await store.open()
    threads: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(
        lambda sql: (
            threads.append(threading.current_thread().name) if sql.startswith("INSERT") else None
        )
    )
    loop_thread = threading.current_thread().name

    async def ran_on(*commit: Any) -> str:
        threads.clear()
        await store.commit("v1/pods", *commit)
        assert len(set(threads)) == 1, threads
        return "loop" if threads[0] == loop_thread else "worker"

    try:
        assert await ran_on(None, [d("ns/a")], []) == "loop"
        assert await ran_on("5", [d("ns/a", "5")], []) == "loop"
        # A burst's batch: hundreds of rows, beside the loop.
        assert await ran_on(None, [d(f"ns/{i:04d}") for i in range(1_000)], []) == "worker"
        # One slow commit (20 ms), then fast ones: the loop still.
        took[0] = 0.020
        assert await ran_on(None, [d("ns/b")], []) == "loop"
        took[0] = 0.0001
        for i in range(20):
            assert await ran_on(None, [d(f"ns/b{i}")], []) == "loop"
        # Slow on average: the first few still on the loop, then the worker…
        took[0] = 0.005
        places = [await ran_on(None, [d(f"ns/c{i}")], []) for i in range(8)]
        assert places[:2] == ["loop", "loop"] and places[-1] == "worker", places
        now[0] += 59
        assert await ran_on(None, [d("ns/d")], []) == "worker"
        # …for a minute; then the loop again.
        now[0] += 2
        assert await ran_on(None, [d("ns/e")], []) == "loop"
        assert store.inline_commits + store.threaded_commits == 34
        cp = await store.load("v1/pods")
        assert cp is not None and {"ns/a", "ns/b", "ns/c7", "ns/e"} <= set(cp.digests)
    finally:
        await store.close()
