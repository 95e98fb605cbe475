"""One structured CloudEvent per line on a stream: the demo and debugging sink."""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from bridge.errors import SinkUnavailableError
from bridge.ground.envelope import Event


class StdoutSink:
    """Writes JSON lines to ``stream`` (stdout by default, text or binary)."""

    def __init__(self, stream: IO[str] | IO[bytes] | None = None) -> None:
        self._stream: IO[str] | IO[bytes] = stream if stream is not None else sys.stdout

    async def start(self) -> None:
        return None

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        if not events:
            return {}
        payload = b"".join(e.to_json() + b"\n" for e in events)
        try:
            if isinstance(self._stream, io.TextIOBase):
                buffer = getattr(self._stream, "buffer", None)
                if buffer is not None:
                    self._stream.flush()
                    buffer.write(payload)
                    buffer.flush()
                else:
                    self._stream.write(payload.decode())
                    self._stream.flush()
            else:
                self._stream.write(payload)  # type: ignore[arg-type]
                self._stream.flush()
        except (OSError, ValueError) as exc:  # ValueError: write to a closed file
            raise SinkUnavailableError(f"stdout sink: cannot write: {exc}") from exc
        return {}

    async def ping(self) -> bool:
        return not self._stream.closed

    async def close(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass
