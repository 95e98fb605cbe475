"""Fault injection (checklist 35): what real API servers and networks do to clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from bridge.emulator.server import Emulator

ExpiredMode = Literal["event", "http"]
HUGE_OBJECT_BYTES = 2 * 1024 * 1024


@dataclass(slots=True)
class _Failure:
    remaining: int
    status: int
    retry_after: float


class Chaos:
    """Knobs a test turns to make the emulator misbehave the way real clusters do."""

    def __init__(self, emulator: Emulator, expired_mode: ExpiredMode = "event") -> None:
        self._emu = emulator
        self.expired_mode: ExpiredMode = expired_mode
        self.stalled = False
        self._failure: _Failure | None = None

    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream (no clean chunked end). Returns how many."""
        watchers = self._emu.store.all_watchers()
        for w in watchers:
            w.stop("drop")
        return len(watchers)

    def truncate_watches(self) -> int:
        """Write half of the next line on every open watch, then cut the connection."""
        watchers = self._emu.store.all_watchers()
        for w in watchers:
            w.stop("truncate")
        return len(watchers)

    def stall_watches(self) -> None:
        """Watches (open and new) keep their connections but send no bytes at all."""
        self.stalled = True

    def resume_watches(self) -> None:
        self.stalled = False
        for w in self._emu.store.all_watchers():
            w.wake.set()

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float = 1.0) -> None:
        """The next ``n`` API requests (not ``/_emulator/``) fail with 429 or 500."""
        if status not in (429, 500, 503):
            raise ValueError(f"fail_next supports 429, 500 and 503, not {status}")
        self._failure = _Failure(n, status, retry_after) if n > 0 else None

    def take_failure(self) -> tuple[int, float] | None:
        failure = self._failure
        if failure is None:
            return None
        failure.remaining -= 1
        if failure.remaining <= 0:
            self._failure = None
        return failure.status, failure.retry_after

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: now); older RVs then get 410. Returns the compacted RV."""
        return self._emu.store.compact(rv)

    def set_expired_mode(self, mode: ExpiredMode) -> None:
        if mode not in ("event", "http"):
            raise ValueError(f"expired mode must be 'event' or 'http', not {mode!r}")
        self.expired_mode = mode

    def huge_object(
        self,
        name: str = "huge",
        namespace: str = "default",
        size: int = HUGE_OBJECT_BYTES,
    ) -> dict[str, Any]:
        """Create a ConfigMap whose JSON is about ``size`` bytes (2 MiB by default)."""
        blob = "x" * max(0, size - 512)
        return self._emu.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace},
                "data": {"blob": blob},
            }
        )
