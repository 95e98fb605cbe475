"""The JetStream publisher's parts that need no server: how an answer on its inbox
settles a message, and the one reach into nats-py (dropping its outgoing queue on a
disconnect) left alone on a nats-py that keeps that queue elsewhere."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace
from typing import cast

from nats.aio.client import Client
from nats.aio.msg import Msg

from bridge.sinks.nats import JetStreamPublisher, _Batch, drop_queued


def test_the_outgoing_queue_is_dropped_only_where_nats_py_keeps_it() -> None:
    kept = SimpleNamespace(_pending=[b"PUB a 1\r\nx\r\n"], _pending_data_size=12)
    drop_queued(cast(Client, kept))
    assert kept._pending == [] and kept._pending_data_size == 0
    for other in (SimpleNamespace(), SimpleNamespace(_pending=collections.deque([b"x"]))):
        drop_queued(cast(Client, other))
        assert vars(other) in ({}, {"_pending": collections.deque([b"x"])})


def _publisher_waiting_for(tokens: list[int]) -> tuple[JetStreamPublisher, _Batch]:
    publisher = JetStreamPublisher(cast(Client, None))
    batch = _Batch(remaining=len(tokens), acked=[False] * len(tokens))
    for index, token in enumerate(tokens):
        publisher._pending[token] = (batch, index)
    return publisher, batch


def _msg(token: int, data: bytes, headers: dict[str, str] | None = None) -> Msg:
    return Msg(cast(Client, None), subject=f"_INBOX.abc.{token}", data=data, headers=headers)


async def test_each_answer_settles_its_message() -> None:
    publisher, batch = _publisher_waiting_for([1, 2, 3, 4])
    for msg in (
        _msg(1, b'{"stream":"K8S","seq":1}'),
        # nats-py's Msg for "NATS/1.0 503\r\n\r\n": the status alone, under Status.
        _msg(2, b"", {"Status": "503", "Description": "No Responders"}),
        _msg(3, b'{"error":{"code":400,"err_code":10060,"description":"no"}}'),
        _msg(4, b'{"stream":"K8S","seq":2,"duplicate":true}', {"X": "y"}),
    ):
        await publisher._ack_msg(msg)
    assert batch.acked == [True, False, False, True]
    assert batch.errors == {
        1: "no responders: no stream stores this subject",
        2: "400/10060: no",
    }
    assert batch.done.is_set()
    await asyncio.sleep(0)
