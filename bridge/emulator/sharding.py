"""``shardSelector`` parsed and applied the way kube-apiserver 1.37 does (KEP-5866).

The server parses the selector as CEL (k8s.io/apiserver pkg/sharding/parser.go)
and walks the tree: only ``shardRange(field, 'start', 'end')`` calls joined by
``||``, all on the same field, each bound a 0x-prefixed 16-digit lowercase hex
string (or ``'0x10000000000000000'``, 2**64). Its errors are plain Go errors the
handler does not translate: HTTP 500, a Status without reason, the message
``invalid shard selector: ...``, on LIST and WATCH alike. This parses that
subset by hand with the same checks in the same order and the same words; CEL
syntax errors have the server's prefix but not cel-go's exact text.

Accepted selectors are echoed in their canonical spelling
(``shardSelector.String()``), as the server writes ``metadata.shardInfo``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from bridge.emulator.selectors import Matcher
from bridge.emulator.status import status
from bridge.errors import ApiStatusError, status_error
from bridge.kube.sharding import fnv1a64

_FIELDS = {"object.metadata.uid": "uid", "object.metadata.namespace": "namespace"}
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<num>-?\d+(?:\.\d+)?u?)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>\|\||&&|==|!=|[().,])
    )""",
    re.X,
)


def _q(value: str) -> str:
    """Go's %q for the strings these messages quote."""
    return json.dumps(value)


def _invalid(message: str) -> ApiStatusError:
    body = status(500, "", f"invalid shard selector: {message}")
    body.pop("reason")
    return status_error(body)


def _syntax() -> ApiStatusError:
    return _invalid("CEL parse error: Syntax error: mismatched input")


@dataclass(frozen=True, slots=True)
class _Range:
    key: str
    start: str
    end: str


@dataclass(frozen=True, slots=True)
class ShardSelector:
    """A parsed selector: the echo, and which objects it selects."""

    ranges: tuple[_Range, ...]

    @property
    def field(self) -> str:
        return _FIELDS[self.ranges[0].key]

    def echo(self) -> str:
        return " || ".join(f"shardRange({r.key}, '{r.start}', '{r.end}')" for r in self.ranges)

    def matcher(self) -> Matcher:
        field = self.field
        bounds = [(int(r.start, 16), int(r.end, 16)) for r in self.ranges]

        def matches(obj: dict[str, Any]) -> bool:
            value = (obj.get("metadata") or {}).get(field) or ""
            h = fnv1a64(value.encode())
            return any(start <= h < end for start, end in bounds)

        return matches


# A parsed argument: ("path", "object.metadata.uid") | ("str", "0x..") | ("num", "int64").
_Arg = tuple[str, str]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise _syntax()
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise _syntax()
        self.i += 1
        return tok

    def parse(self) -> list[_Range]:
        # ``a || b`` and ``a && b`` bind as in CEL; && makes the whole tree unsupported
        # (the walk meets its call first when it is the root), so checked after syntax.
        terms: list[list[tuple[str, list[_Arg]]]] = [[self.primary()]]
        while (tok := self.peek()) is not None:
            if tok[1] == "||":
                self.take()
                terms.append([self.primary()])
            elif tok[1] == "&&":
                self.take()
                terms[-1].append(self.primary())
            else:
                raise _syntax()
        ranges: list[_Range] = []
        for term in terms:
            if len(term) > 1:
                raise _invalid('unsupported function "_&&_"; only shardRange() and || are allowed')
            name, args = term[0]
            if name != "shardRange":
                if name.startswith("."):  # a bare identifier or field path
                    raise _invalid(
                        "unexpected expression kind "
                        f"{'SelectKind' if '.' in name[1:] else 'IdentKind'}; "
                        "expected shardRange() call or || operator"
                    )
                raise _invalid(
                    f"unsupported function {_q(name)}; only shardRange() and || are allowed"
                )
            ranges.append(_shard_range(args))
        for r in ranges[1:]:
            if r.key != ranges[0].key:
                raise _invalid(
                    f"all shard ranges must use the same field, got {_q(ranges[0].key)} "
                    f"and {_q(r.key)}"
                )
        return ranges

    def primary(self) -> tuple[str, list[_Arg]]:
        """A call ``name(args)``, or a bare path (named with a leading dot)."""
        if (tok := self.peek()) is not None and tok[1] == "(":
            self.take()
            inner = self.primary()
            self.take(")")
            return inner
        kind, value = self.take()
        if kind != "ident":
            raise _syntax()
        path = self.path(value)
        if (tok := self.peek()) is None or tok[1] != "(":
            return "." + path, []
        self.take("(")
        args: list[_Arg] = []
        if (tok := self.peek()) is not None and tok[1] == ")":
            self.take()
            return path, args
        while True:
            args.append(self.arg())
            kind, value = self.take()
            if value == ")":
                return path, args
            if value != ",":
                raise _syntax()

    def path(self, first: str) -> str:
        parts = [first]
        while (tok := self.peek()) is not None and tok[1] == ".":
            self.take()
            kind, value = self.take()
            if kind != "ident":
                raise _syntax()
            parts.append(value)
        return ".".join(parts)

    def arg(self) -> _Arg:
        kind, value = self.take()
        if kind == "str":
            return ("str", value[1:-1])
        if kind == "num":
            return (
                "num",
                "uint64" if value.endswith("u") else "float64" if "." in value else "int64",
            )
        if kind == "ident":
            return ("path", self.path(value))
        raise _syntax()


def _shard_range(args: list[_Arg]) -> _Range:
    if len(args) != 3:
        raise _invalid(f"shardRange() requires exactly 3 arguments, got {len(args)}")
    kind, path = args[0]
    if kind != "path":
        raise _invalid(
            "shardRange() first argument: expected field path (e.g. object.metadata.uid), "
            "got expression kind LiteralKind"
        )
    if path not in _FIELDS:
        raise _invalid(
            f"unsupported field path {_q(path)}; supported: object.metadata.uid, "
            "object.metadata.namespace"
        )
    start = _hex(args[1], "hexStart")
    end = _hex(args[2], "hexEnd")
    if not _hex_less(start, end):
        raise _invalid(f"shard range start {start} must be less than end {end}")
    return _Range(path, start, end)


def _hex(arg: _Arg, name: str) -> str:
    kind, s = arg
    if kind == "path":
        raise _invalid(
            f"{name} must be a string literal (e.g. '0xff'), got expression kind "
            f"{'SelectKind' if '.' in s else 'IdentKind'}"
        )
    if kind == "num":
        raise _invalid(f"{name} must be a string literal, got {s}")
    if not s.startswith("0x"):
        raise _invalid(f"{name} must have '0x' prefix, got {_q(s)}")
    digits = s[2:]
    if not digits:
        raise _invalid(f"{name}: hex value is required after '0x'")
    if len(digits) > 17:
        raise _invalid(f"{name}: hex value too long ({len(digits)} chars, max 17): {_q(digits)}")
    for c in digits:
        if c not in "0123456789abcdef":
            raise _invalid(f"{name}: invalid hex character {_q(c)} in {_q(s)}")
    if len(digits) == 17:
        if s != "0x10000000000000000":
            raise _invalid(
                f"{name}: 17-digit hex value must be '0x10000000000000000' (2^64), got {_q(s)}"
            )
    elif len(digits) != 16:
        padded = "0x" + "0" * (16 - len(digits)) + digits
        raise _invalid(
            f"{name} must be a 0x-prefixed 16-digit hex value, got {_q(s)} "
            f"(did you mean {_q(padded)}?)"
        )
    return s


def _hex_less(a: str, b: str) -> bool:
    return len(a) < len(b) if len(a) != len(b) else a < b


def parse_shard_selector(text: str | None) -> ShardSelector | None:
    """The selector of a request's ``shardSelector``; None when absent or empty (the
    server treats ``shardSelector=`` as no parameter). Raises the server's 500."""
    if not text:
        return None
    if not text.strip():
        raise _invalid(
            "empty shard selector is not allowed; omit the parameter for unfiltered lists"
        )
    return ShardSelector(tuple(_Parser(text.strip()).parse()))
