"""The syntax of label and field selectors, checked the way the API server parses them.

Used at configuration time, so a typo fails ``config validate`` with one line
instead of a LIST the server rejects at run time. Only syntax is checked here:
which fields a kind can be selected by is the server's to say (a 400 at run
time, which the bridge reports and stops on).

Label selectors follow ``k8s.io/apimachinery/pkg/labels``: comma-separated
requirements ``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, ``k>1``, ``k<1``; a key is a qualified name with an optional
DNS-subdomain prefix (``example.com/tier``), a value a label value.

Field selectors follow ``k8s.io/apimachinery/pkg/fields``: comma-separated
``k=v``, ``k==v``, ``k!=v``; ``\\,``, ``\\=`` and ``\\\\`` escape in values.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_INTEGER = re.compile(r"^-?[0-9]+$")

# Characters that end an identifier in a label selector (apimachinery's lexer).
_SPECIAL = frozenset("!=,()<> \t\n\r\f\v")
_OPERATORS = ("!=", "==", "=", "<", ">")


class SelectorError(ValueError):
    """A selector that the API server would not parse; the message says where."""


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "(),":
            out.append(ch)
            i += 1
        elif ch in "!=<>":
            two = text[i : i + 2]
            if two in ("!=", "=="):
                out.append(two)
                i += 2
            else:
                out.append(ch)
                i += 1
        else:
            j = i
            while j < n and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _is_identifier(token: str | None) -> bool:
    return token is not None and token not in ("(", ")", ",", "!", *_OPERATORS)


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and not (prefix and len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        raise SelectorError(f"key {key!r}: the prefix must be a DNS subdomain (example.com)")
    if not (name and len(name) <= 63 and _NAME.match(name)):
        raise SelectorError(
            f"key {key!r}: a name of at most 63 letters, digits, '-', '_' or '.',"
            " starting and ending with a letter or digit"
        )


def _check_value(value: str) -> None:
    if value and not (len(value) <= 63 and _NAME.match(value)):
        raise SelectorError(
            f"value {value!r}: at most 63 letters, digits, '-', '_' or '.',"
            " starting and ending with a letter or digit"
        )


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        # Each requirement in one spelling, to tell equal selectors apart from different ones.
        self.requirements: list[str] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def parse(self) -> None:
        while self.peek() is not None:
            self.requirement()
            token = self.take()
            if token is None:
                return
            if token != ",":
                raise SelectorError(f"found {token!r}, expected ','")
            if self.peek() is None:
                raise SelectorError("a ',' with no requirement after it")

    def requirement(self) -> None:
        if self.peek() == "!":
            self.take()
            key = self.take()
            if not _is_identifier(key):
                raise SelectorError(f"found {_shown(key)} after '!', expected a key")
            assert key is not None
            _check_key(key)
            self.requirements.append("!" + key)
            return
        key = self.take()
        if not _is_identifier(key) or key in ("in", "notin"):
            raise SelectorError(f"found {_shown(key)}, expected a key")
        assert key is not None
        _check_key(key)
        op = self.peek()
        if op is None or op == ",":
            self.requirements.append(key)  # "k": the key exists
            return
        self.take()
        if op in ("in", "notin"):
            values = ",".join(sorted(self.value_set(op)))
            self.requirements.append(f"{key} {op} ({values})")
        elif op in ("=", "==", "!="):
            value = self.peek()
            if value is None or value == ",":
                value = ""
            elif not _is_identifier(value):
                raise SelectorError(f"found {value!r} after {op!r}, expected a value")
            else:
                self.take()
                _check_value(value)
            self.requirements.append(key + ("!=" if op == "!=" else "=") + value)
        elif op in ("<", ">"):
            value = self.take()
            if value is None or not _INTEGER.match(value):
                raise SelectorError(f"found {_shown(value)} after {op!r}, expected an integer")
            self.requirements.append(f"{key}{op}{int(value)}")
        else:
            raise SelectorError(f"found {op!r} after {key!r}, expected an operator")

    def value_set(self, op: str) -> set[str]:
        if self.take() != "(":
            raise SelectorError(f"{op!r} needs a parenthesised list of values")
        values: set[str] = set()
        expect_value = True
        while True:
            token = self.take()
            if token is None:
                raise SelectorError(f"the {op!r} list is not closed with ')'")
            if token == ")":
                break
            if token == ",":
                expect_value = True
                continue
            if not expect_value or not _is_identifier(token):
                raise SelectorError(f"found {token!r} in the {op!r} list, expected a value")
            _check_value(token)
            values.add(token)
            expect_value = False
        if not values:
            raise SelectorError(f"the {op!r} list has no values")
        return values


def _shown(token: str | None) -> str:
    return "the end" if token is None else repr(token)


def normalize_label_selector(text: str) -> str:
    """``text`` in one spelling (order, spaces and ``==`` do not matter); raises
    ``SelectorError`` if the API server would not parse it as a label selector."""
    parser = _LabelParser(text)
    parser.parse()
    return ",".join(sorted(set(parser.requirements)))


def _field_terms(text: str) -> list[str]:
    # apimachinery's splitTerms: commas split, except right after a backslash.
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _field_term(term: str) -> tuple[str, str, str]:
    # apimachinery's splitTerm: the first operator splits, with no regard to escapes.
    for i in range(len(term)):
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    raise SelectorError(f"{term!r} has no '=', '==' or '!='")


def _check_field_value(term: str, value: str) -> None:
    # apimachinery's UnescapeValue.
    escaped = False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"{term!r}: invalid escape '\\{ch}'")
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise SelectorError(f"{term!r}: a {ch!r} in a value must be escaped as '\\{ch}'")
    if escaped:
        raise SelectorError(f"{term!r} ends in an unfinished '\\' escape")


def normalize_field_selector(text: str) -> str:
    """``text`` in one spelling (order and ``==`` do not matter); raises ``SelectorError``
    if the API server would not parse it as a field selector."""
    terms: set[str] = set()
    for term in _field_terms(text):
        if not term:
            continue
        key, op, value = _field_term(term)
        if not key or any(ch.isspace() for ch in key):
            raise SelectorError(f"{term!r} needs a field name (no spaces) before its operator")
        _check_field_value(term, value)
        terms.add(key + ("!=" if op == "!=" else "=") + value)
    return ",".join(sorted(terms))
