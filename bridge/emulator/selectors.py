"""Label and field selectors, parsed the way the API server parses them.

A parse failure raises ``BadRequestError`` with a message like the server's, so
the HTTP layer answers 400 with a Status.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from bridge.emulator.status import bad_request

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\((.*)\)\s*$")
_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _label_requirement(text: str) -> Callable[[dict[str, str]], bool]:
    m = _SET_RE.match(text)
    if m:
        key, op, raw = m.group(1), m.group(2), m.group(3)
        values = frozenset(v.strip() for v in raw.split(",") if v.strip())
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    m = _OP_RE.match(text)
    if m:
        key, op, value = m.group(1), m.group(2), m.group(3)
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    m = _EXISTS_RE.match(text)
    if m:
        negate, key = m.group(1) == "!", m.group(2)
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise bad_request(f'unable to parse requirement: "{text.strip()}"')


def parse_label_selector(text: str | None) -> Matcher | None:
    """A predicate on whole objects, or None when the selector selects everything."""
    if not text or not text.strip():
        return None
    reqs = [_label_requirement(part) for part in _split_top_level(text)]

    def matches(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(req(labels) for req in reqs)

    return matches


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    return str(cur)


def parse_field_selector(text: str | None, allowed: tuple[str, ...]) -> Matcher | None:
    """Field selector over ``metadata.name``, ``metadata.namespace`` and ``allowed`` paths."""
    if not text or not text.strip():
        return None
    reqs: list[tuple[str, bool, str]] = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _OP_RE.match(part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        path, op, value = m.group(1), m.group(2), m.group(3)
        if path not in ("metadata.name", "metadata.namespace", *allowed):
            if allowed:
                # A kind with fields of its own (k8s.io/kubernetes pkg/apis/core/v1/conversion.go).
                raise bad_request(f"field label not supported: {path}")
            # Any other kind (k8s.io/apimachinery pkg/runtime/conversion.go).
            raise bad_request(
                f'"{path}" is not a known field selector: only "metadata.name", '
                '"metadata.namespace"'
            )
        reqs.append((path, op == "!=", value))

    def matches(obj: dict[str, Any]) -> bool:
        for path, negate, value in reqs:
            if (field_value(obj, path) == value) == negate:
                return False
        return True

    return matches


def combine(*matchers: Matcher | None) -> Matcher | None:
    active = [m for m in matchers if m is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]
    return lambda obj: all(m(obj) for m in active)
