"""Deciding which informer notifications are changes worth publishing.

A change is judged by fingerprint, not by comparing whole objects: the
fingerprint hashes the object without the fields nobody cares about
(``metadata.resourceVersion``, ``metadata.managedFields`` and the configured
ignore paths), so a resync, a relist echo, a restart or a heartbeat-only update
hashes the same and publishes nothing.

Ignore paths are dotted (``status.conditions.lastHeartbeatTime``). A segment
applied to a list applies to every element; ``name[N]`` selects one element
(``spec.containers[0].image``). Paths are parsed once into a trie; removing
them copies only the dicts and lists along a removed path, so the input object
is never mutated and untouched branches are shared, not copied.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import xxhash

from bridge.errors import ConfigError
from bridge.ground.digest import Digest
from bridge.kube.objects import (
    CachedObject,
    DeletedFinalStateUnknown,
    RawObject,
    meta,
    namespace_key,
)
from bridge.kube.rawjson import MANAGED_FIELDS_READ

ALWAYS_IGNORED = ("metadata.resourceVersion", "metadata.managedFields")

# Objects keep ``metadata.managedFields`` as the server's bytes unless something reads
# inside it (bridge/kube/rawjson.py): a reader's ``reads()`` then names
# ``MANAGED_FIELDS_READ``.
MANAGED_FIELDS = ("metadata", "managedFields")

# A slim store record carries its fingerprint next to the metadata.
FINGERPRINT_FIELD = "fingerprint"


@dataclass(slots=True)
class PathNode:
    """One step of the compiled path trie.

    ``keys`` children apply to a dict's key (or, on a list, to that key of every
    element); ``indexes`` children select one list element. ``leaf`` means the
    value reached here is removed (or masked).
    """

    leaf: bool = False
    keys: dict[str, PathNode] = field(default_factory=dict)
    indexes: dict[int, PathNode] = field(default_factory=dict)


_SEGMENT = re.compile(r"^([^\[\]]*)((?:\[-?\d+\])*)$")
_INDEX = re.compile(r"\[(-?\d+)\]")


def _parse(path: str) -> list[str | int]:
    steps: list[str | int] = []
    if not path or path.startswith(".") or path.endswith(".") or ".." in path:
        raise ConfigError(f"ignore path {path!r}: empty segment")
    for segment in path.split("."):
        m = _SEGMENT.match(segment)
        if m is None:
            raise ConfigError(f"ignore path {path!r}: bad segment {segment!r}")
        name, indexes = m.groups()
        if name:
            steps.append(name)
        steps.extend(int(i) for i in _INDEX.findall(indexes))
        if not name and not indexes:
            raise ConfigError(f"ignore path {path!r}: empty segment")
    return steps


def compile_paths(paths: list[str] | tuple[str, ...]) -> PathNode:
    """Parse dotted paths into a trie, once, at configuration time."""
    root = PathNode()
    for path in paths:
        node = root
        for step in _parse(path):
            if isinstance(step, int):
                node = node.indexes.setdefault(step, PathNode())
            else:
                node = node.keys.setdefault(step, PathNode())
        node.leaf = True
    return root


def top_keys(node: PathNode) -> frozenset[str] | None:
    """The top-level keys a trie reaches into; None if it picks list positions at the top,
    plus ``MANAGED_FIELDS_READ`` if it reaches inside ``metadata.managedFields``."""
    if node.indexes:
        return None
    keys = frozenset(node.keys)
    return keys | {MANAGED_FIELDS_READ} if reaches_inside(node, MANAGED_FIELDS) else keys


def reaches_inside(node: PathNode, path: tuple[str, ...]) -> bool:
    """Whether the trie has a path that goes below ``path`` (not just to it)."""
    for step in path:
        child = node.keys.get(step)
        if child is None:
            return False
        node = child
    return bool(node.keys or node.indexes)


def compile_ignore_paths(paths: list[str]) -> PathNode:
    """The ignore trie: the configured paths plus the always-ignored metadata fields."""
    return compile_paths([*ALWAYS_IGNORED, *paths])


_REMOVE = object()


def transform_paths(value: Any, node: PathNode, replace: Callable[[Any], Any] | None) -> Any:
    """Return ``value`` with the trie's leaves removed (``replace`` None) or replaced.

    Copies only containers along a path that actually changed; returns the very
    same object when nothing matched, so callers can test ``is``.
    """
    if isinstance(value, dict):
        out: dict[str, Any] | None = None
        for name, child in node.keys.items():
            if name not in value:
                continue
            old = value[name]
            new = (_REMOVE if replace is None else replace(old)) if child.leaf else None
            if not child.leaf:
                new = transform_paths(old, child, replace)
                if new is old:
                    continue
            if out is None:
                out = dict(value)
            if new is _REMOVE:
                del out[name]
            else:
                out[name] = new
        return value if out is None else out
    if isinstance(value, list):
        items: list[Any] | None = None
        removed: set[int] = set()
        n = len(value)
        for i, element in enumerate(value):
            # A key segment on a list applies to every element.
            new = transform_paths(element, node, replace) if node.keys else element
            picked = node.indexes.get(i) or node.indexes.get(i - n)
            if picked is not None:
                if picked.leaf:
                    if replace is None:
                        removed.add(i)
                        continue
                    new = replace(new)
                else:
                    new = transform_paths(new, picked, replace)
            if new is not element:
                if items is None:
                    items = list(value)
                items[i] = new
        if removed:
            base = items if items is not None else value
            return [v for i, v in enumerate(base) if i not in removed]
        return value if items is None else items
    return value


def strip_paths(obj: RawObject, node: PathNode) -> RawObject:
    """``obj`` without the trie's paths; ``obj`` itself is not mutated."""
    result: RawObject = transform_paths(obj, node, None)
    return result


class Fingerprinter:
    """Hashes objects without their ignored fields (xxh3-128, hex)."""

    __slots__ = ("_last", "_last_fp", "_only_always_ignored", "_trie", "ignore_fields")

    def __init__(self, ignore_fields: list[str] | tuple[str, ...] = ()) -> None:
        self.ignore_fields = list(ignore_fields)
        self._trie = compile_ignore_paths(self.ignore_fields)
        # The common case, stripped with two dict copies instead of a walk of the trie.
        self._only_always_ignored = not self.ignore_fields
        # The informer's slim cache and the change detector hash the same object
        # one after the other; the second asks again for the object it holds.
        # (Objects are never mutated, and holding the last one keeps its id unique.)
        self._last: RawObject | None = None
        self._last_fp = ""

    def reads(self) -> frozenset[str] | None:
        """The top-level keys whose values this fingerprint needs parsed (None: all).
        Other values may arrive as the server's bytes (bridge/kube/rawjson.py)."""
        return top_keys(self._trie)

    def fingerprint(self, obj: RawObject) -> str:
        if obj is self._last:
            return self._last_fp
        if self._only_always_ignored and type(md := obj.get("metadata")) is dict:
            # What transform_paths does with ALWAYS_IGNORED alone (on a metadata of
            # another type, a list of dicts say, the trie's walk decides).
            stripped = obj
            if "resourceVersion" in md or "managedFields" in md:
                md = md.copy()
                md.pop("resourceVersion", None)
                md.pop("managedFields", None)
                stripped = obj.copy()
                stripped["metadata"] = md
        else:
            stripped = transform_paths(obj, self._trie, None)
        fp = xxhash.xxh3_128_hexdigest(orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS))
        self._last, self._last_fp = obj, fp
        return fp


class ChangeKind(StrEnum):
    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"
    # The object left the resource's filter (bridge/delivery/filters.py): delete-like for
    # consumers, though the object still exists.
    FILTERED = "filtered"


@dataclass(slots=True)
class Change:
    """One change to publish.

    ``object`` is the object after the change (for a delete: its last state; for
    a tombstone: the last known state, possibly only metadata). ``digest`` is what
    to checkpoint once published; None for deletes (the key is dropped).
    """

    kind: ChangeKind
    object: RawObject
    key: str
    digest: Digest | None = None
    old: RawObject | None = None
    tombstone: bool = False
    initial: bool = False


def object_from_digest(digest: Digest, *, api_version: str = "", kind: str = "") -> RawObject:
    """The last known metadata of an object when only its digest survives (restart diffs)."""
    namespace, _, name = digest.key.rpartition("/")
    metadata: dict[str, Any] = {
        "name": name,
        "uid": digest.uid,
        "resourceVersion": digest.resource_version,
    }
    if namespace:
        metadata["namespace"] = namespace
    obj: RawObject = {"metadata": metadata}
    if api_version:
        obj["apiVersion"] = api_version
    if kind:
        obj["kind"] = kind
    return obj


def _slim(obj: CachedObject) -> RawObject:
    """The last known metadata of an object, as carried by a tombstone."""
    if not isinstance(obj, dict):
        # A cache record; the event builder fills in apiVersion and kind.
        md: dict[str, Any] = {"name": obj.name}
        if obj.namespace:
            md["namespace"] = obj.namespace
        md["uid"] = obj.uid
        md["resourceVersion"] = obj.resource_version
        return {"metadata": md}
    m = meta(obj)
    slim_meta = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in m}
    out: RawObject = {"metadata": slim_meta}
    for k in ("apiVersion", "kind"):
        if k in obj:
            out[k] = obj[k]
    return out


class ChangeDetector:
    """Turns informer callbacks into the changes to publish.

    Independent of the informer: it only needs objects, slim cache records
    (bridge/ground/records.py, or the older dict form
    ``{"apiVersion","kind","metadata":{...},"fingerprint"}``) or digests.
    """

    __slots__ = ("fingerprinter",)

    def __init__(self, fingerprinter: Fingerprinter) -> None:
        self.fingerprinter = fingerprinter

    def _added(self, obj: RawObject, initial: bool, digest: Digest | None = None) -> Change:
        d = digest or Digest(
            namespace_key(obj),
            str(meta(obj).get("uid", "")),
            str(meta(obj).get("resourceVersion", "")),
            self.fingerprinter.fingerprint(obj),
        )
        return Change(ChangeKind.ADDED, obj, d.key, digest=d, initial=initial)

    def on_add(
        self, obj: RawObject, known: Digest | None = None, *, initial: bool = False
    ) -> list[Change]:
        """An object appeared in a list or watch. ``known``: its digest from a checkpoint.

        With a digest of the same UID and fingerprint it is a restart echo: nothing.
        A different fingerprint is a change made while the bridge was away; a
        different UID is a delete and re-create (checklist 28).
        """
        new = self.digest_of(obj)
        if known is None:
            return [self._added(obj, initial, new)]
        if known.uid != new.uid:
            old = object_from_digest(
                known, api_version=str(obj.get("apiVersion", "")), kind=str(obj.get("kind", ""))
            )
            return [
                Change(ChangeKind.DELETED, old, known.key, tombstone=True),
                self._added(obj, initial, new),
            ]
        if known.fingerprint == new.fingerprint:
            return []
        return [Change(ChangeKind.MODIFIED, obj, new.key, digest=new)]

    def digest_of(self, obj: RawObject) -> Digest:
        m = meta(obj)
        return Digest(
            namespace_key(obj),
            str(m.get("uid", "")),
            str(m.get("resourceVersion", "")),
            self.fingerprinter.fingerprint(obj),
        )

    def on_update(self, old: str | Digest | CachedObject | None, new: RawObject) -> list[Change]:
        """An update notification; ``old`` is the previous fingerprint, digest,
        slim record or full object.

        Equal fingerprints (a resync, a relist echo, an ignored-field change)
        publish nothing. A different UID is a delete of the old object and an add
        of the new one (checklist 28).
        """
        d = self.digest_of(new)
        old_obj: RawObject | None = None
        if old is None:
            return [Change(ChangeKind.MODIFIED, new, d.key, digest=d)]
        if isinstance(old, str):
            old_fp, old_uid = old, d.uid
        elif isinstance(old, Digest):
            old_fp, old_uid = old.fingerprint, old.uid
            old_obj = None
        elif not isinstance(old, dict):
            old_fp, old_uid = old.fingerprint, old.uid  # a cache record
        else:
            fp = old.get(FINGERPRINT_FIELD)
            old_fp = fp if isinstance(fp, str) else self.fingerprinter.fingerprint(old)
            old_uid = str(meta(old).get("uid", ""))
            if not isinstance(fp, str):
                old_obj = old
        if old_uid != d.uid:
            if isinstance(old, Digest):
                gone = object_from_digest(
                    old, api_version=str(new.get("apiVersion", "")), kind=str(new.get("kind", ""))
                )
            elif not isinstance(old, str):
                gone = _slim(old)
            else:
                gone = _slim(new)
                gone["metadata"]["uid"] = old_uid
            return [
                Change(ChangeKind.DELETED, gone, d.key, tombstone=True),
                Change(ChangeKind.ADDED, new, d.key, digest=d),
            ]
        if old_fp == d.fingerprint:
            return []
        return [Change(ChangeKind.MODIFIED, new, d.key, digest=d, old=old_obj)]

    def on_delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> list[Change]:
        """A delete is always published; a tombstone carries the last known metadata."""
        if isinstance(obj, DeletedFinalStateUnknown):
            last = obj.obj
            if last is None:
                namespace, _, name = obj.key.rpartition("/")
                md: dict[str, Any] = {"name": name}
                if namespace:
                    md["namespace"] = namespace
                last = {"metadata": md}
            elif not isinstance(last, dict) or FINGERPRINT_FIELD in last:
                last = _slim(last)
            return [Change(ChangeKind.DELETED, last, obj.key, tombstone=True)]
        if not isinstance(obj, dict) or FINGERPRINT_FIELD in obj:
            # A slim record is all the informer kept: publish its metadata, marked as such.
            return [Change(ChangeKind.DELETED, _slim(obj), namespace_key(obj), tombstone=True)]
        return [Change(ChangeKind.DELETED, obj, namespace_key(obj))]
