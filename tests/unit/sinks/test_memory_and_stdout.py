"""The memory twin and the stdout sink honour the Sink contract."""

from __future__ import annotations

import io

import orjson
import pytest
from cloudevents.v1.http import from_json

from bridge.delivery.changes import ChangeDetector, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.errors import SinkError, SinkUnavailableError
from bridge.ground.envelope import Event
from bridge.sinks import Sink
from bridge.sinks.stdout import StdoutSink
from tests.doubles.memory_sink import MemorySink

detector = ChangeDetector(Fingerprinter([]))
builder = EventBuilder(cluster="c", group="", version="v1", kind="Pod", plural="pods")


def events(n: int) -> list[Event]:
    out = []
    for i in range(n):
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"p{i}",
                "namespace": "ns",
                "uid": f"u{i}",
                "resourceVersion": str(i),
            },
        }
        out.extend(builder.build(c) for c in detector.on_add(obj, None))
    return out


def test_both_satisfy_the_protocol() -> None:
    assert isinstance(MemorySink(), Sink)
    assert isinstance(StdoutSink(io.StringIO()), Sink)


async def test_memory_sink_keeps_order_and_batches() -> None:
    sink = MemorySink()
    await sink.start()
    batch = events(5)
    await sink.publish(batch[:2])
    await sink.publish(batch[2:])
    assert sink.events == batch
    assert [len(b) for b in sink.batches] == [2, 3]
    assert sink.by_subject("ns/p3") == [batch[3]]


async def test_memory_sink_failures_keep_nothing() -> None:
    sink = MemorySink()
    await sink.start()
    sink.fail_next(2)
    for _ in range(2):
        with pytest.raises(SinkUnavailableError):
            await sink.publish(events(3))
    assert sink.events == []
    await sink.publish(events(1))
    assert len(sink.events) == 1
    sink.available = False
    assert not await sink.ping()
    with pytest.raises(SinkUnavailableError):
        await sink.publish(events(1))
    sink.available = True
    sink.fail_next(1, SinkError)
    with pytest.raises(SinkError):
        await sink.publish(events(1))
    await sink.close()
    assert not await sink.ping()


@pytest.mark.parametrize("binary", [False, True])
async def test_stdout_sink_writes_one_cloudevent_per_line(binary: bool) -> None:
    stream: io.StringIO | io.BytesIO = io.BytesIO() if binary else io.StringIO()
    sink = StdoutSink(stream)
    await sink.start()
    batch = events(3)
    await sink.publish(batch)
    await sink.publish([])
    raw = stream.getvalue()
    text = raw.decode() if isinstance(raw, bytes) else raw
    lines = text.splitlines()
    assert len(lines) == 3
    assert [from_json(line)["id"] for line in lines] == [e.id for e in batch]
    assert orjson.loads(lines[0])["subject"] == "ns/p0"
    assert await sink.ping()
    await sink.close()


async def test_stdout_sink_reports_a_closed_stream_as_unavailable() -> None:
    stream = io.StringIO()
    sink = StdoutSink(stream)
    stream.close()
    assert not await sink.ping()
    with pytest.raises(SinkUnavailableError):
        await sink.publish(events(1))
