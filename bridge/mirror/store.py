"""The PostgreSQL side of the mirror: schema ownership, positions, one transaction per batch.

asyncpg: asyncio-native like the rest of the service (aiokafka, nats-py), the
binary protocol, and ``copy_records_to_table`` (binary COPY) for the batch,
with no libpq on the machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from bridge.errors import BridgeError, ConfigError
from bridge.logging import get_logger
from bridge.mirror import schema
from bridge.mirror.rows import Change

log = get_logger(__name__)


class DatabaseUnavailable(BridgeError):
    """The database cannot be reached or dropped the connection: retry, nothing moved."""


class PositionMoved(BridgeError):
    """A position is not where this batch started: read again from the stored positions."""


class ForeignSchemaError(ConfigError):
    """The configured schema holds tables the mirror did not create (or another layout)."""


# What "the database went away" looks like through asyncpg: connection errors,
# a server shutting down or terminating us (class 57), a closed connection, a
# protocol state left broken by a connection cut in the middle of a COPY.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
)


@dataclass(frozen=True, slots=True)
class Batch:
    """What one transaction writes: the decoded changes and where each partition ends."""

    source: str
    changes: Sequence[Change]
    # partition → (position the batch started from as stored, next position after it)
    positions: Mapping[int, tuple[int | None, int]]


class MirrorStore(Protocol):
    async def open(self) -> None: ...

    async def positions(self, source: str) -> dict[int, int]: ...

    async def apply(self, batch: Batch) -> None: ...

    async def prune(self) -> int: ...

    async def close(self) -> None: ...


class PostgresStore:
    """One connection; ``apply`` writes a batch and its positions in one transaction."""

    def __init__(
        self,
        dsn: str | None,
        db_schema: str,
        *,
        history: bool,
        keep_deleted: bool,
        tombstone_retention: float,
        connect_timeout: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self.schema = db_schema
        self.history = history
        self.keep_deleted = keep_deleted
        self.tombstone_retention = tombstone_retention
        self.connect_timeout = connect_timeout
        self._conn: Any = None
        self._apply = schema.apply_statements(db_schema, history)
        self._position = schema.position_statement(db_schema)

    async def open(self) -> None:
        """Connect, create the schema when it is new, refuse one that is not the mirror's."""
        await self.close()
        try:
            conn = await asyncpg.connect(
                self.dsn, timeout=self.connect_timeout, server_settings={"jit": "off"}
            )
        except UNAVAILABLE as e:
            raise DatabaseUnavailable(f"PostgreSQL: cannot connect: {_short(e)}") from e
        except asyncpg.InvalidAuthorizationSpecificationError as e:
            raise ConfigError(f"config error: postgres.dsn: {_short(e)}") from e
        try:
            await self._own_schema(conn)
            await conn.execute(schema.CREATE_STAGED)
        except UNAVAILABLE as e:
            conn.terminate()
            raise DatabaseUnavailable(f"PostgreSQL: {_short(e)}") from e
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn

    async def _own_schema(self, conn: Any) -> None:
        s = self.schema
        async with conn.transaction():
            # Two mirrors starting on one new database: one creates, the other checks.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"{s} mirror")
            tables = {
                r["table_name"]
                for r in await conn.fetch(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                    s,
                )
            }
            if not tables:
                for statement in schema.create_statements(s):
                    await conn.execute(statement)
                tables = set(schema.COLUMNS) - {schema.HISTORY_TABLE}
                log.info("created the mirror's tables", schema=s)
            if "mirror_meta" not in tables:
                raise ForeignSchemaError(
                    f"config error: postgres.schema {s!r}: holds tables k8s-bridge mirror did"
                    f" not create ({', '.join(sorted(tables))}) and no {s}.mirror_meta; name a"
                    " new or empty schema"
                )
            meta = await conn.fetchrow(f'SELECT schema_version, created_by FROM "{s}".mirror_meta')
            if meta is None or meta["created_by"] != schema.CREATED_BY:
                raise ForeignSchemaError(
                    f"config error: postgres.schema {s!r}: {s}.mirror_meta was not written by"
                    " k8s-bridge mirror"
                )
            if meta["schema_version"] != schema.SCHEMA_VERSION:
                raise ForeignSchemaError(
                    f"config error: postgres.schema {s!r}: layout version"
                    f" {meta['schema_version']}, this mirror writes version"
                    f" {schema.SCHEMA_VERSION}"
                )
            if self.history and schema.HISTORY_TABLE not in tables:
                for statement in schema.history_statements(s):
                    await conn.execute(statement)
                tables.add(schema.HISTORY_TABLE)
            for table, expected in schema.COLUMNS.items():
                if table not in tables:
                    if table == schema.HISTORY_TABLE:
                        continue
                    raise ForeignSchemaError(
                        f"config error: postgres.schema {s!r}: table {s}.{table} is missing"
                    )
                rows = await conn.fetch(
                    "SELECT column_name, data_type FROM information_schema.columns"
                    " WHERE table_schema = $1 AND table_name = $2",
                    s,
                    table,
                )
                found = {r["column_name"]: r["data_type"] for r in rows}
                if found != expected:
                    diff = sorted(set(found.items()) ^ set(expected.items()))
                    raise ForeignSchemaError(
                        f"config error: postgres.schema {s!r}: table {s}.{table} does not have"
                        f" the mirror's columns (differs in {', '.join(f'{c} {t}' for c, t in diff)})"
                    )

    async def positions(self, source: str) -> dict[int, int]:
        conn = self._connected()
        try:
            rows = await conn.fetch(
                f'SELECT part, next_position FROM "{self.schema}".positions WHERE source = $1',
                source,
            )
        except UNAVAILABLE as e:
            raise DatabaseUnavailable(f"PostgreSQL: {_short(e)}") from e
        return {int(r["part"]): int(r["next_position"]) for r in rows}

    async def apply(self, batch: Batch) -> None:
        """The batch's rows and its positions, in one transaction, or nothing."""
        conn = self._connected()
        try:
            async with conn.transaction():
                # The positions first: their row locks keep a second mirror of the
                # same source waiting, and then its check fails.
                for part, (expected, after) in batch.positions.items():
                    moved = await conn.fetchval(self._position, batch.source, part, after, expected)
                    if moved is None:
                        raise PositionMoved(
                            f"{batch.source}[{part}] is no longer at {expected}: read again"
                        )
                if batch.changes:
                    await conn.copy_records_to_table(
                        schema.STAGED,
                        records=[c.record(batch.source) for c in batch.changes],
                        columns=schema.STAGED_COLUMNS,
                    )
                    for statement in self._apply:
                        await conn.execute(statement)
        except UNAVAILABLE as e:
            await self._drop()
            raise DatabaseUnavailable(f"PostgreSQL: {_short(e)}") from e
        except asyncpg.PostgresError as e:
            # Rolled back, so nothing moved: the batch is read again after a backoff
            # (a lock timeout, a full disk). Stuck on the same error, the mirror says
            # so at every attempt instead of skipping rows it cannot write.
            await self._drop()
            raise DatabaseUnavailable(f"PostgreSQL refused the batch: {_short(e)}") from e

    async def prune(self) -> int:
        """Forget tombstones older than the retention (never with ``keepDeleted``)."""
        if self.keep_deleted:
            return 0
        conn = self._connected()
        try:
            status = await conn.execute(
                schema.prune_statement(self.schema), self.tombstone_retention
            )
        except UNAVAILABLE as e:
            await self._drop()
            raise DatabaseUnavailable(f"PostgreSQL: {_short(e)}") from e
        return int(str(status).rsplit(" ", 1)[-1] or 0)

    def _connected(self) -> Any:
        if self._conn is None or self._conn.is_closed():
            raise DatabaseUnavailable("PostgreSQL: not connected")
        return self._conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            async with asyncio.timeout(5):
                await conn.close()
        except (*UNAVAILABLE, asyncpg.PostgresError):
            conn.terminate()


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
