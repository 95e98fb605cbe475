"""NatsSink against a real nats-server with JetStream."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import orjson
import pytest
from cloudevents.v1.http import from_json
from nats.aio.client import Client

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.ground.nats import MSG_ID, JetStreamPublisher
from bridge.sinks.nats import NatsSink
from tests.fixtures.nats import NatsServer

pytestmark = pytest.mark.integration

detector = ChangeDetector(Fingerprinter([]))


def make_events(n: int, *, cluster: str = "it", names: int = 10, start_rv: int = 1) -> list[Event]:
    builder = EventBuilder(
        cluster=cluster, group="", version="v1", kind="ConfigMap", plural="configmaps"
    )
    out = []
    for i in range(n):
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"cm.{i % names}",
                "namespace": "ns",
                "uid": f"uid-{i % names}",
                "resourceVersion": str(start_rv + i),
            },
            "data": {"i": str(i)},
        }
        out.extend(builder.build(c) for c in detector.on_update(None, obj))
    return out


async def stream_messages(nc: Client, stream: str) -> list[Any]:
    js = nc.jetstream()
    info = await js.stream_info(stream)
    return [await js.get_msg(stream, seq) for seq in range(1, info.state.messages + 1)]


@pytest.fixture
async def client(nats_server: str) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server)
    yield nc
    await nc.close()


def unique_stream() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"T{tag}", f"c{tag}"


async def test_messages_land_with_msg_id_and_subjects_in_order(
    nats_server: str, client: Client
) -> None:
    stream, cluster = unique_stream()
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    try:
        assert await sink.ping()
        events = make_events(500, cluster=cluster)
        await sink.publish(events[:200])
        await sink.publish(events[200:])
    finally:
        await sink.close()
    msgs = await stream_messages(client, stream)
    assert len(msgs) == 500
    for msg, event in zip(msgs, events, strict=True):
        assert msg.subject == event.nats_subject
        assert msg.subject.startswith(f"k8s.{cluster}.core.v1.configmaps.ns.cm%2E")
        assert msg.headers[MSG_ID] == event.id
        assert from_json(msg.data)["id"] == event.id
    # Per subject, resourceVersions only grow.
    last: dict[str, int] = {}
    for msg in msgs:
        rv = int(orjson.loads(msg.data)["resourceversion"])
        assert rv > last.get(msg.subject, 0)
        last[msg.subject] = rv


async def test_existing_stream_is_used_as_is(nats_server: str, client: Client) -> None:
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"k8s.{cluster}.>", "other.>"], max_msgs=10_000)
    sink = NatsSink([nats_server], stream=stream, subjects=["ignored.>"])
    await sink.start()
    try:
        await sink.publish(make_events(3, cluster=cluster))
    finally:
        await sink.close()
    info = await js.stream_info(stream)
    assert info.config.subjects == [f"k8s.{cluster}.>", "other.>"]
    assert info.state.messages == 3


async def test_missing_stream_without_create_is_a_sink_error(nats_server: str) -> None:
    sink = NatsSink([nats_server], stream="NOPE" + uuid.uuid4().hex[:6], create_stream=False)
    with pytest.raises(SinkError, match="does not exist"):
        await sink.start()


async def test_redelivery_with_the_same_id_is_dropped_by_the_duplicate_window(
    nats_server: str, client: Client
) -> None:
    stream, cluster = unique_stream()
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    try:
        events = make_events(50, cluster=cluster)
        await sink.publish(events)
        await sink.publish(events[10:30])  # a retry after a crash before the checkpoint
        await sink.publish(make_events(5, cluster=cluster, start_rv=1000))
    finally:
        await sink.close()
    msgs = await stream_messages(client, stream)
    assert len(msgs) == 55
    assert len({m.headers[MSG_ID] for m in msgs}) == 55


async def test_subject_not_in_stream_is_rejected_not_lost(nats_server: str) -> None:
    stream, cluster = unique_stream()
    sink = NatsSink(
        [nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"], retries=1, retry_backoff=0.01
    )
    await sink.start()
    try:
        with pytest.raises(SinkError):
            await sink.publish(make_events(2, cluster="elsewhere" + cluster[4:]))
    finally:
        await sink.close()


async def test_unreachable_server_at_start_is_unavailable() -> None:
    from tests.fixtures.nats import free_port

    sink = NatsSink([f"nats://127.0.0.1:{free_port()}"], connect_timeout=1)
    with pytest.raises(SinkUnavailableError, match="cannot connect"):
        await sink.start()


async def _wait(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def test_server_down_is_unavailable_then_back_publishes(nats_control: NatsServer) -> None:
    stream, cluster = unique_stream()
    sink = NatsSink(
        [nats_control.url],
        stream=stream,
        subjects=[f"k8s.{cluster}.>"],
        ack_timeout=1.0,
        retries=1,
        retry_backoff=0.05,
    )
    await sink.start()
    try:
        events = make_events(30, cluster=cluster)
        await sink.publish(events[:10])
        nats_control.stop()

        async def down() -> bool:
            return not await sink.ping()

        await _wait(down)
        with pytest.raises(SinkUnavailableError):
            await sink.publish(events[10:20])
        nats_control.start()
        await _wait(sink.ping)
        # The caller retries the failed batch, then goes on.
        await sink.publish(events[10:20])
        await sink.publish(events[20:])
    finally:
        await sink.close()
    nc = await nats.connect(nats_control.url)
    try:
        msgs = await stream_messages(nc, stream)
    finally:
        await nc.close()
    assert [m.headers[MSG_ID] for m in msgs] == [e.id for e in events]


async def test_connection_lost_mid_batch_raises_unavailable(nats_control: NatsServer) -> None:
    stream, cluster = unique_stream()
    sink = NatsSink(
        [nats_control.url],
        stream=stream,
        subjects=[f"k8s.{cluster}.>"],
        ack_timeout=1.0,
        retries=1,
        retry_backoff=0.05,
        max_in_flight=64,
    )
    await sink.start()
    try:
        events = make_events(20_000, cluster=cluster)
        task = asyncio.create_task(sink.publish(events))
        await asyncio.sleep(0.05)
        nats_control.stop()
        with pytest.raises(SinkUnavailableError):
            await asyncio.wait_for(task, 15)
    finally:
        await sink.close()


async def test_batches_larger_than_the_window_land_whole_and_in_order(
    nats_server: str, client: Client
) -> None:
    """A batch goes out one window at a time (frames queued together, one flush each)."""
    stream, cluster = unique_stream()
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"], max_in_flight=7)
    await sink.start()
    try:
        events = make_events(100, cluster=cluster, names=3)
        await sink.publish(events)
    finally:
        await sink.close()
    msgs = await stream_messages(client, stream)
    assert [m.headers[MSG_ID] for m in msgs] == [e.id for e in events]
    assert [m.data for m in msgs] == [e.to_json() for e in events]


async def test_frames_carry_headers_and_plain_payloads_byte_for_byte(
    nats_server: str, client: Client
) -> None:
    """The publisher's own frames: headers (values kept to one line) and header-less messages."""
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"raw.{cluster}.>"])
    publisher = JetStreamPublisher(client)
    await publisher.start()
    try:
        batch = await publisher.publish(
            [
                (f"raw.{cluster}.a", b"one\r\ntwo", {"X-A": "v1", MSG_ID: "id\r\n1"}),
                (f"raw.{cluster}.b", b"", None),
                (f"raw.{cluster}.c", b"\x00\xff", {"X-B": " spaced "}),
                # The id alone (every event's frame) takes a path of its own.
                (f"raw.{cluster}.d", b"four", {MSG_ID: " id\r\n2 "}),
                (f"raw.{cluster}.e", b"five", {MSG_ID: "uid:5"}),
            ]
        )
    finally:
        await publisher.stop()
    assert batch.acked == [True] * 5 and not batch.errors
    msgs = await stream_messages(client, stream)
    assert [m.data or b"" for m in msgs] == [b"one\r\ntwo", b"", b"\x00\xff", b"four", b"five"]
    assert msgs[0].headers == {"X-A": "v1", MSG_ID: "id  1"}
    assert not msgs[1].headers
    assert msgs[2].headers == {"X-B": "spaced"}
    assert msgs[3].headers == {MSG_ID: "id  2"}
    assert msgs[4].headers == {MSG_ID: "uid:5"}


async def test_a_batch_leaves_after_what_the_connection_queued_before_it_and_whole(
    nats_server: str, client: Client
) -> None:
    """A message nats-py still holds leaves first; batches of many megabytes (past
    nats-py's pending_size) land whole and in order."""
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"raw.{cluster}.>"])
    publisher = JetStreamPublisher(client)
    await publisher.start()
    subject = f"raw.{cluster}.one"
    payloads = [i.to_bytes(4, "big") * 750 for i in range(1000)]  # 3 KB each
    assert sum(map(len, payloads)) > client._max_pending_size
    try:
        # Queued by nats-py; its flusher has not run yet.
        await client.publish(subject, b"queued first", headers={MSG_ID: "first"})
        assert client.pending_data_size
        first = await publisher.publish(
            [(subject, p, {MSG_ID: f"a{i}"}) for i, p in enumerate(payloads)]
        )
        second = await publisher.publish(
            [(subject, p, {MSG_ID: f"b{i}"}) for i, p in enumerate(payloads)]
        )
    finally:
        await publisher.stop()
    assert all(first.acked) and all(second.acked)
    msgs = await stream_messages(client, stream)
    assert [m.headers[MSG_ID] for m in msgs] == (
        ["first"] + [f"a{i}" for i in range(1000)] + [f"b{i}" for i in range(1000)]
    )
    assert [m.data for m in msgs] == [b"queued first", *payloads, *payloads]


async def test_every_answer_settles_its_message_in_order(nats_server: str, client: Client) -> None:
    """A PubAck, a duplicate's PubAck, an error PubAck and a 503 (no stream stores the
    subject): each settles its message, in order."""
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"raw.{cluster}.>"])
    publisher = JetStreamPublisher(client, max_in_flight=3)
    await publisher.start()
    subject = f"raw.{cluster}.a"
    try:
        batch = await publisher.publish(
            [
                (subject, b"0", {MSG_ID: "m0"}),
                (f"nowhere.{cluster}", b"1", {MSG_ID: "m1"}),
                (subject, b"2", {MSG_ID: "m2", "Nats-Expected-Stream": "WRONG"}),
                (subject, b"3", {MSG_ID: "m0"}),  # a duplicate: acknowledged, not stored
                (subject, b"4", {MSG_ID: "m4"}),
                (f"nowhere.{cluster}", b"5", None),
                (subject, b"6", None),
            ]
        )
    finally:
        await publisher.stop()
    assert batch.acked == [True, False, False, True, True, False, True]
    assert batch.errors == {
        1: "no responders: no stream stores this subject",
        2: "400/10060: expected stream does not match",
        5: "no responders: no stream stores this subject",
    }
    msgs = await stream_messages(client, stream)
    assert [m.data for m in msgs] == [b"0", b"4", b"6"]


async def test_a_message_the_connection_would_refuse_stops_its_window_before_it_leaves(
    nats_server: str, client: Client
) -> None:
    """Over max_payload or with a bad subject, a message raises before any message of
    its window is sent; the publisher goes on with the next batch."""
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"raw.{cluster}.>"])
    publisher = JetStreamPublisher(client)
    await publisher.start()
    subject = f"raw.{cluster}.a"
    huge = b"x" * (client.max_payload + 1)
    try:
        with pytest.raises(nats.errors.MaxPayloadError):
            await publisher.publish([(subject, b"0", None), (subject, huge, None)])
        with pytest.raises(nats.errors.BadSubjectError):
            await publisher.publish([(subject, b"1", None), (f"raw.{cluster}.a b", b"", None)])
        with pytest.raises(nats.errors.BadSubjectError):
            await publisher.publish([(subject, b"2", None), ("", b"", None)])
        batch = await publisher.publish([(subject, b"3", None)])
    finally:
        await publisher.stop()
    assert batch.acked == [True]
    assert [m.data for m in await stream_messages(client, stream)] == [b"3"]
    assert not publisher._pending


async def test_server_restart_mid_batch_keeps_per_subject_order(nats_control: NatsServer) -> None:
    """A batch cut by a server restart, retried as the pipeline does, lands in order per subject.

    Frames nats-py still held when the socket died must not be sent after the
    reconnect: they would land ahead of the retries of frames lost with it.
    """
    stream, cluster = unique_stream()
    sink = NatsSink(
        [nats_control.url],
        stream=stream,
        subjects=[f"k8s.{cluster}.>"],
        ack_timeout=1.0,
        retries=1,
        retry_backoff=0.05,
        max_in_flight=512,
    )
    await sink.start()
    events = make_events(20_000, cluster=cluster, names=50)
    try:
        task = asyncio.create_task(sink.publish(events))
        await asyncio.sleep(0.1)
        nats_control.stop()
        with pytest.raises(SinkUnavailableError):
            await asyncio.wait_for(task, 15)
        nats_control.start()
        await _wait(sink.ping)
        for _ in range(20):  # the pipeline's retry of the unacknowledged batch
            try:
                await sink.publish(events)
                break
            except SinkUnavailableError:
                await asyncio.sleep(0.2)
    finally:
        await sink.close()
    nc = await nats.connect(nats_control.url)
    try:
        msgs = await stream_messages(nc, stream)
    finally:
        await nc.close()
    ids = [m.headers[MSG_ID] for m in msgs]
    assert sorted(ids) == sorted(e.id for e in events)  # all there, once each
    by_subject: dict[str, list[int]] = {}
    for m in msgs:
        by_subject.setdefault(m.subject, []).append(int(m.headers[MSG_ID].split(":")[1]))
    for subject, rvs in by_subject.items():
        assert rvs == sorted(rvs), f"{subject} out of order"


def with_payload(event: Event, size: int) -> Event:
    obj = dict(event.data["object"])
    obj["data"] = {"blob": "x" * size}
    return dataclasses.replace(event, data={**event.data, "object": obj})


async def test_an_event_over_the_servers_max_payload_is_refused_and_the_rest_land(
    nats_server: str, client: Client
) -> None:
    """The limit comes from the server (its INFO), before anything is sent."""
    stream, cluster = unique_stream()
    sink = NatsSink([nats_server], stream=stream, subjects=[f"k8s.{cluster}.>"])
    await sink.start()
    try:
        small = make_events(3, cluster=cluster, names=3)
        huge = with_payload(small[1], 1_500_000)  # the server's default max_payload is 1 MB
        refused = await sink.publish([small[0], huge, small[2]])
    finally:
        await sink.close()
    assert list(refused) == [1] and "max_payload" in refused[1]
    msgs = await stream_messages(client, stream)
    assert [m.headers[MSG_ID] for m in msgs] == [small[0].id, small[2].id]


async def test_a_message_the_stream_refuses_is_refused_not_retried(
    nats_server: str, client: Client
) -> None:
    """A stream with a smaller max_msg_size answers that message with an error PubAck."""
    stream, cluster = unique_stream()
    js = client.jetstream()
    await js.add_stream(name=stream, subjects=[f"k8s.{cluster}.>"], max_msg_size=2_000)
    sink = NatsSink([nats_server], stream=stream)
    await sink.start()
    try:
        events = make_events(3, cluster=cluster, names=3)
        refused = await sink.publish([events[0], with_payload(events[1], 5_000), events[2]])
    finally:
        await sink.close()
    assert list(refused) == [1] and "JetStream refused" in refused[1]
    info = await js.stream_info(stream)
    assert info.state.messages == 2


async def test_what_nats_py_held_when_the_server_died_is_not_sent_after_the_reconnect(
    nats_control: NatsServer,
) -> None:
    """A server that stops reading backs the socket up, and nats-py queues what the
    publisher hands it; when that server dies, nats-py would send its queue once it
    reconnects, ahead of the retries of the frames that died in the socket."""
    stream, cluster = unique_stream()
    sink = NatsSink(
        [nats_control.url],
        stream=stream,
        subjects=[f"k8s.{cluster}.>"],
        ack_timeout=1.0,
        retries=0,
        max_in_flight=8192,
    )
    await sink.start()
    nc = sink._nc
    assert nc is not None
    events = [with_payload(e, 3_000) for e in make_events(6_000, cluster=cluster, names=20)]
    proc = nats_control._proc
    assert proc is not None
    try:
        proc.send_signal(signal.SIGSTOP)
        task = asyncio.create_task(sink.publish(events))
        async with asyncio.timeout(10):
            while nc.pending_data_size < 1 << 20:
                await asyncio.sleep(0.01)
        proc.kill()  # stopped, it still dies
        proc.wait()
        nats_control._proc = None
        with pytest.raises(SinkUnavailableError):
            await asyncio.wait_for(task, 15)
        nats_control.start()
        await _wait(sink.ping)
        for _ in range(20):  # the pipeline's retry of the unacknowledged batch
            try:
                await sink.publish(events)
                break
            except SinkUnavailableError:
                await asyncio.sleep(0.2)
    finally:
        await sink.close()
    nc = await nats.connect(nats_control.url)
    try:
        msgs = await stream_messages(nc, stream)
    finally:
        await nc.close()
    assert sorted(m.headers[MSG_ID] for m in msgs) == sorted(e.id for e in events)
    by_subject: dict[str, list[int]] = {}
    for m in msgs:
        by_subject.setdefault(m.subject, []).append(int(m.headers[MSG_ID].split(":")[1]))
    for subject, rvs in by_subject.items():
        assert rvs == sorted(rvs), f"{subject} out of order"
