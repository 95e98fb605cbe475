"""Structured logging: JSON lines for machines, a console renderer for people.

``configure_logging`` is called by the app with the ``logging`` settings;
modules take a logger with ``get_logger(__name__)`` and log key/value pairs.
Values under keys that look like credentials are replaced before rendering, so
a token handed to a log call by mistake never reaches the output.

Module loggers are made at import, long before the settings are read, so they
are lazy: each assembles itself from the configuration in force at its use,
and again after ``configure_logging`` runs anew.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Literal, TextIO

import orjson
import structlog

REDACTED = "[redacted]"
_SENSITIVE = re.compile(r"token|passw(or)?d|secret|authorization|api[-_]?key|credential", re.I)

Format = Literal["auto", "json", "console"]


def redact_sensitive(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask values of keys named like token/password/secret/authorization."""
    for key in list(event_dict):
        if key != "event" and _SENSITIVE.search(key):
            event_dict[key] = REDACTED
        else:
            value = event_dict[key]
            if isinstance(value, dict):
                event_dict[key] = _redact_mapping(value)
    return event_dict


def _redact_mapping(value: dict[Any, Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(key, str) and _SENSITIVE.search(key):
            out[key] = REDACTED
        elif isinstance(item, dict):
            out[key] = _redact_mapping(item)
        else:
            out[key] = item
    return out


def _wants_json(format: Format, stream: TextIO) -> bool:
    if format == "json":
        return True
    if format == "console":
        return False
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def configure_logging(
    format: Format = "auto", level: str = "info", stream: TextIO | None = None
) -> None:
    """Configure structlog (and route the stdlib's ``logging`` through the same output).

    ``auto`` renders JSON lines unless ``stream`` is a terminal. Loggers from
    ``get_logger`` follow it from their next log line on, wherever they were made.
    """
    out = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    as_json = _wants_json(format, out)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_sensitive,
    ]
    renderer: Any
    if as_json:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_wants_colors(out))
    structlog.reset_defaults()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )
    # Libraries (aiokafka, nats, aiohttp) log through the stdlib: same format, same stream.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    handler.addFilter(LibraryRateLimit())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_k8s_bridge", False)]:
        root.removeHandler(old)
    handler._k8s_bridge = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)


class LibraryRateLimit(logging.Filter):
    """At most one line per ``every`` seconds for each message of a client library.

    During an outage a client library (aiokafka: over twenty lines a second)
    repeats the same complaint at every reconnect; the bridge's own warnings
    already say what is wrong at a bounded rate. The next line that passes says how
    many like it were held back. The bridge's own loggers are never limited.
    """

    def __init__(self, every: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every = every
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("bridge"):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.every:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]} more like this in the last {now - last[0]:.0f}s)"
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def _wants_colors(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


class _LazyLogger:
    """A structlog logger that binds its context when used, under the configuration then
    in force; structlog's own lazy proxy would keep the first one it met for good."""

    __slots__ = ("_context", "_factory", "_logger", "_processors", "_wrapper")

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context
        self._logger: Any = None
        self._processors: object = None
        self._wrapper: object = None
        self._factory: object = None

    def _current(self) -> Any:
        # Any structlog.configure counts (configure_logging, reset_defaults,
        # structlog.testing.capture_logs): each installs new objects.
        config = structlog.get_config()
        processors, wrapper = config["processors"], config["wrapper_class"]
        factory = config["logger_factory"]
        if (
            self._logger is None
            or processors is not self._processors
            or wrapper is not self._wrapper
            or factory is not self._factory
        ):
            self._logger = structlog.get_logger().bind(**self._context)
            self._processors, self._wrapper, self._factory = processors, wrapper, factory
        return self._logger

    def bind(self, **values: Any) -> _LazyLogger:
        return _LazyLogger({**self._context, **values})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


def get_logger(name: str | None = None, **initial: Any) -> Any:
    """A lazy logger bound to ``logger=name`` (and any initial key/values)."""
    if name is not None:
        initial = {"logger": name, **initial}
    return _LazyLogger(initial)
