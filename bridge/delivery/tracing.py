"""Trace context on published events: one span per published batch, its context on each event.

With tracing on (``tracing.otlpEndpoint``, bridge/service/tracing.py) the publisher
opens one span per batch it publishes (resource, event count, what the bus
acknowledged and refused; its duration is the publish, retries included) and puts
the span's context on every event of the batch as the CloudEvents
distributed-tracing extension: ``traceparent`` (W3C Trace Context) and
``tracestate`` in the event's JSON, and as ``ce_traceparent``/``ce_tracestate``
Kafka headers, ``traceparent``/``tracestate`` NATS headers. A consumer's trace
then starts at the bridge's publish.

Off (the default) nothing here runs: the publisher holds no tracer, and nothing
of OpenTelemetry is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import orjson

from bridge.delivery.events import Event


class BatchSpan(Protocol):
    """One published batch's span."""

    @property
    def traceparent(self) -> str: ...

    @property
    def tracestate(self) -> str: ...

    def acknowledged(self, published: int, refused: int) -> None: ...

    def failed(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


class BatchTracer(Protocol):
    """Opens the span of each published batch (bridge/service/tracing.py: OpenTelemetry)."""

    def batch(self, resource: str, count: int) -> BatchSpan: ...


def traced(events: Sequence[Event], traceparent: str, tracestate: str = "") -> list[Event]:
    """``events`` carrying the trace context: the attributes spliced in front of each
    event's encoded JSON (its bytes are not parsed again), and set on the event for
    the sinks' headers."""
    head = b'{"traceparent":' + orjson.dumps(traceparent) + b","
    if tracestate:
        head += b'"tracestate":' + orjson.dumps(tracestate) + b","
    out = []
    for e in events:
        # Every encoded event is a JSON object with keys: "{" is followed by one.
        encoded = head + e.to_json()[1:]
        out.append(replace(e, encoded=encoded, traceparent=traceparent, tracestate=tracestate))
    return out
