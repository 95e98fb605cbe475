"""Running ``k8s-bridge mirror`` as a real process, and reading what it wrote."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
import yaml


def write_mirror_config(path: Path, *, source: dict[str, Any], dsn: str, **extra: Any) -> Path:
    config: dict[str, Any] = {
        "source": source,
        "postgres": {"dsn": dsn, "schema": "k8s"},
        "logging": {"format": "json", "level": "info"},
    }
    config.update(extra)
    path.write_text(yaml.safe_dump(config))
    return path


class MirrorProcess:
    """``k8s-bridge mirror --config`` in a subprocess; its stderr in ``mirror.log``."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.log = config.parent / "mirror.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bridge.cli", "mirror", "--config", str(self.config),
                stdout=asyncio.subprocess.DEVNULL, stderr=err, env=env,
            )  # fmt: skip

    async def kill9(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"mirror did not stop on SIGTERM:\n{self.tail_log()}") from None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def tail_log(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


async def query(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql``; [] while the database or the mirror's tables are not there yet."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError):
        return []
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await conn.close()
