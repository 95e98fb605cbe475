"""Objects decoded only as far as someone reads them; the rest kept as the API server's bytes.

A watch line of a ~3 KB pod costs one full ``orjson.loads`` (~100 dicts and
lists), then the bridge encodes most of it twice more: the fingerprint
(sorted, without resourceVersion and managedFields) and the CloudEvent. Most
of that tree is never looked at: change detection needs the metadata, the
event needs the bytes.

An ``ObjectDecoder`` parses ``apiVersion``, ``kind``, ``metadata`` and the
top-level keys a resource's configuration reads (ignore paths, triggers,
projected fields, masks, Secret values, filter paths); every other top-level
value stays an ``orjson.Fragment`` of the server's bytes. orjson writes a
fragment back verbatim, so the fingerprint and the event both splice those
bytes instead of walking a tree, and the object is still a plain dict to
everything that reads the parsed part.

Fingerprints of such objects hash the server's bytes of the unparsed values
as they came: the API server encodes the same content the same way in a LIST
and in a watch (Go struct order, map keys sorted), so equal content still
hashes equal. It is not the hash of a fully parsed object, so the choice is
made per resource at configuration time and never changes within a run; a
checkpoint written with the other choice compares unchanged objects by
resourceVersion (the informer does not notify them), and an object that
changed while the bridge was down is published once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import orjson
from msgspec import UNSET, Raw

from bridge.kube.objects import RawObject, WatchEvent

__all__ = ["ALWAYS_PARSED", "MANAGED_FIELDS_READ", "IncompleteJSON", "ObjectDecoder"]

# What the informer, the reflector and every event read of any object.
ALWAYS_PARSED = frozenset(("apiVersion", "kind", "metadata"))


class IncompleteJSON(ValueError):
    """The bytes end inside the value: more of the body is needed."""


_EMPTY = Raw()


class _Object(msgspec.Struct, forbid_unknown_fields=True):
    """The top-level keys of the common kinds; any other key takes the general path."""

    apiVersion: str | None = None
    kind: str | None = None
    metadata: dict[str, Any] | None = None
    spec: Raw = _EMPTY
    status: Raw = _EMPTY
    data: Raw = _EMPTY
    binaryData: Raw = _EMPTY
    stringData: Raw = _EMPTY
    type: Raw = _EMPTY
    immutable: Raw = _EMPTY


_RAW_FIELDS = ("spec", "status", "data", "binaryData", "stringData", "type", "immutable")

# A reader that looks inside metadata.managedFields names this in ``reads()``
# (bridge/delivery/changes.py); otherwise they stay the server's bytes.
MANAGED_FIELDS_READ = "metadata.managedFields"


class _Meta(msgspec.Struct, forbid_unknown_fields=True):
    """ObjectMeta in the API server's field order, ``managedFields`` left as bytes.

    Real objects carry 1-3 KB of managedFields that nothing here reads: the
    fingerprint strips them and events write them out as they came. Left as
    bytes, they make decoding a pod line nearly twice as fast as with metadata
    parsed whole. Any other key takes the whole-metadata path.
    """

    name: Any = UNSET
    generateName: Any = UNSET
    namespace: Any = UNSET
    selfLink: Any = UNSET
    uid: Any = UNSET
    resourceVersion: Any = UNSET
    generation: Any = UNSET
    creationTimestamp: Any = UNSET
    deletionTimestamp: Any = UNSET
    deletionGracePeriodSeconds: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET
    ownerReferences: Any = UNSET
    finalizers: Any = UNSET
    managedFields: Raw = _EMPTY


_META_FIELDS = _Meta.__struct_fields__[:-1]  # all but managedFields, in order


class _ObjectMeta(_Object, forbid_unknown_fields=True):
    """``_Object`` whose metadata keeps its managedFields as bytes."""

    metadata: _Meta | None = None  # type: ignore[assignment]


class _LineMeta(msgspec.Struct):
    type: str
    object: _ObjectMeta


# Failed first attempts a decoder makes before it stops trying (once they outnumber
# hits); and objects in a row without managedFields before plain dicts come first.
_MISSES_ALLOWED = 16


class _Line(msgspec.Struct):
    type: str
    object: _Object


class _LineRaw(msgspec.Struct):
    type: str
    object: Raw


_TRUNCATED = "Input data was truncated"


def _error(e: msgspec.DecodeError) -> ValueError:
    text = str(e)
    return IncompleteJSON(text) if text.startswith(_TRUNCATED) else ValueError(text)


class ObjectDecoder:
    """Decodes objects of one resource, parsing only the top-level keys in ``parsed``
    (``apiVersion``, ``kind`` and ``metadata`` always)."""

    __slots__ = (
        "_any",
        "_bare",
        "_line",
        "_line_meta",
        "_line_raw",
        "_meta_first",
        "_meta_hits",
        "_meta_misses",
        "_object",
        "_object_meta",
        "_parsed_fields",
        "_raw_fields",
        "parsed",
    )

    def __init__(self, parsed: Iterable[str] = ()) -> None:
        self.parsed = frozenset(parsed) | ALWAYS_PARSED
        # The struct's raw fields: those that stay fragments, those parsed.
        self._raw_fields = tuple(f for f in _RAW_FIELDS if f not in self.parsed)
        self._parsed_fields = tuple(f for f in _RAW_FIELDS if f in self.parsed)
        self._object = msgspec.json.Decoder(_Object)
        self._line = msgspec.json.Decoder(_Line)
        self._line_raw = msgspec.json.Decoder(_LineRaw)
        self._any = msgspec.json.Decoder(dict[str, Raw])
        # ObjectMeta with its managedFields as bytes, when no reader looks inside them
        # (else None). Tried first: objects from a real API server all carry them.
        raw_managed = MANAGED_FIELDS_READ not in self.parsed
        self._object_meta = msgspec.json.Decoder(_ObjectMeta) if raw_managed else None
        self._line_meta = msgspec.json.Decoder(_LineMeta) if raw_managed else None
        # Objects of other shapes (Events, RBAC rules, ...) fail that first attempt:
        # a resource whose objects keep failing it stops making it.
        self._meta_hits = 0
        self._meta_misses = 0
        # Objects without managedFields (an emulator's, a server that strips them) cost
        # a failed attempt more this way: after a run of them, plain dicts come first
        # until an object has managedFields again.
        self._meta_first = True
        self._bare = 0

    def __repr__(self) -> str:
        return f"ObjectDecoder(parsed={sorted(self.parsed)})"

    def object(self, data: bytes | bytearray | memoryview) -> RawObject:
        """One object (a LIST item). ``ValueError`` if it is not a JSON object,
        ``IncompleteJSON`` if the bytes end inside it."""
        if self._meta_first and self._object_meta is not None:
            try:
                decoded = self._object_meta.decode(data)
            except ValueError:
                self._missed()  # another shape, or incomplete: the paths below say which
            else:
                self._meta_hits += 1
                return self._from_struct(decoded)
        try:
            return self._from_struct(self._object.decode(data))
        except msgspec.ValidationError:
            return self._general(data)
        except msgspec.DecodeError as e:
            raise _error(e) from None

    def watch_event(self, line: bytes) -> WatchEvent:
        """One watch line: ``{"type": ..., "object": ...}``. An ``ERROR`` line's Status
        (and anything not shaped like a watch event) is parsed whole."""
        if self._meta_first and self._line_meta is not None:
            try:
                with_meta = self._line_meta.decode(line)
            except ValueError:
                self._missed()  # another shape: the paths below say which
            else:
                if with_meta.type != "ERROR":
                    self._meta_hits += 1
                    return {"type": with_meta.type, "object": self._from_struct(with_meta.object)}
        try:
            decoded = self._line.decode(line)
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError as e:
            raise _error(e) from None
        else:
            if decoded.type != "ERROR":
                return {"type": decoded.type, "object": self._from_struct(decoded.object)}
            return orjson.loads(line)
        # Another shape: a kind with other top-level keys (the general path, from the
        # object's own bytes), a Status, or something the reflector will refuse as is.
        try:
            envelope = self._line_raw.decode(line)
            if envelope.type != "ERROR":
                return {"type": envelope.type, "object": self._general(envelope.object)}
        except ValueError:
            pass
        return orjson.loads(line)

    def _missed(self) -> None:
        self._meta_misses += 1
        if self._meta_misses > _MISSES_ALLOWED and self._meta_misses > self._meta_hits:
            self._object_meta = self._line_meta = None

    def _from_struct(self, o: _Object | _ObjectMeta) -> RawObject:
        out: RawObject = {}
        if o.apiVersion is not None:
            out["apiVersion"] = o.apiVersion
        if o.kind is not None:
            out["kind"] = o.kind
        md = o.metadata
        if type(md) is _Meta:
            parsed: dict[str, Any] = {}
            for name in _META_FIELDS:
                value = getattr(md, name)
                if value is not UNSET:
                    parsed[name] = value
            if md.managedFields:
                parsed["managedFields"] = orjson.Fragment(bytes(md.managedFields))
                self._bare = 0
            else:
                self._bare += 1
                if self._bare > _MISSES_ALLOWED:
                    self._meta_first = False
            out["metadata"] = parsed
        elif isinstance(md, dict):
            out["metadata"] = md
            if not self._meta_first and "managedFields" in md:
                self._meta_first, self._bare = True, 0
        fragment = orjson.Fragment
        for name in self._raw_fields:
            value = getattr(o, name)
            if value:
                out[name] = fragment(bytes(value))
        for name in self._parsed_fields:
            value = getattr(o, name)
            if value:
                out[name] = orjson.loads(bytes(value))
        return out

    def _general(self, data: bytes | bytearray | memoryview | Raw) -> RawObject:
        """Any top-level keys."""
        try:
            parts = self._any.decode(data)
        except msgspec.ValidationError as e:
            raise ValueError(f"not a JSON object: {e}") from None
        except msgspec.DecodeError as e:
            raise _error(e) from None
        out: RawObject = {}
        parsed = self.parsed
        fragment = orjson.Fragment
        for name, value in parts.items():
            out[name] = orjson.loads(bytes(value)) if name in parsed else fragment(bytes(value))
        return out
