"""Raw Kubernetes payloads as they travel through the bridge.

Objects stay the plain dicts orjson decoded: building kubernetes-asyncio model
objects costs 10-50x the parse. TypedDicts describe the envelopes the bridge
itself reads (watch events, lists, Status); objects are ``RawObject``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from bridge.ground.records import LooseRecord, PackedRecord

RawObject = dict[str, Any]

# What an informer's cache holds per key: the object, or in slim mode its
# compact record (bridge/ground/records.py).
CachedObject = RawObject | PackedRecord | LooseRecord

WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"


class WatchEvent(TypedDict):
    """One line of a watch stream."""

    type: str
    object: RawObject


class ListResponse(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    items: list[RawObject]


class Status(TypedDict, total=False):
    apiVersion: str
    kind: str
    status: str
    message: str
    reason: str
    code: int
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """client-go's tombstone: the key vanished in a relist; ``obj`` is the last state known.

    ``obj`` may be None when nothing was known of the object.
    """

    key: str
    obj: CachedObject | None


def meta(obj: RawObject) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


class _LastKeyed:
    """The last object ``namespace_key`` keyed, and its key.

    The cache, the change detector and the pipeline each ask the key of the
    object being handled, one after the other (four times per change): the
    later asks cost an identity test instead of two lookups and a format.
    Objects are never mutated once decoded, and holding the last one keeps its
    id from being reused, so ``is`` is an exact test.
    """

    __slots__ = ("key", "obj")

    def __init__(self) -> None:
        self.obj: object = None
        self.key = ""


_last_keyed = _LastKeyed()


def namespace_key(obj: CachedObject | DeletedFinalStateUnknown) -> str:
    """client-go's ``MetaNamespaceKeyFunc``: ``namespace/name``, or ``name`` if cluster-scoped.

    A tombstone's key is its own, and so is a cache record's.
    """
    last = _last_keyed
    if obj is last.obj:
        return last.key
    if not isinstance(obj, dict):
        return obj.key
    m = obj.get("metadata")
    if type(m) is not dict:
        m = meta(obj)
    ns = m.get("namespace")
    name = m.get("name", "")
    key = f"{ns}/{name}" if ns else str(name)
    last.obj, last.key = obj, key
    return key


def resource_version(obj: CachedObject) -> str:
    if not isinstance(obj, dict):
        return obj.resource_version
    return str(meta(obj).get("resourceVersion", ""))


def uid(obj: CachedObject) -> str:
    if not isinstance(obj, dict):
        return obj.uid
    return str(meta(obj).get("uid", ""))
