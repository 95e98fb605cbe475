"""The event envelope every room shares: ``Event``, its CloudEvents 1.0 encoding
(docs/events.md), and the rules for its id and subject.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson

SPECVERSION = "1.0"
DATACONTENTTYPE = "application/json"
CONTENT_TYPE = "application/cloudevents+json"

_UNSAFE = re.compile(r"[%.*>\s\x00-\x1f\x7f]")


def nats_token(value: str) -> str:
    """Escape one NATS subject token (see the module docstring)."""
    if not value:
        return "_"
    return _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", value)


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(at: datetime) -> str:
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


class UtcStamp:
    """``rfc3339(utc_now())`` at a fifth of its cost: the text up to the second is
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
    On a route other than the default, the bus-level id is ``route_msg_id``.
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
    # The routes (``sink.routes`` names) this event goes to, decided once when it was
    # built (bridge/delivery/routes.py); empty: the sink's default destination only.
    routes: tuple[str, ...] = ()

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

    def route_msg_id(self, route: str) -> str:
        """The NATS ``Nats-Msg-Id`` of this event on ``route``: the default route's id
        with ``@{route}`` after it, so the duplicate window, which a stream keeps per
        id and not per subject, does not drop the copy a second route publishes."""
        return f"{self.msg_id or self.id}@{route}"

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
        encoded = held(self.to_json())
        return replace(self, data=EncodedData(encoded), encoded=encoded)

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


def held(encoded: bytes) -> bytes:
    """``encoded`` in a bytes object of its own size, for one that waits for its ack.

    orjson hands back its output buffer as is: a 3 KB event occupies ~8 KB, and
    up to ``max_pending`` of them wait at once. The copy is cheap next to
    building the event.
    """
    return memoryview(encoded).tobytes()


class EncodedData(Mapping[str, Any]):
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


# The type of a heartbeat event (bridge/delivery/heartbeat.py emits them; sinks
# route them, consumers skip them).
HEARTBEAT_TYPE = "io.k8s.bridge.heartbeat"


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    """One CloudEvent as read from the bus."""

    id: str
    type: str
    source: str
    subject: str
    time: str
    resource_version: str
    initial: bool
    data: dict[str, Any]
    raw: bytes

    @property
    def change(self) -> str:
        """``added`` | ``modified`` | ``deleted`` | ``filtered`` | ``snapshot``."""
        return self.type.rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        return self.type.rsplit(".", 2)[-2]

    @property
    def object(self) -> dict[str, Any]:
        obj = self.data.get("object")
        return obj if isinstance(obj, dict) else {}

    @classmethod
    def parse(cls, raw: bytes) -> ReceivedEvent:
        """Decode one structured-mode CloudEvent; ``ValueError`` when ``raw`` is not one."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError("not a CloudEvent: not a JSON object")
        missing = [k for k in ("id", "type", "source") if not doc.get(k)]
        if missing:
            raise ValueError(f"not a CloudEvent: no {', '.join(missing)}")
        data = doc.get("data")
        return cls(
            id=str(doc["id"]),
            type=str(doc["type"]),
            source=str(doc["source"]),
            subject=str(doc.get("subject", "")),
            time=str(doc.get("time", "")),
            resource_version=str(doc.get("resourceversion", "")),
            initial=doc.get("initial") is True,
            data=data if isinstance(data, dict) else {},
            raw=raw,
        )
