"""Routes: which of ``sink.routes`` an event goes to, decided once when it is built.

Each route has a CEL expression (``when``) over the same variables as a filter
(``object``, ``oldObject``, ``type``; bridge/delivery/filters.py compiles and
evaluates it, reading only the fields it names). ``routing: first`` takes the
first route whose expression holds, ``all`` every one; when none holds the
event goes to the sink's default destination (its topic, or its subject under
``k8s.``). The decision travels on the event (``Event.routes``, route names),
so the sink only looks the names up: sinks never evaluate anything.

An evaluation error counts as "does not hold" for that route, as for a filter
(counted and warned about, the route named).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from bridge.delivery.filters import Filter
from bridge.kube.objects import RawObject

Routing = Literal["first", "all"]


class Router:
    """The compiled routes of one resource (compile once, at configuration time)."""

    __slots__ = ("_filters", "_names", "mode")

    def __init__(
        self, routes: Sequence[tuple[str, str]], mode: Routing = "first", *, label: str = ""
    ) -> None:
        """``routes``: (name, CEL expression), in the order they are tried."""
        self.mode = mode
        self._names = tuple(name for name, _ in routes)
        self._filters = tuple(
            Filter(when, label=f"{label} route {name}".strip()) for name, when in routes
        )

    @property
    def errors(self) -> int:
        """Evaluations that failed (each counted as "does not hold") since start."""
        return sum(f.errors for f in self._filters)

    def reads(self) -> frozenset[str] | None:
        """The top-level keys of objects the expressions read (None: all of them)."""
        keys: frozenset[str] = frozenset()
        for f in self._filters:
            reads = f.reads()
            if reads is None:
                return None
            keys |= reads
        return keys

    def decide(self, obj: RawObject, old: RawObject | None, type: str) -> tuple[str, ...]:
        """The names of the routes ``obj``'s event goes to; () is the default route."""
        if self.mode == "first":
            for name, f in zip(self._names, self._filters, strict=True):
                if f.matches(obj, old, type):
                    return (name,)
            return ()
        return tuple(
            name
            for name, f in zip(self._names, self._filters, strict=True)
            if f.matches(obj, old, type)
        )
