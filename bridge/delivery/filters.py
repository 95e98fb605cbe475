"""Per-resource event filters: a CEL expression over ``object``, ``oldObject`` and ``type``.

An object is *in view* while the expression holds for it; only objects in view
are published. The pipeline keeps the view as state (bridge/delivery/handler.py): an
object entering it is published as added, one leaving it as ``filtered`` (a
delete-like event, so a consumer's view stays right), and the delete of an
object that was never in view is not published. Checkpoint digests hold only
objects in view, which is what was published.

Evaluating CEL is dominated by converting the activation into CEL values, and
a pod is a few KB of nested maps: converting it whole costs about the whole
budget of an event, ~30x handing over the fields a test reads
(``python -m bench cel``). So the expression is scanned once, at configuration
time, for the field paths it reads (``object.status.phase``,
``object.metadata.labels``), and only those subtrees are handed over. An
expression that uses ``object`` other than by a field path (``size(object)``,
``object['x']``) gets the whole object.

An evaluation error (a missing key such as ``object.status.phase`` on an object
without status, a comparison of mismatched types) counts as "no match": the
expression is the user's statement of what to publish, and a missing field
usually means "not this one". Errors are counted and warned about at most
every ``warn_every`` seconds, so a wrong expression is visible, not silent.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from bridge.delivery.changes import MANAGED_FIELDS
from bridge.errors import ConfigError
from bridge.kube.objects import RawObject
from bridge.kube.rawjson import MANAGED_FIELDS_READ
from bridge.logging import get_logger

log = get_logger(__name__)

VARIABLES = ("object", "oldObject", "type")

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# ``object`` or ``oldObject`` and the field names after it; a name followed by
# ``(`` is a method or macro (``exists``, ``startsWith``), not a field.
_PATH = re.compile(rf"(?<![\w.])(object|oldObject)((?:\s*\.\s*{_IDENT}\b(?!\s*\())*)")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _read_paths(expression: str) -> dict[str, list[tuple[str, ...]] | None]:
    """Per variable, the field paths the expression reads (None: the whole value)."""
    text = _STRING.sub("''", expression)  # a name inside a string literal is not a read
    paths: dict[str, list[tuple[str, ...]] | None] = {"object": [], "oldObject": []}
    for m in _PATH.finditer(text):
        var, rest = m.group(1), m.group(2)
        steps = tuple(s.strip() for s in rest.split(".")[1:] if s.strip())
        found = paths[var]
        if found is None:
            continue
        if not steps:
            paths[var] = None  # used whole: size(object), object['x'], object == null
        else:
            found.append(steps)
    return paths


def _prune(value: Any, paths: list[tuple[str, ...]]) -> Any:
    """Only the subtrees at ``paths`` of a JSON object; what is missing stays missing."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for path in paths:
        src: Any = value
        dst = out
        for i, step in enumerate(path):
            if not isinstance(src, dict) or step not in src:
                break
            src = src[step]
            if i == len(path) - 1 or not isinstance(src, dict):
                dst[step] = src  # the read ends here (or goes into a non-map): keep it whole
                break
            nxt = dst.get(step)
            if not isinstance(nxt, dict):
                nxt = dst[step] = {}
            dst = nxt
    return out


def _where(message: str) -> str:
    """The position and reason from a CEL parser message, on one line."""
    m = re.search(r"<input>:(\d+):(\d+): (.*?)(?:\n|$)", message)
    if m:
        return f"line {m.group(1)}, column {m.group(2)}: {m.group(3).strip()}"
    return " ".join(message.split())


class Filter:
    """A compiled filter expression (compile once, at configuration time)."""

    __slots__ = (
        "_clock",
        "_last_warned",
        "_paths",
        "_program",
        "_since_warned",
        "errors",
        "expression",
        "label",
        "warn_every",
    )

    def __init__(
        self,
        expression: str,
        *,
        label: str = "",
        warn_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.expression = expression
        self.label = label
        self._program = compile_filter(expression)
        self._paths = _read_paths(expression)
        self.errors = 0
        self.warn_every = warn_every
        self._clock = clock
        self._last_warned: float | None = None
        self._since_warned = 0

    def reads(self) -> frozenset[str] | None:
        """The top-level keys of ``object`` and ``oldObject`` the expression reads (None: all)."""
        keys: set[str] = set()
        for var in ("object", "oldObject"):
            paths = self._paths[var]
            if paths is None:
                return None
            keys.update(path[0] for path in paths)
            # The expression's input is parsed values: metadata whole, or anything of
            # managedFields, needs managedFields parsed too.
            if any(p[:2] == MANAGED_FIELDS or p == MANAGED_FIELDS[:1] for p in paths):
                keys.add(MANAGED_FIELDS_READ)
        return frozenset(keys)

    def _view(self, var: str, obj: RawObject | None) -> Any:
        if obj is None:
            return None
        paths = self._paths[var]
        return obj if paths is None else _prune(obj, paths)

    def matches(self, obj: RawObject, old: RawObject | None = None, type: str = "modified") -> bool:
        """Whether the expression holds; an evaluation error is "no match" (counted, warned)."""
        try:
            result = self._program.execute(
                {
                    "object": self._view("object", obj),
                    "oldObject": self._view("oldObject", old),
                    "type": type,
                }
            )
        except Exception as e:  # the binding raises several types; all mean "cannot evaluate"
            self._error(obj, str(e))
            return False
        if not isinstance(result, bool):
            self._error(obj, f"the expression gave {type_name(result)}, not a bool")
            return False
        return result

    def _error(self, obj: RawObject, why: str) -> None:
        self.errors += 1
        self._since_warned += 1
        now = self._clock()
        if self._last_warned is not None and now - self._last_warned < self.warn_every:
            return
        metadata = obj.get("metadata") or {}
        log.warning(
            "filter could not be evaluated; counted as no match",
            resource=self.label,
            object=f"{metadata.get('namespace', '')}/{metadata.get('name', '')}".lstrip("/"),
            error=" ".join(why.split()),
            errors_since_last_warning=self._since_warned,
        )
        self._last_warned, self._since_warned = now, 0


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def compile_filter(expression: str) -> Any:
    """The compiled program, or ConfigError with the position and reason on one line."""
    if not expression.strip():
        raise ConfigError("the filter expression is empty")
    # Imported here: a native extension that a bridge without filters never loads.
    import cel

    try:
        program = cel.compile(expression)
    except Exception as e:
        raise ConfigError(f"does not compile: {_where(str(e))}") from None
    unknown = sorted(set(program.variables()) - set(VARIABLES) - _bound_names(expression))
    if unknown:
        raise ConfigError(
            f"unknown variable {unknown[0]!r} (the filter sees object, oldObject and type)"
        )
    return program


def _bound_names(expression: str) -> set[str]:
    """Names bound by macros (``exists(c, …)``, ``map(x, …)``): not free variables."""
    return set(re.findall(rf"\.\s*{_IDENT}\s*\(\s*({_IDENT})\s*,", expression))
