"""``k8s-bridge mirror``: materialises the bus into PostgreSQL until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys

from bridge.logging import get_logger
from bridge.mirror.metrics import mirror_registry, readiness
from bridge.mirror.runner import DatabaseMirror
from bridge.mirror.settings import MirrorSettings
from bridge.mirror.sources import make_source
from bridge.mirror.store import PostgresStore
from bridge.service.health import HealthServer

log = get_logger(__name__)


def build_mirror(settings: MirrorSettings) -> DatabaseMirror:
    pg = settings.postgres
    store = PostgresStore(
        pg.dsn.get_secret_value() if pg.dsn else None,
        pg.db_schema,
        history=settings.history,
        keep_deleted=settings.keep_deleted,
        tombstone_retention=settings.tombstone_retention,
        connect_timeout=pg.connect_timeout,
    )
    return DatabaseMirror(
        make_source(settings.source),
        store,
        max_events=settings.batch.max_events,
        max_wait=settings.batch.max_wait,
    )


async def run_mirror(settings: MirrorSettings, stop: asyncio.Event) -> int:
    mirror = build_mirror(settings)
    server = None
    if settings.server.port is not None:
        server = HealthServer(
            settings.server.host,
            settings.server.port,
            mirror_registry(mirror),
            lambda: readiness(mirror),
        )
        await server.start()
    log.info(
        "mirror starting",
        source=settings.source.identity,
        schema=settings.postgres.db_schema,
        history=settings.history,
        keep_deleted=settings.keep_deleted,
    )
    try:
        await mirror.run(stop)
    finally:
        if server is not None:
            await server.stop()
    print(f"k8s-bridge mirror: {mirror.stats.line()}", file=sys.stderr)
    return 0
