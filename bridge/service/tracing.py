"""The OpenTelemetry side of tracing: batch spans exported over OTLP/HTTP.

Built only when ``tracing.otlpEndpoint`` is set (``build_tracer``); this module is
imported then, and it alone imports OpenTelemetry (the ``otel`` extra), so a
bridge without tracing loads none of it. The tracer provider is the bridge's own,
never the process-global one: settings are passed in, and a library that
installs a global provider is left alone. Spans leave in a background thread
(the SDK's batch processor), never on the event loop; ``shutdown`` flushes them.

Each span: ``publish {resource}``, kind PRODUCER, attributes ``messaging.system``
(kafka, nats, stdout), ``messaging.batch.message_count``, ``k8s_bridge.resource``,
and once the bus answered ``k8s_bridge.acknowledged`` and ``k8s_bridge.refused``
(or the error, status ERROR, when the publish gave up: shutdown, a fatal refusal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.errors import ConfigError

if TYPE_CHECKING:
    from bridge.service.settings import TracingSettings


class OtelBatchSpan:
    __slots__ = ("_span", "traceparent", "tracestate")

    def __init__(self, span: Any) -> None:
        self._span = span
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        self.tracestate = ctx.trace_state.to_header() if ctx.trace_state else ""

    def acknowledged(self, published: int, refused: int) -> None:
        self._span.set_attribute("k8s_bridge.acknowledged", published)
        self._span.set_attribute("k8s_bridge.refused", refused)

    def failed(self, error: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))

    def end(self) -> None:
        self._span.end()


class OtelTracer:
    """``BatchTracer`` (bridge/delivery/tracing.py) over an OpenTelemetry SDK tracer."""

    def __init__(self, settings: TracingSettings, system: str, exporter: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind
        except ImportError as e:
            raise ConfigError(
                f"tracing.otlpEndpoint is set, but OpenTelemetry is not installed ({e.name}):"
                " install k8s-bridge[otel]"
            ) from None
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(
                endpoint=settings.otlp_endpoint, headers=dict(settings.headers) or None
            )
        self._kind = SpanKind.PRODUCER
        self._system = system
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name})
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("k8s-bridge")

    def batch(self, resource: str, count: int) -> OtelBatchSpan:
        span = self._tracer.start_span(
            f"publish {resource}",
            kind=self._kind,
            attributes={
                "messaging.system": self._system,
                "messaging.operation.type": "send",
                "messaging.batch.message_count": count,
                "k8s_bridge.resource": resource,
            },
        )
        return OtelBatchSpan(span)

    def shutdown(self) -> None:
        """Export what is left, then stop (blocks up to the exporter's timeout)."""
        self._provider.shutdown()


def build_tracer(settings: TracingSettings, system: str) -> OtelTracer | None:
    """The tracer of ``tracing`` settings; None (tracing off) without an endpoint."""
    if settings.otlp_endpoint is None:
        return None
    return OtelTracer(settings, system)
