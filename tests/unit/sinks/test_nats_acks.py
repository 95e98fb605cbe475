"""PubAcks taken off the NATS read loop: the bytes of a read, as TCP cuts them.

The publisher settles plain acks straight from the bytes read and leaves every
other operation to nats-py's own parser. Fed through nats-py's real ``Parser``,
cut at every offset, the same stream must settle the same acks, in order, once,
and hand everything else to nats-py exactly as it would without the shortcut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from nats.aio.client import Client
from nats.protocol.parser import Parser

from bridge.sinks.nats import _take_acks

INBOX = "_INBOX.abc"
SID = 7


class _Connection:
    """What ``_take_acks`` and nats-py's parser use of a client."""

    def __init__(self) -> None:
        self.stats: dict[str, int] = {"in_msgs": 0, "in_bytes": 0}
        self.others: list[tuple[int, bytes, bytes, bytes | None]] = []
        self.pings = 0
        self._ps = Parser(self)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        self.others.append((sid, subject, data, headers))

    async def _process_ping(self) -> None:
        self.pings += 1

    async def _process_pong(self) -> None:
        pass

    async def _process_info(self, info: Any) -> None:
        pass


def _ack(token: int, seq: int) -> bytes:
    """A PubAck as nats-server writes it: its reply field empty, so two spaces."""
    payload = b'{"stream":"K8S","seq":%d}' % seq
    return b"MSG %s.%d %d  %d\r\n%s\r\n" % (INBOX.encode(), token, SID, len(payload), payload)


def _stream() -> tuple[bytes, list[tuple[int, bytes]]]:
    """Acks around a PING, a 503 status for an ack (a header block), an error PubAck
    and another subscription's message; and the acks the publisher must settle."""
    parts = [_ack(t, 100 + t) for t in range(1, 6)]
    parts.append(b"PING\r\n")
    parts += [_ack(t, 100 + t) for t in range(6, 9)]
    status = b"NATS/1.0 503\r\n\r\n"
    parts.append(b"HMSG %s.9 %d %d %d\r\n%s\r\n" % (INBOX.encode(), SID, 16, 16, status))
    error = b'{"error":{"code":400,"description":"bad"}}'
    parts.append(b"MSG %s.10 %d %d\r\n%s\r\n" % (INBOX.encode(), SID, len(error), error))
    parts.append(b"MSG other.subject 3 5\r\nhello\r\n")
    parts += [_ack(t, 100 + t) for t in range(11, 15)]
    settled = [(t, b'{"stream":"K8S","seq":%d}' % (100 + t)) for t in range(1, 9)]
    settled.append((10, error))
    settled += [(t, b'{"stream":"K8S","seq":%d}' % (100 + t)) for t in range(11, 15)]
    return b"".join(parts), settled


async def _feed(pieces: list[bytes]) -> tuple[_Connection, list[tuple[int, bytes, bytes | None]]]:
    """Each answer to the publisher, in the order it came: (token, payload, headers)."""
    conn = _Connection()
    answers: list[tuple[int, bytes, bytes | None]] = []
    _take_acks(
        cast(Client, conn),
        SID,
        lambda subject, data, headers: answers.append(
            (int(subject.rpartition(b".")[2]), data, headers)
        ),
        INBOX + ".",
        lambda token, data: answers.append((token, data, None)),
    )
    for piece in pieces:
        await conn._ps.parse(piece)
    return conn, answers


async def test_every_answer_is_taken_once_in_order_wherever_a_read_ends() -> None:
    data, acks = _stream()
    expected: list[tuple[int, bytes, bytes | None]] = [(t, d, None) for t, d in acks]
    expected.insert(8, (9, b"", b"NATS/1.0 503\r\n\r\n"))
    for size in range(1, len(data)):
        for pieces in (
            [data[:size], data[size:]],
            [data[i : i + size] for i in range(0, len(data), size)],
        ):
            conn, answers = await _feed(pieces)
            assert answers == expected, f"reads of {size} bytes"
            assert conn.others == [(3, b"other.subject", b"hello", None)]
            assert conn.pings == 1
            assert conn.stats["in_msgs"] == len(expected)
            assert not conn._ps.buf


def _into(tokens: list[int]) -> Callable[[int, bytes], None]:
    return lambda token, data: tokens.append(token)


async def test_a_read_of_plain_acks_never_reaches_nats_pys_parser() -> None:
    """The point of the shortcut: a read of plain acks is settled from its bytes."""
    acks = b"".join(_ack(t, t) for t in range(1, 200))
    one = len(_ack(100, 100))
    for cut in range(5000, 5000 + one):  # a read ends at each byte of one message
        conn = _Connection()
        conn._ps.parse = None  # type: ignore[assignment,method-assign]
        settled: list[int] = []
        _take_acks(cast(Client, conn), SID, lambda *_: None, INBOX + ".", _into(settled))
        for piece in (acks[:cut], acks[cut:]):
            await conn._ps.parse(piece)
        assert settled == list(range(1, 200)), f"cut at {cut}"
