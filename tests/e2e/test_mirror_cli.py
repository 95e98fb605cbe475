"""``k8s-bridge mirror`` as a process: a bad key or a schema it did not create is one line
and exit 2; from JetStream (ordered consumer from the stored stream sequence) it writes
PostgreSQL, skips what is not ours with one line each, and resumes where it stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import asyncpg
import nats
import pytest

from tests.doubles.memory_source import event
from tests.e2e.bridge_process import cli, free_port
from tests.e2e.mirror_process import MirrorProcess, query, write_mirror_config
from tests.fixtures.nats import NatsServer
from tests.fixtures.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def kafka_source() -> dict[str, object]:
    return {"kind": "kafka", "kafka": {"bootstrapServers": ["127.0.0.1:1"], "topic": "t"}}


async def test_a_bad_key_is_one_line_naming_it(tmp_path: Path) -> None:
    config = write_mirror_config(
        tmp_path / "mirror.yaml", source=kafka_source(), dsn="postgresql://x@127.0.0.1:1/x"
    )
    config.write_text(config.read_text().replace("dsn:", "dsnn:"))
    code, _, err = await cli("mirror", "--config", str(config))
    assert code == 2
    assert one_line(err) == ("config error: postgres.dsnn: unknown key (did you mean dsn?)")
    config.write_text("source: {kind: rabbit}\n")
    code, _, err = await cli("mirror", "--config", str(config))
    assert code == 2
    assert one_line(err).startswith("config error: source.kind: 'rabbit' is not one of")


async def test_a_schema_it_did_not_create_is_refused_in_one_line(
    tmp_path: Path, postgres_dsn: str
) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("CREATE SCHEMA k8s; CREATE TABLE k8s.objects (id int, name text)")
    finally:
        await conn.close()
    config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source=kafka_source(),
        dsn=postgres_dsn,
        logging={"format": "json", "level": "error"},
    )
    code, _, err = await cli("mirror", "--config", str(config))
    assert code == 2
    assert one_line(err) == (
        "config error: postgres.schema 'k8s': holds tables k8s-bridge mirror did not create"
        " (objects) and no k8s.mirror_meta; name a new or empty schema"
    )


async def test_from_jetstream_skipping_what_is_not_ours_and_resuming(
    tmp_path: Path, nats_server: str, postgres_dsn: str
) -> None:
    stream = "MIRROR" + tmp_path.name[-6:].upper().replace("-", "_")
    port = free_port()
    nc = await nats.connect(nats_server)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])

    async def publish(value: bytes) -> None:
        await js.publish(f"{stream}.pods", value)

    config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source={"kind": "nats", "nats": {"servers": [nats_server], "stream": stream,
                                          "subjects": [f"{stream}.>"]}},
        dsn=postgres_dsn,
        history=True,
        server={"host": "127.0.0.1", "port": port},
    )  # fmt: skip
    mirror = MirrorProcess(config)
    try:
        await publish(event("a", "u1", 1))
        await publish(b"a message of another producer")
        await publish(event("b", "u2", 2))
        await mirror.start()

        async def changes(n: int) -> bool:
            return await query(postgres_dsn, "SELECT count(*) FROM k8s.changes") == [(n,)]

        await until(lambda: changes(2), 30, mirror.tail_log)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 200, await r.text()
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                metrics = await r.text()
        assert "k8s_bridge_mirror_changes_total 2.0" in metrics, metrics
        assert "k8s_bridge_mirror_skipped_total 1.0" in metrics, metrics
        assert 'k8s_bridge_mirror_outages_total{dependency="database"} 0.0' in metrics
        assert "k8s_bridge_mirror_paused 0.0" in metrics
        assert await mirror.stop() == 0
        assert "0 database outages" in mirror.tail_log()
        assert "1 messages skipped (not ours)" in mirror.tail_log()
        skipped = [line for line in mirror.tail_log().splitlines() if "skipping message" in line]
        assert len(skipped) == 1 and f"nats:{stream}[0]@2" in skipped[0], skipped
        # While it is down: a newer state, a delete, and a stale copy of an older state.
        await publish(event("a", "u1", 3))
        await publish(event("b", "u2", 4, "deleted"))
        await publish(event("a", "u1", 1))
        mirror = MirrorProcess(config)
        await mirror.start()
        await until(lambda: changes(4), 30, mirror.tail_log)  # u1:1 again is no new change
        assert await mirror.stop() == 0
    finally:
        if mirror.running:
            await mirror.kill9()
        await nc.close()
    assert await query(postgres_dsn, "SELECT name, resource_version FROM k8s.objects") == [("a", 3)]
    assert await query(postgres_dsn, "SELECT source, part, next_position FROM k8s.positions") == [
        (f"nats:{stream}", 0, 7)
    ]


async def test_a_nats_server_that_goes_away_and_comes_back_costs_no_change(
    tmp_path: Path, nats_control: NatsServer, postgres_dsn: str
) -> None:
    async def publish(first: int, n: int) -> None:
        nc = await nats.connect(nats_control.url)
        try:
            js = nc.jetstream()
            for i in range(first, first + n):
                await js.publish(f"k8s.c1.core.v1.pods.ns.p{i}", event(f"p{i}", f"u{i}", 10 + i))
        finally:
            await nc.close()

    async def written(n: int) -> bool:
        return await query(postgres_dsn, "SELECT count(*) FROM k8s.objects") == [(n,)]

    nc = await nats.connect(nats_control.url)
    await nc.jetstream().add_stream(name="K8S", subjects=["k8s.>"])
    await nc.close()
    config = write_mirror_config(
        tmp_path / "mirror.yaml",
        source={"kind": "nats", "nats": {"servers": [nats_control.url]}},
        dsn=postgres_dsn,
    )
    mirror = MirrorProcess(config)
    await publish(0, 50)
    await mirror.start()
    try:
        await until(lambda: written(50), 30, mirror.tail_log)
        nats_control.stop()
        await asyncio.sleep(2)
        assert mirror.running, mirror.tail_log()
        nats_control.start()
        await publish(50, 50)
        await until(lambda: written(100), 60, mirror.tail_log)
        assert await mirror.stop() == 0, mirror.tail_log()
    finally:
        if mirror.running:
            await mirror.kill9()
    assert await query(postgres_dsn, "SELECT next_position FROM k8s.positions") == [(101,)]
