"""The health server's HTTP (bridge/ground/httpserver.py), spoken byte by byte over a
real socket: what a malformed or oversized request gets, keep-alive, close, stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bridge.ground.httpserver import MAX_BODY, MAX_HEADERS, MAX_LINE, HttpServer, Request, Response


async def echo(request: Request) -> Response:
    return Response.text(f"{request.method} {request.path} {request.query} {len(request.body)}\n")


async def slow(_request: Request) -> Response:
    await asyncio.sleep(0.3)
    return Response.text("slow\n")


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    routes = {("GET", "/echo"): echo, ("POST", "/echo"): echo, ("GET", "/slow"): slow}
    s = HttpServer("127.0.0.1", 0, routes, keepalive_timeout=1.0, request_timeout=0.5)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def connect(s: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", s.port)


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response read as a client does: by its Content-Length."""
    status_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 2)
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def ask(s: HttpServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await connect(s)
    writer.write(raw)
    try:
        return await response(reader)
    finally:
        writer.close()


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 2) == b""


async def test_a_get_with_a_query(server: HttpServer) -> None:
    status, headers, body = await ask(
        server, b"GET /echo?resource=v1%2FPod&x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 200
    assert body == b"GET /echo {'resource': 'v1/Pod', 'x': '1'} 0\n"
    assert headers["content-length"] == str(len(body))
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["date"].endswith(" GMT")


async def test_two_requests_on_one_connection(server: HttpServer) -> None:
    reader, writer = await connect(server)
    for i in range(2):
        writer.write(f"GET /echo?n={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, headers, body = await response(reader)
        assert status == 200 and "connection" not in headers
        assert body == f"GET /echo {{'n': '{i}'}} 0\n".encode()
    writer.close()


async def test_pipelined_requests_are_answered_in_order(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /echo?n=1 HTTP/1.1\r\n\r\nGET /echo?n=2 HTTP/1.1\r\n\r\n")
    assert (await response(reader))[2] == b"GET /echo {'n': '1'} 0\n"
    assert (await response(reader))[2] == b"GET /echo {'n': '2'} 0\n"
    writer.close()


async def test_connection_close_is_honoured(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
    status, headers, _ = await response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed(reader)


async def test_http_1_0_closes_unless_asked_to_keep_alive(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.0\r\n\r\n")
    assert (await response(reader))[1]["connection"] == "close"
    assert await closed(reader)
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert "connection" not in (await response(reader))[1]
    writer.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /echo\r\n\r\n",
        b"GET  /echo HTTP/1.1\r\n\r\n",
        b"GET echo HTTP/1.1\r\n\r\n",
        b"G(T /echo HTTP/1.1\r\n\r\n",
        b"GET /echo FTP/1.1\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost : x\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\n\r\n",
    ],
)
async def test_a_malformed_request_is_a_400_and_closes(server: HttpServer, raw: bytes) -> None:
    reader, writer = await connect(server)
    writer.write(raw)
    status, headers, _ = await response(reader)
    assert (status, headers["connection"]) == (400, "close")
    assert await closed(reader)


async def test_an_unknown_version_is_a_505(server: HttpServer) -> None:
    assert (await ask(server, b"GET /echo HTTP/2.0\r\n\r\n"))[0] == 505


@pytest.mark.parametrize("end", [b"\r\n", b"\n"])
async def test_a_request_line_over_the_limit_is_a_414(server: HttpServer, end: bytes) -> None:
    def line(length: int) -> bytes:
        target = b"/echo?q=" + b"a" * (length - len(b"GET /echo?q= HTTP/1.1"))
        return b"GET " + target + b" HTTP/1.1" + end + end

    assert len(line(MAX_LINE)) == MAX_LINE + 2 * len(end)
    assert (await ask(server, line(MAX_LINE)))[0] == 200
    assert (await ask(server, line(MAX_LINE + 1)))[0] == 414
    assert (await ask(server, line(10 * MAX_LINE)))[0] == 414


@pytest.mark.parametrize("end", [b"\r\n", b"\n"])
async def test_a_header_line_over_the_limit_is_a_431(server: HttpServer, end: bytes) -> None:
    def header(length: int) -> bytes:
        return b"GET /echo HTTP/1.1" + end + b"X-Big: " + b"a" * (length - 7) + end + end

    assert (await ask(server, header(MAX_LINE)))[0] == 200
    assert (await ask(server, header(MAX_LINE + 1)))[0] == 431


async def test_too_many_headers_is_a_431(server: HttpServer) -> None:
    def with_headers(n: int) -> bytes:
        lines = b"".join(b"X-H%d: v\r\n" % i for i in range(n))
        return b"GET /echo HTTP/1.1\r\n" + lines + b"\r\n"

    assert (await ask(server, with_headers(MAX_HEADERS)))[0] == 200
    assert (await ask(server, with_headers(MAX_HEADERS + 1)))[0] == 431


async def test_a_body_over_the_limit_is_a_413(server: HttpServer) -> None:
    ok = b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % MAX_BODY + b"a" * MAX_BODY
    status, _, body = await ask(server, ok)
    assert (status, body) == (200, b"POST /echo {} %d\n" % MAX_BODY)
    big = b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1)
    status, headers, _ = await ask(server, big)
    assert (status, headers["connection"]) == (413, "close")


async def test_a_chunked_body_is_a_411(server: HttpServer) -> None:
    raw = b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"
    assert (await ask(server, raw))[0] == 411


@pytest.mark.parametrize("method", [b"HEAD", b"PUT", b"DELETE", b"BREW"])
async def test_a_method_the_path_does_not_answer_is_a_405(
    server: HttpServer, method: bytes
) -> None:
    reader, writer = await connect(server)
    writer.write(method + b" /echo HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
    status_line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert status_line.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, POST\r\n" in status_line
    if method != b"HEAD":  # a HEAD answer has no body, whatever its Content-Length says
        length = int(status_line.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    # The connection stays usable: the next request is answered.
    assert (await response(reader))[0] == 200
    writer.close()


async def test_an_unknown_path_is_a_404(server: HttpServer) -> None:
    assert (await ask(server, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404


async def test_a_slow_request_is_dropped_after_the_request_timeout(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nX-Slow: ")  # and nothing more (slowloris)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await closed(reader)
    assert 0.4 <= loop.time() - started < 1.5


async def test_a_connection_that_asks_nothing_is_closed_after_the_request_timeout(
    server: HttpServer,
) -> None:
    reader, _ = await connect(server)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await closed(reader)
    assert 0.4 <= loop.time() - started < 0.9


async def test_an_idle_connection_is_closed_after_the_keepalive_timeout(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
    await response(reader)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await closed(reader)
    assert 0.9 <= loop.time() - started < 2


async def test_stop_closes_idle_connections_and_lets_an_answer_finish() -> None:
    # Idle connections that would stay open a minute: stop must not wait for them.
    server = HttpServer("127.0.0.1", 0, {("GET", "/slow"): slow}, keepalive_timeout=60)
    await server.start()
    loop = asyncio.get_running_loop()
    idle_reader, _ = await connect(server)
    busy_reader, busy_writer = await connect(server)
    # A request under way when the server stops: answered, then closed.
    busy_writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
    await asyncio.sleep(0.1)
    started = loop.time()
    stopping = asyncio.create_task(server.stop())
    assert await closed(idle_reader)
    status, headers, body = await response(busy_reader)
    assert (status, body, headers["connection"]) == (200, b"slow\n", "close")
    await asyncio.wait_for(stopping, 2)
    assert loop.time() - started < 1
    with pytest.raises(OSError):
        await connect(server)


async def test_a_failing_handler_is_a_500() -> None:
    async def broken(_request: Request) -> Response:
        raise RuntimeError("boom")

    s = HttpServer("127.0.0.1", 0, {("GET", "/x"): broken})
    await s.start()
    try:
        assert (await ask(s, b"GET /x HTTP/1.1\r\n\r\n"))[0] == 500
    finally:
        await s.stop()
