"""The check that nats-py's private parts still fit the publisher's fast path.

The fast path writes to nats-py's outgoing queue and reads its parser's state.
A nats-py that renamed or reshaped any of those must be caught at start, so
the publisher takes nats-py's public API instead of breaking (or misreading
the stream) at run time. The public path's answers must settle as the fast
path's do.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import nats.protocol.parser
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol.parser import Parser

from bridge.sinks.nats import JetStreamPublisher, _Batch, _drop_queued, _fast_path_fits


def _sub(sid: Any = 1) -> Subscription:
    return cast(Subscription, SimpleNamespace(_id=sid))


async def test_the_installed_nats_py_fits() -> None:
    assert _fast_path_fits(Client(), _sub())


async def _sync_parse(data: bytes = b"") -> None:
    pass


async def _four_args(sid: int, subject: bytes, data: bytes, headers: bytes | None) -> None:
    pass


def _delete(name: str) -> Callable[[Any], None]:
    """The attribute renamed: gone from the instance and from its class."""

    def missing(self: Any) -> Any:
        raise AttributeError(name)

    def change(obj: Any) -> None:
        # A property on a class of its own hides both what the instance and its class hold.
        obj.__class__ = type(type(obj).__name__, (type(obj),), {name: property(missing)})

    return change


def _set(name: str, value: Any) -> Callable[[Any], None]:
    return lambda obj: setattr(obj, name, value)


# One private part at a time, renamed or reshaped as a future nats-py might.
CLIENT_CHANGES: dict[str, Callable[[Any], None]] = {
    "_pending gone": _delete("_pending"),
    "_pending a deque": _set("_pending", collections.deque()),
    "_pending_data_size gone": _delete("_pending_data_size"),
    "_max_pending_size gone": _delete("_max_pending_size"),
    "_flush_queue gone": _delete("_flush_queue"),
    "_flush_queue without empty()": _set("_flush_queue", object()),
    "_flush_pending gone": _delete("_flush_pending"),
    "_flush_pending not a coroutine": _set("_flush_pending", lambda: None),
    "_transport gone": _delete("_transport"),
    "_transport.drain not a coroutine": _set(
        "_transport", SimpleNamespace(write=lambda data: None, drain=lambda: None)
    ),
    "stats without in_msgs": _set("stats", {"in_bytes": 0, "out_msgs": 0, "out_bytes": 0}),
    "_process_msg gone": _delete("_process_msg"),
    "_process_msg takes four arguments": _set("_process_msg", _four_args),
    "_process_msg not a coroutine": _set("_process_msg", lambda *args: None),
    "_ps gone": _delete("_ps"),
    "_ps of another client": _set("_ps", Parser(object())),
}
PARSER_CHANGES: dict[str, Callable[[Any], None]] = {
    "buf gone": _delete("buf"),
    "buf bytes": _set("buf", b""),
    "buf a list": _set("buf", []),
    "state gone": _delete("state"),
    "state a name": _set("state", "AWAITING_CONTROL_LINE"),
    "parse not a coroutine": _set("parse", lambda data=b"": None),
    "nc gone": _delete("nc"),
}


@pytest.mark.parametrize("change", CLIENT_CHANGES.values(), ids=CLIENT_CHANGES.keys())
async def test_a_client_part_renamed_or_reshaped_does_not_fit(
    change: Callable[[Any], None],
) -> None:
    nc = Client()
    change(nc)
    assert not _fast_path_fits(nc, _sub())


@pytest.mark.parametrize("change", PARSER_CHANGES.values(), ids=PARSER_CHANGES.keys())
async def test_a_parser_part_renamed_or_reshaped_does_not_fit(
    change: Callable[[Any], None],
) -> None:
    nc = Client()
    change(nc._ps)
    assert not _fast_path_fits(nc, _sub())


async def test_a_subscription_without_its_sid_does_not_fit() -> None:
    assert not _fast_path_fits(Client(), cast(Subscription, SimpleNamespace(sid=1)))
    assert not _fast_path_fits(Client(), _sub("1"))


async def test_a_renumbered_parser_state_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one change no attribute check would see: the fast path would misread the stream."""
    monkeypatch.setattr(nats.protocol.parser, "AWAITING_CONTROL_LINE", 0)
    assert not _fast_path_fits(Client(), _sub())


async def test_a_parser_module_that_names_no_states_is_judged_by_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nc = Client()
    monkeypatch.delattr(nats.protocol.parser, "AWAITING_CONTROL_LINE")
    assert _fast_path_fits(nc, _sub())


async def test_already_wrapped_by_another_publisher_still_fits() -> None:
    """Two publishers on one connection (the sink and the KV store may share one)."""
    from bridge.sinks.nats import _take_acks

    nc = Client()
    _take_acks(nc, 1, lambda *args: None, "_INBOX.a.", lambda token, data: None)
    assert _fast_path_fits(nc, _sub(2))


def test_the_outgoing_queue_is_dropped_only_where_nats_py_keeps_it() -> None:
    kept = SimpleNamespace(_pending=[b"PUB a 1\r\nx\r\n"], _pending_data_size=12)
    _drop_queued(cast(Client, kept))
    assert kept._pending == [] and kept._pending_data_size == 0
    for other in (SimpleNamespace(), SimpleNamespace(_pending=collections.deque([b"x"]))):
        _drop_queued(cast(Client, other))
        assert vars(other) in ({}, {"_pending": collections.deque([b"x"])})


def _publisher_waiting_for(tokens: list[int]) -> tuple[JetStreamPublisher, _Batch]:
    publisher = JetStreamPublisher(cast(Client, None))
    batch = _Batch(remaining=len(tokens), acked=[False] * len(tokens))
    for index, token in enumerate(tokens):
        publisher._pending[token] = (batch, index)
    return publisher, batch


def _msg(token: int, data: bytes, headers: dict[str, str] | None = None) -> Msg:
    return Msg(cast(Client, None), subject=f"_INBOX.abc.{token}", data=data, headers=headers)


async def test_answers_through_the_public_api_settle_as_on_the_fast_path() -> None:
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
