"""The event model and its CloudEvents 1.0 encoding (docs/events.md).

One ``Event`` per published change. Its ``id`` comes from the change alone,
never from what the bridge remembers: ``{uid}:{resourceVersion}`` for an add
or a modification, ``{uid}:deleted`` for a delete (a uid is deleted once,
whether the delete was seen by a watch or inferred from a relist). So two
replicas, or a restart, give the same change the same id, and the bus (NATS
duplicate window) or the consumer can drop a redelivery.

NATS subject tokens: a token may not contain ``.``, ``*``, ``>`` or whitespace,
and Kubernetes names and API groups do contain dots (``kube-root-ca.crt``,
``example.com``). Tokens are percent-escaped, deterministically and
reversibly: ``%`` → ``%25``, ``.`` → ``%2E``, ``*`` → ``%2A``, ``>`` → ``%3E``,
and any whitespace or control character → ``%XX`` of its code point. ``%``
cannot occur in a Kubernetes name, so a name that needs no escaping appears
as is, and two different names never share a subject. A cluster-scoped object
has ``_`` for its namespace token (``_`` is not a valid namespace name).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import orjson

from bridge.delivery.changes import (
    Change,
    ChangeKind,
    PathNode,
    compile_paths,
    top_keys,
    transform_paths,
)
from bridge.delivery.views import compile_projection, select
from bridge.kube.objects import RawObject, meta

REDACTED = "<redacted>"
# kubectl apply keeps the whole applied manifest here, Secret values included.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_SECRET_VALUE_FIELDS = ("data", "stringData")
SPECVERSION = "1.0"
DATACONTENTTYPE = "application/json"
CONTENT_TYPE = "application/cloudevents+json"

_UNSAFE = re.compile(r"[%.*>\s\x00-\x1f\x7f]")


def nats_token(value: str) -> str:
    """Escape one NATS subject token (see the module docstring)."""
    if not value:
        return "_"
    return _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", value)


def _now() -> datetime:
    return datetime.now(UTC)


def rfc3339(at: datetime) -> str:
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


class _UtcStamp:
    """``rfc3339(_now())`` at a fifth of its cost: the text up to the second is
    formatted once per second (the event time is stamped on every change)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"


# Not frozen (treat it as immutable, ``replace`` makes variants): a frozen
# dataclass's __init__ sets each field through object.__setattr__, several
# times slower than a plain one, paid once per published change.
@dataclass(slots=True)
class Event:
    """One CloudEvent. ``data`` holds ``object`` (+ ``old``, ``patch``, ``tombstone``).

    ``msg_id`` is the bus-level dedupe id (NATS ``Nats-Msg-Id``); empty means ``id``.
    """

    id: str
    type: str
    source: str
    subject: str
    time: str
    resource_version: str
    initial: bool
    data: Mapping[str, Any]
    nats_subject: str = ""
    msg_id: str = ""
    # The structured-mode JSON, encoded once when the event was decided (``sealed``).
    encoded: bytes = b""
    # The CloudEvents distributed-tracing extension (bridge/delivery/tracing.py): set
    # only while tracing is on, by the batch's span; empty otherwise.
    traceparent: str = ""
    tracestate: str = ""

    @property
    def key(self) -> bytes:
        """Kafka record key: the subject, so one object stays in one partition."""
        return self.subject.encode()

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        """Kafka record headers (CloudEvents Kafka binding names)."""
        headers = [
            ("ce_id", self.id.encode()),
            ("ce_type", self.type.encode()),
            ("ce_source", self.source.encode()),
            ("ce_subject", self.subject.encode()),
        ]
        if self.traceparent:
            headers.append(("ce_traceparent", self.traceparent.encode()))
            if self.tracestate:
                headers.append(("ce_tracestate", self.tracestate.encode()))
        return headers

    @property
    def deleted(self) -> bool:
        return self.type.endswith(".deleted")

    @property
    def removes(self) -> bool:
        """The object leaves consumers' views: deleted, or no longer matching the filter."""
        return self.type.endswith((".deleted", ".filtered"))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "specversion": SPECVERSION,
            "id": self.id,
            "type": self.type,
            "source": self.source,
            "subject": self.subject,
            "time": self.time,
            "datacontenttype": DATACONTENTTYPE,
            "resourceversion": self.resource_version,
            "initial": self.initial,
            "data": self.data if isinstance(self.data, dict) else dict(self.data),
        }
        if self.traceparent:
            out["traceparent"] = self.traceparent
            if self.tracestate:
                out["tracestate"] = self.tracestate
        return out

    def to_json(self) -> bytes:
        """Structured-mode CloudEvents 1.0 JSON."""
        return self.encoded or orjson.dumps(self.to_dict())

    def sealed(self) -> Event:
        """The same event encoded now, its parsed ``data`` let go (decoded again if read).

        A decided event waits for its ack (up to thousands of them); holding the
        object's parsed tree for that long made every young collection of the
        cyclic GC walk it. Its bytes are one untracked object, and the tree
        dies as soon as the handler returns.
        """
        if self.encoded:
            return self
        encoded = _held(self.to_json())
        return replace(self, data=_EncodedData(encoded), encoded=encoded)

    def truncated(self) -> Event:
        """The same event (same id) with ``data.object`` cut to its identifying
        metadata and ``data.truncated: true``: what a bus that refuses the whole
        event (too large) still takes."""
        obj = self.data.get("object") or {}
        md = obj.get("metadata") or {}
        kept = {k: md[k] for k in _TRUNCATED_METADATA if k in md}
        cut = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}
        data: dict[str, Any] = {"object": cut, "truncated": True}
        if self.data.get("tombstone"):
            data["tombstone"] = True
        return replace(self, data=data, encoded=b"")


def _held(encoded: bytes) -> bytes:
    """``encoded`` in a bytes object of its own size, for one that waits for its ack.

    orjson hands back its output buffer as is: a 3 KB event occupies ~8 KB, and
    up to ``max_pending`` of them wait at once. The copy is cheap next to
    building the event.
    """
    return memoryview(encoded).tobytes()


class _EncodedData(Mapping[str, Any]):
    """A sealed event's ``data``: decoded from the event's JSON on first read."""

    __slots__ = ("_decoded", "_encoded")

    def __init__(self, encoded: bytes) -> None:
        self._encoded = encoded
        self._decoded: dict[str, Any] | None = None

    def _data(self) -> dict[str, Any]:
        if self._decoded is None:
            self._decoded = orjson.loads(self._encoded)["data"]
        return self._decoded

    def __getitem__(self, key: str) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        return repr(self._data())


# What a truncated event keeps of the metadata: identity and the small fields
# consumers route on, never annotations (they are what makes objects large).
_TRUNCATED_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
)


def _masked(value: Any) -> Any:
    return REDACTED


def _redact_values(value: Any) -> Any:
    if isinstance(value, dict):
        return dict.fromkeys(value, REDACTED)
    return REDACTED


def _redact_last_applied(value: Any) -> Any:
    """The applied manifest with its data/stringData values redacted, keys kept.

    Anything that does not parse as a JSON object cannot be redacted field by
    field, so it goes whole: better a lost annotation than a leaked value.
    """
    if not isinstance(value, str):
        return REDACTED
    try:
        manifest = orjson.loads(value)
    except orjson.JSONDecodeError:
        return REDACTED
    if not isinstance(manifest, dict):
        return REDACTED
    for field in _SECRET_VALUE_FIELDS:
        if field in manifest:
            manifest[field] = _redact_values(manifest[field])
    # kubectl ends the annotation with a newline; keep it, so only values differ.
    tail = "\n" if value.endswith("\n") else ""
    return orjson.dumps(manifest).decode() + tail


def _annotation_trie(name: str) -> PathNode:
    # Built by hand: annotation names contain dots, which dotted paths cannot spell.
    leaf = PathNode(leaf=True)
    return PathNode(keys={"metadata": PathNode(keys={"annotations": PathNode(keys={name: leaf})})})


class EventBuilder:
    """Builds events for one resource. Everything per-resource is worked out here, once."""

    def __init__(
        self,
        *,
        cluster: str,
        group: str,
        version: str,
        kind: str,
        plural: str,
        redact_secrets: bool = True,
        mask_paths: list[str] | tuple[str, ...] = (),
        include_old: bool = False,
        patch: bool = False,
        fields: list[str] | tuple[str, ...] = (),
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.cluster = cluster
        self.group = group
        self.version = version
        self.kind = kind
        self.plural = plural
        self.api_version = f"{group}/{version}" if group else version
        self.include_old = include_old
        self.patch = patch
        self._clock = clock
        self._stamp: Callable[[], str] = (
            _UtcStamp() if clock is _now else (lambda: rfc3339(clock()))
        )
        # Namespaces repeat across events: their escaped tokens are kept (bounded).
        self._namespace_tokens: dict[str, str] = {}
        self._type_prefix = f"io.k8s.{group or 'core'}.{version}.{kind}."
        self.source = f"k8s://{cluster}/{self.api_version}/{plural}"
        tokens = (cluster, group or "core", version, plural)
        self._subject_prefix = "k8s." + "".join(nats_token(t) + "." for t in tokens)
        # Secret values go; their keys stay, so consumers still see what changed shape.
        secret = kind == "Secret" and not group and redact_secrets
        self._secret = compile_paths(list(_SECRET_VALUE_FIELDS)) if secret else None
        # Copies of those values elsewhere in the object (kubectl apply's record of them).
        self._secret_copies = _annotation_trie(LAST_APPLIED) if secret else None
        self._mask = compile_paths(list(mask_paths)) if mask_paths else None
        # ``fields``: published objects keep only these paths (and their identity).
        self._fields = compile_projection(fields)
        # Last published object per key, for ``data.patch``; kept only when asked for.
        self._last: dict[str, RawObject] = {}

    def reads(self) -> frozenset[str] | None:
        """The top-level keys whose values events need parsed (None: all): projected,
        redacted and masked ones. Others are written out as they came. A patch
        compares whole objects."""
        if self.patch:
            return None
        keys: frozenset[str] = frozenset()
        for trie in (self._fields, self._secret, self._secret_copies, self._mask):
            if trie is not None:
                top = top_keys(trie)
                if top is None:
                    return None
                keys |= top
        return keys

    def redact(self, obj: RawObject, *, project: bool = True) -> RawObject:
        # Project first, then redact what is left: redaction paths are absolute, so a
        # projected Secret value is redacted like an unprojected one, and cheaper.
        if project and self._fields is not None:
            obj = select(obj, self._fields)
        if self._secret is not None:
            obj = transform_paths(obj, self._secret, _redact_values)
        if self._secret_copies is not None:
            obj = transform_paths(obj, self._secret_copies, _redact_last_applied)
        if self._mask is not None:
            obj = transform_paths(obj, self._mask, _masked)
        return obj

    def _subject_of(self, obj: RawObject) -> tuple[str, str]:
        m = meta(obj)
        name = str(m.get("name", ""))
        namespace = str(m.get("namespace") or "")
        subject = f"{namespace}/{name}" if namespace else name
        tokens = self._namespace_tokens
        # nats_token("") is "_": the namespace token of a cluster-scoped object.
        ns_token = tokens.get(namespace)
        if ns_token is None:
            if len(tokens) >= _MAX_NAMESPACE_TOKENS:
                tokens.clear()
            ns_token = tokens[namespace] = nats_token(namespace)
        return subject, self._subject_prefix + ns_token + "." + nats_token(name)

    def build(
        self, change: Change, *, resource_version: str | None = None, sealed: bool = False
    ) -> Event:
        """The event of ``change``. ``resource_version`` overrides the object's for
        the id: a republished uncertain event keeps the id it was written ahead with.
        ``sealed``: the event comes encoded (``Event.sealed``), in one pass."""
        obj = change.object
        m = meta(obj)
        uid = str(m.get("uid", ""))
        rv = resource_version or str(m.get("resourceVersion", ""))
        kind = change.kind
        subject, nats_subject = self._subject_of(obj)
        # A tombstone is metadata already: it is not projected (its metadata is kept).
        public = self.redact(obj, project=not change.tombstone)
        if change.tombstone:
            public = {
                "apiVersion": obj.get("apiVersion") or self.api_version,
                "kind": obj.get("kind") or self.kind,
                "metadata": public.get("metadata", {}),
            }
        data: dict[str, Any] = {"object": public}
        if change.tombstone:
            data["tombstone"] = True
        if self.include_old and change.old is not None:
            data["old"] = self.redact(change.old)
        if self.patch:
            if kind is ChangeKind.DELETED or kind is ChangeKind.FILTERED:
                self._last.pop(change.key, None)
            else:
                before = self._last.get(change.key)
                if before is None and change.old is not None:
                    before = self.redact(change.old)
                if before is not None and kind is ChangeKind.MODIFIED:
                    data["patch"] = jsonpatch.make_patch(before, public).patch
                self._last[change.key] = public
        if kind is ChangeKind.DELETED:
            event_id = f"{uid}:deleted"
        elif kind is ChangeKind.FILTERED:
            event_id = f"{uid}:filtered:{rv}"
        else:
            event_id = f"{uid}:{rv}"
        event_type = self._type_prefix + kind.value
        stamp = self._stamp()
        event = Event(
            event_id,
            event_type,
            self.source,
            subject,
            stamp,
            rv,
            change.initial,
            data,
            nats_subject,
        )
        if sealed:
            # Encoded here, the event just made: the parsed object is let go with it.
            event.encoded = _held(orjson.dumps(event.to_dict()))
            event.data = _EncodedData(event.encoded)
        return event


# Bounds the namespace-token cache: far above any cluster's namespace count.
_MAX_NAMESPACE_TOKENS = 10_000
