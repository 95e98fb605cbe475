"""A watch stream's lines: cut from whatever the socket reads bring, one at a time."""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import AsyncGenerator
from typing import Any

import orjson
import pytest

from bridge.errors import KubeConnectionError
from bridge.kube.client import _lines


class Content:
    """``resp.content`` as ``_lines`` reads it: the given reads, then a quiet stream
    (``quiet``) or the end of the body."""

    def __init__(self, reads: list[bytes], *, quiet: bool = False) -> None:
        self.reads = reads
        self.quiet = quiet
        self.waiting = asyncio.Event()

    async def readany(self) -> bytes:
        if self.reads:
            return self.reads.pop(0)
        if self.quiet:
            self.waiting.set()
            await asyncio.Event().wait()
        return b""


class Response:
    def __init__(self, content: Content) -> None:
        self.content = content


def lines_of(reads: list[bytes], decode: Any = None) -> AsyncGenerator[Any, None]:
    return _lines(Response(Content(reads)), "GET", "/api/v1/pods", decode)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(20))
async def test_lines_come_out_whole_wherever_the_reads_cut_them(seed: int) -> None:
    rnd = random.Random(seed)
    lines = [b"x" * rnd.choice([0, 1, 5, 300, 5000]) + str(i).encode() for i in range(200)]
    body = b"".join(line + b"\n" + b"\n" * rnd.choice([0, 0, 0, 1]) for line in lines)
    reads, at = [], 0
    while at < len(body):
        size = rnd.choice([1, 2, 7, 100, 4096, 20000])
        reads.append(body[at : at + size])
        at += size
    assert [line async for line in lines_of(reads)] == lines


async def test_a_line_cut_off_at_the_end_of_the_body_is_a_broken_stream() -> None:
    with pytest.raises(KubeConnectionError, match="truncated mid-line"):
        _ = [line async for line in lines_of([b'{"a":1}\n{"b"'])]


async def test_an_undecodable_line_names_its_length() -> None:
    with pytest.raises(KubeConnectionError, match=r"undecodable line \(5 bytes\)"):
        _ = [item async for item in lines_of([b'{"a":1}\nnope!\n'], orjson.loads)]


async def test_a_large_read_is_not_held_twice_nor_once_the_stream_goes_quiet() -> None:
    """A 2 MiB read of ~700 Pods (what a streaming list brings when it outpaces the
    pipeline): while its objects are taken, the read is held once, not also as a
    list of its lines; once they are all taken, nothing of it is held."""
    line = b'{"type":"ADDED","object":{"blob":"' + b"x" * 3000 + b'"}}\n'
    content = Content([], quiet=True)
    tracemalloc.start()
    try:
        lines = _lines(Response(content), "GET", "/p", None)  # type: ignore[arg-type]
        base = tracemalloc.get_traced_memory()[0]
        content.reads = [line * 700]  # allocated after the baseline
        await lines.__anext__()
        while_taking = tracemalloc.get_traced_memory()[0] - base
        for _ in range(699):
            await lines.__anext__()
        pending = asyncio.ensure_future(lines.__anext__())
        await content.waiting.wait()
        quiet = tracemalloc.get_traced_memory()[0] - base
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
    finally:
        tracemalloc.stop()
    assert while_taking < 1.2 * len(line) * 700, while_taking
    assert quiet < 64 * 1024, quiet
