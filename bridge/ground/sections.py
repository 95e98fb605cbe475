"""Config sections: typed keyword classes that validate what they are given.

The bridge's and the mirror's settings are trees of ``Section`` classes. A field is
an annotated class attribute, ``name: int = field(default=1, gt=0, description=...)``;
its YAML spelling is the camelCase of the name (``key=`` names another), and both
spellings are accepted. Building a section, from keywords in code or from a parsed
YAML mapping (``validate``), converts what is loose (``"10"`` for an int, from the
environment), checks types, bounds and the section's own validators, and raises one
``SectionError`` listing every problem with where it is, for the caller to word.

What it replaces, pydantic, cost an idle bridge ~8-10 MiB of modules for a few
dozen keys read once at start; this is only what those keys use: str, int, float,
bool, None, ``Literal``, ``list``, ``dict[str, str]``, ``SecretStr`` and sections.
"""

from __future__ import annotations

import difflib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Union, dataclass_transform

_S = TypeVar("_S", bound="Section")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
# What a conversion returns when it failed (the problem is in the error list).
_FAILED: Any = _Missing()


class SecretStr:
    """A string that does not show itself in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"SecretStr({str(self)!r})"

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class KeyedError(ValueError):
    """A validator's problem whose message names its key(s) itself."""


class EntryError(ValueError):
    """A section validator's problem whose message starts with a key inside the section."""


class SectionError(ValueError):
    """Every problem found building a section: dicts of ``loc`` (the path in YAML
    spelling), ``type``, ``msg`` and ``input``."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self._errors = errors

    def errors(self) -> list[dict[str, Any]]:
        return list(self._errors)

    def __str__(self) -> str:
        return "; ".join(
            f"{dotted(e['loc'])}: {e['msg']}" if e["loc"] else str(e["msg"]) for e in self._errors
        )


@dataclass(frozen=True)
class _Spec:
    """What ``field()`` leaves in the class body until the class's fields are read."""

    default: Any = MISSING
    default_factory: Callable[[], Any] | None = None
    key: str | None = None
    description: str | None = None
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    min_length: int | None = None
    pattern: str | None = None
    deprecated: bool = False


@dataclass(frozen=True, kw_only=True)
class Field(_Spec):
    """A field as read from its class: the spec, its Python name, YAML spelling and type."""

    name: str
    alias: str
    annotation: Any

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.default_factory is None

    def get_default(self) -> Any:
        return self.default_factory() if self.default_factory is not None else self.default


def field(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    key: str | None = None,
    description: str | None = None,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    pattern: str | None = None,
    deprecated: bool = False,
) -> Any:
    """A field's default, bounds and documentation; ``key`` is its YAML spelling
    when that is not the camelCase of its name."""
    return _Spec(
        default, default_factory, key, description, gt, ge, le, min_length, pattern, deprecated
    )


def to_camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


_F = TypeVar("_F")


def validates(*names: str, mode: Literal["before", "after"] = "after") -> Callable[[_F], _F]:
    """Mark a classmethod ``(cls, value, data)`` as a validator of the fields ``names``.

    ``data`` holds the fields already valid, earlier in the class. ``before`` sees
    the raw input, ``after`` the converted value; either returns the value to keep
    or raises ``ValueError`` (worded to follow the value), ``KeyedError`` or ``EntryError``."""

    def mark(method: _F) -> _F:
        func: Any = getattr(method, "__func__", method)
        func.__section_validates__ = (names, mode)
        return method

    return mark


def check(method: _F) -> _F:
    """Mark a method ``(self)`` to run once every field is valid: the section's
    cross-field rules. It raises ``KeyedError`` or ``EntryError``."""
    method.__section_check__ = True  # type: ignore[attr-defined]
    return method


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
class Section:
    """A settings section: keyword-built, validated, unknown keys refused."""

    # Filled per class on first use (the annotations name classes defined after it).
    __section_fields__: ClassVar[dict[str, Field]]
    __section_validators__: ClassVar[dict[str, list[tuple[str, str, bool]]]]
    __section_checks__: ClassVar[list[str]]

    def __init__(self, **data: Any) -> None:
        errors: list[dict[str, Any]] = []
        _fill(self, data, (), errors)
        if errors:
            raise SectionError(errors)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        names = fields_of(type(self))
        return all(getattr(self, n) == getattr(other, n) for n in names)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dicts it came from

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in fields_of(type(self)))
        return f"{type(self).__name__}({inner})"


def fields_of(cls: type[Section]) -> dict[str, Field]:
    """The fields of ``cls`` by Python name, in class order."""
    found = cls.__dict__.get("__section_fields__")
    if found is None:
        _read_class(cls)
        found = cls.__dict__["__section_fields__"]
    return found


def _read_class(cls: type[Section]) -> None:
    hints = typing.get_type_hints(cls)
    out: dict[str, Field] = {}
    for name in inspect.get_annotations(cls):
        annotation = hints[name]
        if name.startswith("__") or typing.get_origin(annotation) is typing.ClassVar:
            continue
        spec = cls.__dict__.get(name, MISSING)
        if not isinstance(spec, _Spec):
            spec = _Spec(default=spec)
        kw = {k: getattr(spec, k) for k in _Spec.__dataclass_fields__}
        out[name] = Field(name=name, alias=spec.key or to_camel(name), annotation=annotation, **kw)
    validators: dict[str, list[tuple[str, str, bool]]] = {}
    checks: list[str] = []
    for attr, value in cls.__dict__.items():
        func = getattr(value, "__func__", value)
        marked = getattr(func, "__section_validates__", None)
        if marked is not None:
            # (cls, value) or (cls, value, data): the fields valid so far.
            takes_data = len(inspect.signature(func).parameters) > 2
            for name in marked[0]:
                validators.setdefault(name, []).append((attr, marked[1], takes_data))
        if getattr(func, "__section_check__", False):
            checks.append(attr)
    cls.__section_validators__ = validators
    cls.__section_checks__ = checks
    cls.__section_fields__ = out


def validate(cls: type[_S], data: Any) -> _S:
    """``cls`` built from a mapping in YAML (or Python) spelling; raises ``SectionError``."""
    errors: list[dict[str, Any]] = []
    out = _convert_section(cls, data, (), errors)
    if errors:
        raise SectionError(errors)
    return out


def fields_set(section: Section) -> frozenset[str]:
    """The Python names of the fields given, not defaulted."""
    given: frozenset[str] = section.__dict__.get("_section_given", frozenset())
    return given


def replace(section: _S, **changes: Any) -> _S:
    """A shallow copy of ``section`` with ``changes`` (Python names), not validated
    again: for values the caller derived from valid ones (a discovered kind)."""
    unknown = set(changes) - set(fields_of(type(section)))
    if unknown:
        raise TypeError(f"{type(section).__name__} has no field {', '.join(sorted(unknown))}")
    copy = type(section).__new__(type(section))
    copy.__dict__.update(section.__dict__, **changes)
    copy.__dict__["_section_given"] = fields_set(section) | set(changes)
    return copy


def _convert_section(cls: type[Section], data: Any, loc: tuple[Any, ...], errors: list[Any]) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        _error(
            errors,
            loc,
            "model_type",
            f"Input should be a valid dictionary or instance of {cls.__name__}",
            data,
        )
        return _FAILED
    obj = cls.__new__(cls)
    before = len(errors)
    _fill(obj, data, loc, errors)
    return obj if len(errors) == before else _FAILED


def _fill(obj: Section, data: Mapping[str, Any], loc: tuple[Any, ...], errors: list[Any]) -> None:
    cls = type(obj)
    fields = fields_of(cls)
    validators = cls.__section_validators__
    known: set[Any] = set()
    valid: dict[str, Any] = {}
    given: set[str] = set()
    before = len(errors)
    for name, f in fields.items():
        key = f.alias if f.alias in data else name
        if key in data:
            known.add(key)
            given.add(name)
            raw = data[key]
        elif f.required:
            _error(errors, (*loc, f.alias), "missing", "Field required", dict(data))
            continue
        else:
            raw = f.get_default()
        value = _field_value(cls, f, raw, valid, validators.get(name, ()), (*loc, f.alias), errors)
        if value is not _FAILED:
            valid[name] = value
    # Both spellings of one key: the YAML one wins, the other is not unknown.
    known.update(n for n in fields if n in data)
    for key in data:
        if key not in known:
            _error(
                errors, (*loc, key), "extra_forbidden", "Extra inputs are not permitted", data[key]
            )
    if len(errors) > before:
        return
    obj.__dict__.update(valid)
    obj.__dict__["_section_given"] = frozenset(given)
    for attr in cls.__section_checks__:
        try:
            getattr(obj, attr)()
        except ValueError as exc:
            _raised(errors, loc, exc, dict(data))
            return


def _field_value(
    cls: type[Section],
    f: Field,
    raw: Any,
    valid: Mapping[str, Any],
    validators: Any,
    loc: tuple[Any, ...],
    errors: list[Any],
) -> Any:
    value = _run_validators(cls, "before", raw, raw, valid, validators, loc, errors)
    if value is not _FAILED:
        value = _convert(f.annotation, f, value, loc, errors)
    if value is not _FAILED:
        value = _run_validators(cls, "after", value, raw, valid, validators, loc, errors)
    return value


def _run_validators(
    cls: type[Section],
    mode: str,
    value: Any,
    raw: Any,
    valid: Mapping[str, Any],
    validators: Any,
    loc: tuple[Any, ...],
    errors: list[Any],
) -> Any:
    try:
        for attr, when, takes_data in validators:
            if when == mode:
                method = getattr(cls, attr)
                value = method(value, valid) if takes_data else method(value)
    except ValueError as exc:
        _raised(errors, loc, exc, raw)
        return _FAILED
    return value


def _raised(errors: list[Any], loc: tuple[Any, ...], exc: ValueError, value: Any) -> None:
    if isinstance(exc, SectionError):
        errors.extend({**e, "loc": (*loc, *e["loc"])} for e in exc.errors())
    elif isinstance(exc, KeyedError):
        _error(errors, loc, "keyed_error", str(exc), value)
    elif isinstance(exc, EntryError):
        _error(errors, loc, "resource_error", str(exc), value)
    else:
        _error(errors, loc, "value_error", str(exc), value)


def _error(errors: list[Any], loc: tuple[Any, ...], kind: str, msg: str, value: Any) -> None:
    errors.append({"loc": loc, "type": kind, "msg": msg, "input": value})


def _convert(annotation: Any, f: Field, value: Any, loc: tuple[Any, ...], errors: list[Any]) -> Any:
    """``value`` as ``annotation`` wants it, within ``f``'s bounds; or _FAILED."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        # Only optional fields: X | None, with X one type (or one Literal).
        return _convert(rest[0], f, value, loc, errors)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        shown = [repr(c) for c in choices]
        expected = " or ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
        _error(errors, loc, "literal_error", f"Input should be {expected}", value)
        return _FAILED
    if origin is list:
        if not isinstance(value, list | tuple):
            _error(errors, loc, "list_type", "Input should be a valid list", value)
            return _FAILED
        (item_type,) = typing.get_args(annotation)
        bare = Field(name=f.name, alias=f.alias, annotation=item_type)
        before = len(errors)
        items = [_convert(item_type, bare, v, (*loc, i), errors) for i, v in enumerate(value)]
        if len(errors) > before:
            return _FAILED
        if f.min_length is not None and len(items) < f.min_length:
            s = "" if f.min_length == 1 else "s"
            msg = f"List should have at least {f.min_length} item{s} after validation, not {len(items)}"
            _error(errors, loc, "too_short", msg, value)
            return _FAILED
        return items
    if origin is dict:
        if not isinstance(value, Mapping):
            _error(errors, loc, "dict_type", "Input should be a valid dictionary", value)
            return _FAILED
        bare = Field(name=f.name, alias=f.alias, annotation=str)
        before = len(errors)
        out = {
            _convert(str, bare, k, (*loc, k), errors): _convert(str, bare, v, (*loc, k), errors)
            for k, v in value.items()
        }
        return out if len(errors) == before else _FAILED
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return _convert_section(annotation, value, loc, errors)
    converter = _SCALARS.get(annotation)
    if converter is None:
        raise TypeError(f"{f.name}: a section field cannot be {annotation!r}")
    try:
        out = converter(value)
    except _Bad as bad:
        _error(errors, loc, bad.kind, str(bad), value)
        return _FAILED
    problem = _bounds(f, out)
    if problem is not None:
        _error(errors, loc, problem[0], problem[1], value)
        return _FAILED
    return out


class _Bad(ValueError):
    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Bad("string_type", "Input should be a valid string")


def _to_secret(value: Any) -> SecretStr:
    return value if isinstance(value, SecretStr) else SecretStr(_to_str(value))


def _to_int(value: Any) -> int:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise _Bad(
            "int_from_float", "Input should be a valid integer, got a number with a fractional part"
        )
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
        raise _Bad(
            "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
        )
    raise _Bad("int_type", "Input should be a valid integer")


def _to_float(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
        raise _Bad(
            "float_parsing", "Input should be a valid number, unable to parse string as a number"
        )
    raise _Bad("float_type", "Input should be a valid number")


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
        raise _Bad("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise _Bad("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    raise _Bad("bool_type", "Input should be a valid boolean")


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    str: _to_str,
    int: _to_int,
    float: _to_float,
    bool: _to_bool,
    SecretStr: _to_secret,
}


def _bounds(f: Field, value: Any) -> tuple[str, str] | None:
    if isinstance(value, str):
        if f.min_length is not None and len(value) < f.min_length:
            s = "" if f.min_length == 1 else "s"
            return "string_too_short", f"String should have at least {f.min_length} character{s}"
        if f.pattern is not None and not re.search(f.pattern, value):
            return "string_pattern_mismatch", f"String should match pattern '{f.pattern}'"
        return None
    if not isinstance(value, int | float):
        return None
    if f.gt is not None and not value > f.gt:
        return "greater_than", f"Input should be greater than {f.gt:g}"
    if f.ge is not None and not value >= f.ge:
        return "greater_than_equal", f"Input should be greater than or equal to {f.ge:g}"
    if f.le is not None and not value <= f.le:
        return "less_than_equal", f"Input should be less than or equal to {f.le:g}"
    return None


# --- walking the classes: keys in any spelling, JSON Schema ----------------------


def section_in(annotation: Any) -> tuple[type[Section] | None, bool]:
    """(section class, is a list of it) found in a field annotation, if any."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_in(arg)
            if found[0] is not None:
                return found
        return None, False
    if origin is list:
        args = typing.get_args(annotation)
        inner = section_in(args[0])[0] if args else None
        return inner, inner is not None
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation, False
    return None, False


def is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(is_list(a) for a in typing.get_args(annotation))
    return origin is list


def find_field(cls: type[Section], key: str, *, loose: bool = False) -> Field | None:
    """The field ``key`` (camelCase or snake_case) names in ``cls``.

    ``loose`` also ignores case and underscores, for environment variable names."""
    fields = fields_of(cls).values()
    for f in fields:
        if key in (f.name, f.alias):
            return f
    if loose:
        wanted = key.lower().replace("_", "")
        for f in fields:
            if wanted in (f.name.lower().replace("_", ""), f.alias.lower()):
                return f
    return None


def normalize(cls: type[Section], data: Any) -> Any:
    """``data`` with every known key in YAML spelling (unknown ones left for validation)."""
    if not isinstance(data, dict):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        found = find_field(cls, key) if isinstance(key, str) else None
        if found is None:
            out[key] = value
            continue
        sub, many = section_in(found.annotation)
        if sub is not None and many and isinstance(value, list):
            value = [normalize(sub, item) for item in value]
        elif sub is not None and many and isinstance(value, dict):
            value = {k: normalize(sub, v) for k, v in value.items()}  # indexed, from env
        elif sub is not None:
            value = normalize(sub, value)
        out[found.alias] = value
    return out


def did_you_mean(root: type[Section], loc: tuple[Any, ...]) -> str:
    """`` (did you mean X?)`` for the unknown key at ``loc``, when one is close."""
    section: type[Section] | None = root
    for part in loc[:-1]:
        if isinstance(part, int) or section is None:
            continue
        found = find_field(section, str(part))
        section = section_in(found.annotation)[0] if found else None
    if section is None or not isinstance(loc[-1], str):
        return ""
    names = [f.alias for f in fields_of(section).values()]
    close = difflib.get_close_matches(loc[-1], names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def json_schema(cls: type[Section], title: str | None = None) -> dict[str, Any]:
    """JSON Schema of ``cls`` in YAML spelling, sections under ``$defs``."""
    defs: dict[str, Any] = {}
    schema = _object_schema(cls, defs)
    if defs:  # first, where a reader of the printed schema looks them up
        schema = {"$defs": dict(sorted(defs.items())), **schema}
    if title is not None:
        schema["title"] = title
    return schema


def _object_schema(cls: type[Section], defs: dict[str, Any]) -> dict[str, Any]:
    properties = {f.alias: _field_schema(f, defs) for f in fields_of(cls).values()}
    out: dict[str, Any] = {"additionalProperties": False, "properties": properties}
    required = [f.alias for f in fields_of(cls).values() if f.required]
    if required:
        out["required"] = required
    if cls.__doc__:
        out["description"] = inspect.cleandoc(cls.__doc__)
    out.update(title=cls.__name__, type="object")
    return out


def _field_schema(f: Field, defs: dict[str, Any]) -> dict[str, Any]:
    out = _type_schema(f.annotation, f, defs)
    sub, many = section_in(f.annotation)
    if sub is None or many:  # a section's own schema carries its title
        out["title"] = f.alias.title()
    if f.default is not MISSING:
        default = f.default
        out["default"] = default.get_secret_value() if isinstance(default, SecretStr) else default
    if f.description is not None:
        out["description"] = f.description
    if f.deprecated:
        out["deprecated"] = True
    return out


def _type_schema(annotation: Any, f: Field | None, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = typing.get_args(annotation)
        return {"anyOf": [_type_schema(a, f if a is not type(None) else None, defs) for a in args]}
    if origin is Literal:
        choices = list(typing.get_args(annotation))
        out: dict[str, Any] = {"enum": choices}
        kinds = {type(c) for c in choices}
        if kinds == {str}:
            out["type"] = "string"
        elif kinds == {int}:
            out["type"] = "integer"
        return out
    if origin is list:
        out = {"items": _type_schema(typing.get_args(annotation)[0], None, defs), "type": "array"}
        if f is not None and f.min_length is not None:
            out["minItems"] = f.min_length
        return out
    if origin is dict:
        value_type = typing.get_args(annotation)[1]
        return {"additionalProperties": _type_schema(value_type, None, defs), "type": "object"}
    if annotation is type(None):
        return {"type": "null"}
    if isinstance(annotation, type) and issubclass(annotation, Section):
        if annotation.__name__ not in defs:
            defs[annotation.__name__] = {}  # a placeholder against cycles
            defs[annotation.__name__] = _object_schema(annotation, defs)
        return {"$ref": f"#/$defs/{annotation.__name__}"}
    if annotation is SecretStr:
        return {"format": "password", "type": "string", "writeOnly": True}
    out = {"type": _JSON_TYPES[annotation]}
    if f is not None:
        for attr, key in _BOUND_KEYWORDS:
            bound = getattr(f, attr)
            if bound is not None:
                out[key] = bound
    return out


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_BOUND_KEYWORDS = (
    ("gt", "exclusiveMinimum"),
    ("ge", "minimum"),
    ("le", "maximum"),
    ("min_length", "minLength"),
    ("pattern", "pattern"),
)
