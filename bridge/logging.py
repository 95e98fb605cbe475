"""Structured logging: JSON lines for machines, a console renderer for people.

``configure_logging`` is called by the app with the ``logging`` settings;
modules take a logger with ``get_logger(__name__)`` and log key/value pairs.
Values under keys that look like credentials are replaced before rendering, so
a token handed to a log call by mistake never reaches the output.

Module loggers are made at import, long before the settings are read: each
log call reads the configuration in force at that moment (one module global),
so a logger follows every later ``configure_logging``.

Why not a logging library: the bridge needs four things (key/value lines,
a level, redaction, the stdlib's records in the same format) and nothing per
event on its hot path. The library it used before imported a terminal
renderer and a syntax highlighter with it: 4.8 MiB of an idle bridge's
60 (BENCHMARKS.md, "Idle footprint").
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, TextIO

import orjson

REDACTED = "[redacted]"
_SENSITIVE = re.compile(r"token|passw(or)?d|secret|authorization|api[-_]?key|credential", re.I)

Format = Literal["auto", "json", "console"]
Renderer = Callable[[dict[str, Any]], str]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def redact_sensitive(event: dict[str, Any]) -> dict[str, Any]:
    """Mask values of keys named like token/password/secret/authorization, nested too."""
    for key in list(event):
        if key != "event" and _SENSITIVE.search(key):
            event[key] = REDACTED
        else:
            value = event[key]
            if isinstance(value, dict):
                event[key] = _redact_mapping(value)
    return event


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


def _render_json(event: dict[str, Any]) -> str:
    return orjson.dumps(event, default=str).decode()


_COLORS = {"debug": "\x1b[2m", "info": "\x1b[32m", "warning": "\x1b[33m", "error": "\x1b[31m"}
_RESET, _DIM, _BOLD = "\x1b[0m", "\x1b[2m", "\x1b[1m"


def _console(colors: bool) -> Renderer:
    """``timestamp [level   ] event   key=value …`` (and the traceback below), for a terminal."""

    def render(event: dict[str, Any]) -> str:
        e = dict(event)
        timestamp, level = e.pop("timestamp", ""), e.pop("level", "")
        message, exception = str(e.pop("event", "")), e.pop("exception", None)
        pairs = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in e.items())
        if colors:
            color = _COLORS.get(level, "")
            line = (
                f"{_DIM}{timestamp}{_RESET} [{color}{level:<9}{_RESET}]"
                f" {_BOLD}{message:<30}{_RESET} {pairs}"
            )
        else:
            line = f"{timestamp} [{level:<9}] {message:<30} {pairs}"
        line = line.rstrip()
        return f"{line}\n{exception}" if exception else line

    return render


class _Output:
    """The configuration in force: replaced whole by ``configure_logging``."""

    __slots__ = ("level", "render", "stream")

    def __init__(self, level: int, render: Renderer, stream: TextIO | None) -> None:
        self.level = level
        self.render = render
        # None: sys.stdout at the time of writing (pytest swaps it). Before any
        # configure_logging (a program embedding the bridge's parts): every level, on
        # stdout, as the logging library the bridge used before did.
        self.stream = stream


_output = _Output(_LEVELS["debug"], _console(False), None)
# While tests capture (``capture_logs``): every event as a dict, at every level.
_captured: list[dict[str, Any]] | None = None


def _timestamp(seconds: float) -> str:
    whole = time.gmtime(seconds)
    return time.strftime("%Y-%m-%dT%H:%M:%S", whole) + f".{int(seconds % 1 * 1e6):06d}Z"


def _exception_text(exc_info: Any) -> str | None:
    if exc_info is None or exc_info is False:
        return None
    if exc_info is True:
        exc_info = sys.exc_info()
    elif isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if not exc_info or exc_info[0] is None:
        return None
    return "".join(traceback.format_exception(*exc_info)).rstrip()


def _write(event: dict[str, Any]) -> None:
    out = _output
    stream = out.stream if out.stream is not None else sys.stdout
    try:
        stream.write(out.render(redact_sensitive(event)) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed or broken stream must not take the bridge down with it


class BoundLogger:
    """A logger with key/values bound to every line it writes."""

    __slots__ = ("_context",)

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context

    def bind(self, **values: Any) -> BoundLogger:
        return BoundLogger({**self._context, **values})

    def _log(self, level: str, event: str, values: dict[str, Any]) -> None:
        exc_info = values.pop("exc_info", None)
        if _captured is not None:
            _captured.append({**self._context, **values, "event": event, "log_level": level})
            return
        if _LEVELS[level] < _output.level:
            return
        line: dict[str, Any] = {**self._context, **values, "event": event, "level": level}
        line["timestamp"] = _timestamp(time.time())
        exception = _exception_text(exc_info)
        if exception is not None:
            line["exception"] = exception
        _write(line)

    def debug(self, event: str, **values: Any) -> None:
        self._log("debug", event, values)

    def info(self, event: str, **values: Any) -> None:
        self._log("info", event, values)

    def warning(self, event: str, **values: Any) -> None:
        self._log("warning", event, values)

    def error(self, event: str, **values: Any) -> None:
        self._log("error", event, values)

    def critical(self, event: str, **values: Any) -> None:
        self._log("critical", event, values)

    def exception(self, event: str, **values: Any) -> None:
        values.setdefault("exc_info", True)
        self._log("error", event, values)


def get_logger(name: str | None = None, **initial: Any) -> BoundLogger:
    """A logger bound to ``logger=name`` (and any initial key/values)."""
    if name is not None:
        initial = {"logger": name, **initial}
    return BoundLogger(initial)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """For tests: every event logged meanwhile, as ``{"event", "log_level", **values}``,
    at every level, instead of writing it."""
    global _captured
    previous, captured = _captured, list[dict[str, Any]]()
    _captured = captured
    try:
        yield captured
    finally:
        _captured = previous


def _wants_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def configure_logging(
    format: Format = "auto", level: str = "info", stream: TextIO | None = None
) -> None:
    """Set the format, level and stream of every logger (and route the stdlib's
    ``logging`` through the same output).

    ``auto`` renders JSON lines unless ``stream`` is a terminal. Loggers from
    ``get_logger`` follow it from their next log line on, wherever they were made.
    """
    global _output
    out = stream if stream is not None else sys.stderr
    numeric = _LEVELS.get(level.lower())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    as_json = format == "json" or (format == "auto" and not _wants_tty(out))
    render = _render_json if as_json else _console(_wants_tty(out))
    _output = _Output(numeric, render, out)
    # Libraries (aiokafka, nats, aiohttp) log through the stdlib: same format, same stream.
    handler = logging.StreamHandler(out)
    handler.setFormatter(_RecordFormatter(render))
    handler.addFilter(LibraryRateLimit())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_k8s_bridge", False)]:
        root.removeHandler(old)
    handler._k8s_bridge = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)


def reset_logging() -> None:
    """Back to the defaults before any ``configure_logging`` (console, every level,
    stdout); the stdlib's handler stays as configured. For tests."""
    global _output
    _output = _Output(_LEVELS["debug"], _console(False), None)


class _RecordFormatter(logging.Formatter):
    """A stdlib record as one of the bridge's lines: its message, logger name and level."""

    def __init__(self, render: Renderer) -> None:
        super().__init__()
        self._render = render

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "event": record.getMessage(),
            "logger": record.name,
            "level": record.levelname.lower(),
            "timestamp": _timestamp(record.created),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info).rstrip()
        return self._render(redact_sensitive(line))


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
