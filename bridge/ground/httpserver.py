"""A small HTTP/1.1 server on ``asyncio.start_server``, for the health, metrics and
control endpoints (bridge/service/health.py).

Why not aiohttp's server: the bridge answers four fixed paths, and aiohttp.web
cost an idle process 18 modules and about 2 MiB (docs/sizing.md). What this
keeps of HTTP: persistent connections (Prometheus reuses its connection from
scrape to scrape) closed after ``keepalive_timeout`` idle or on
``Connection: close`` (a new connection that asks nothing within
``request_timeout`` is closed), request bodies framed by ``Content-Length`` only (no
chunked uploads: 411), and limits on what a caller may send, each refused with
its status and the connection closed: a request line over 8 KiB (414), a header
line over 8 KiB or more than 64 header lines (431), a body over 64 KiB (413), a
request that takes longer than ``request_timeout`` to arrive (a slow client
holding a connection open: closed without an answer). A path answers only its
methods (405 with ``Allow``, HEAD included), an unknown path 404.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

from bridge.logging import get_logger

log = get_logger(__name__)

MAX_LINE = 8 * 1024
MAX_HEADERS = 64
MAX_BODY = 64 * 1024

_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]  # the first value of each name
    headers: dict[str, str]  # names lowercased; repeated ones joined with ", "
    body: bytes
    remote: str | None


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status, text.encode())

    @classmethod
    def json(
        cls, data: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Response:
        return cls(
            status, json.dumps(data).encode(), "application/json; charset=utf-8", headers or {}
        )


Handler = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    """A request answered with ``status`` before any handler sees it; the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _http_date(now: float) -> str:
    t = time.gmtime(now)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year}"
        f" {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


class HttpServer:
    """Serves ``routes`` ((method, path) → handler) on ``host``:``port`` (0: a free one)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[tuple[str, str], Handler],
        *,
        keepalive_timeout: float = 75.0,
        request_timeout: float = 10.0,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._routes = dict(routes)
        self._allowed: dict[str, list[str]] = {}
        for method, path in self._routes:
            self._allowed.setdefault(path, []).append(method)
        self.keepalive_timeout = keepalive_timeout
        self.request_timeout = request_timeout
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        # Each open connection's task, and whether it is between requests (closable now).
        self._connections: dict[asyncio.Task[None], bool] = {}
        self._stopping = False

    @property
    def listening(self) -> bool:
        """Between start() and stop()."""
        return self._server is not None

    @property
    def port(self) -> int:
        """The bound port (the one the OS picked when 0 was asked); valid after start()."""
        if self._port is None:
            raise RuntimeError("the server is not started")
        return self._port

    async def start(self) -> None:
        """Listen; an OSError (port taken, address not local) is the caller's to name."""
        if self._server is not None:
            return
        self._stopping = False
        # The stream limit bounds one line held while its end is awaited.
        server = await asyncio.start_server(
            self._serve, self._host or None, self._requested_port, limit=MAX_LINE + 2
        )
        self._server = server
        self._port = server.sockets[0].getsockname()[1] if server.sockets else self._requested_port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop listening, close idle connections, let answers under way finish
        (for ``grace`` seconds at most)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping = True
        server.close()
        for task, idle in list(self._connections.items()):
            if idle:
                task.cancel()
        busy = list(self._connections)
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = True
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        # A new connection is opened to ask at once; only one that has been
        # answered may wait for its next request as long as keep-alive allows.
        idle_for = self.request_timeout
        try:
            while not self._stopping:
                self._connections[task] = True
                try:
                    # Idle until the first byte of the next request...
                    async with asyncio.timeout(idle_for):
                        first = await reader.read(1)
                    if not first:
                        return
                    self._connections[task] = False
                    # ...then the whole request within request_timeout.
                    async with asyncio.timeout(self.request_timeout):
                        request, keep = await self._read_request(first, reader, remote)
                except _Refused as refused:
                    await self._write(
                        writer, Response.text(f"{refused}\n", refused.status), keep=False
                    )
                    return
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                response = await self._answer(request)
                keep = keep and not self._stopping
                await self._write(writer, response, keep, head=request.method == "HEAD")
                if not keep:
                    return
                idle_for = self.keepalive_timeout
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._connections.pop(task, None)
            writer.close()
            # The peer may be gone already; the socket is closed either way.
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _read_request(
        self, first: bytes, reader: asyncio.StreamReader, remote: str | None
    ) -> tuple[Request, bool]:
        line = await self._line(reader, 414, "request line too long", first)
        parts = line.split(" ")
        if len(parts) != 3:
            raise _Refused(400, "malformed request line")
        method, target, version = parts
        if not method or not set(method) <= _TOKEN or not target.startswith("/"):
            raise _Refused(400, "malformed request line")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Refused(505 if version.startswith("HTTP/") else 400, "HTTP/1.1 or HTTP/1.0 only")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = await self._line(reader, 431, "header line too long")
            if not line:
                break
            name, colon, value = line.partition(":")
            # No space before the colon (RFC 9112 5.1), no folded lines.
            if not colon or not name or not set(name) <= _TOKEN:
                raise _Refused(400, "malformed header line")
            name, value = name.lower(), value.strip(" \t")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        else:
            raise _Refused(431, f"more than {MAX_HEADERS} header lines")
        if "transfer-encoding" in headers:
            raise _Refused(411, "send the body with a Content-Length, not chunked")
        body = b""
        length_text = headers.get("content-length")
        if length_text is not None:
            if not length_text.isdigit() or not length_text.isascii():
                raise _Refused(400, "malformed Content-Length")
            length = int(length_text)
            if length > MAX_BODY:
                raise _Refused(413, f"the body may hold {MAX_BODY} bytes at most")
            body = await reader.readexactly(length)
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep = "close" not in connection
        if version == "HTTP/1.0":
            keep = "keep-alive" in connection
        path, _, query = target.partition("?")
        return Request(method, path, dict(parse_qsl(query)), headers, body, remote), keep

    @staticmethod
    async def _line(
        reader: asyncio.StreamReader, status: int, too_long: str, first: bytes = b""
    ) -> str:
        try:
            raw = first + await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            raise _Refused(status, too_long) from exc
        line = raw.rstrip(b"\r\n")
        # The stream's limit stops an endless line; this, one a byte too long.
        if len(line) > MAX_LINE:
            raise _Refused(status, too_long)
        try:
            return line.decode("latin-1" if status == 431 else "ascii")
        except UnicodeDecodeError as exc:
            raise _Refused(400, "a request line is ASCII") from exc

    async def _answer(self, request: Request) -> Response:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            allowed = self._allowed.get(request.path)
            if allowed is None:
                return Response.text("not found\n", 404)
            return Response(
                405, b"method not allowed\n", headers={"Allow": ", ".join(sorted(allowed))}
            )
        try:
            return await handler(request)
        except Exception:
            log.exception("request failed", method=request.method, path=request.path)
            return Response.text("internal error\n", 500)

    async def _write(
        self, writer: asyncio.StreamWriter, response: Response, keep: bool, head: bool = False
    ) -> None:
        status = response.status
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        lines = [
            f"HTTP/1.1 {status} {reason}",
            f"Date: {_http_date(time.time())}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        lines += [f"{k}: {v}" for k, v in response.headers.items()]
        if not keep:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(response.body)
        # A caller that does not read its answer holds no more than the time to ask.
        async with asyncio.timeout(self.request_timeout):
            await writer.drain()
