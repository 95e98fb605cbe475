"""JSON Schemas (draft-07) of what the bridge publishes, built from the code's own names.

The envelope's fixed values (``specversion``, ``datacontenttype``), the change
kinds, the snapshot and heartbeat types and the dead-letter headers come from
the modules that emit them, so a renamed or added one changes the schema too;
what the code builds but the schema does not name fails ``tests/unit/test_contract.py``,
which validates events from the real builders (the envelope and every ``data``
shape allow no other keys).

``ref(prefix)`` places the shared definitions: ``#/definitions/`` in the
standalone file, ``#/components/schemas/`` in the AsyncAPI document.
"""

from __future__ import annotations

from typing import Any

from bridge.delivery.changes import ChangeKind
from bridge.delivery.snapshot import SNAPSHOT
from bridge.ground.envelope import DATACONTENTTYPE, HEARTBEAT_TYPE, SPECVERSION
from bridge.sinks import deadletter

Schema = dict[str, Any]

CHANGE_TYPES = [k.value for k in ChangeKind]
EVENT_TYPES = [*CHANGE_TYPES, SNAPSHOT]
# io.k8s.{group|core}.{version}.{Kind}.{change}: the group may hold dots.
CHANGE_TYPE_PATTERN = (
    r"^io\.k8s\.[a-z0-9.-]+\.[a-z0-9]+\.[A-Za-z0-9]+\.(" + "|".join(EVENT_TYPES) + r")$"
)

_STRING = {"type": "string"}
# The CloudEvents distributed-tracing extension (bridge/delivery/tracing.py), with tracing on.
TRACEPARENT = {
    "type": "string",
    "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
    "description": "W3C traceparent of the bridge's span that published the event's batch"
    " (tracing.otlpEndpoint set)",
}
TRACESTATE = {"type": "string", "description": "W3C tracestate, when the span has one"}
_NULLABLE_STRING = {"type": ["string", "null"]}


def kubernetes_object() -> Schema:
    """An object as the API server returned it (after redaction, projection, truncation):
    only its identity is promised."""
    return {
        "type": "object",
        "description": "A Kubernetes object as the API server returned it, after the"
        " resource's fields, redaction and masks; truncated: its identifying metadata only",
        "required": ["metadata"],
        "properties": {
            "apiVersion": _STRING,
            "kind": _STRING,
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": _STRING,
                    "namespace": _STRING,
                    "uid": _STRING,
                    "resourceVersion": _STRING,
                    "generation": {"type": "integer"},
                    "labels": {"type": "object", "additionalProperties": _STRING},
                    "annotations": {"type": "object", "additionalProperties": _STRING},
                },
            },
        },
    }


def change_data(ref: str) -> Schema:
    obj = {"$ref": ref + "kubernetesObject"}
    return {
        "type": "object",
        "description": "data of a change (added, modified, deleted, filtered) or a snapshot"
        " announcement",
        "required": ["object"],
        "additionalProperties": False,
        "properties": {
            "object": obj,
            "old": {**obj, "description": "the previous object (resources[].includeOld)"},
            "patch": {
                "type": "array",
                "description": "RFC 6902 patch from the last published object (resources[].patch)",
                "items": {
                    "type": "object",
                    "required": ["op", "path"],
                    "properties": {
                        "op": {"enum": ["add", "remove", "replace", "move", "copy", "test"]},
                        "path": _STRING,
                        "from": _STRING,
                        "value": {},
                    },
                },
            },
            "tombstone": {
                "const": True,
                "description": "a delete seen only through a relist: object is the last known"
                " metadata",
            },
            "truncated": {
                "const": True,
                "description": "the bus refused the whole event; object is cut to its"
                " identifying metadata (poisonPolicy truncate or deadLetter)",
            },
        },
    }


def heartbeat_data() -> Schema:
    number = {"type": "number"}
    return {
        "type": "object",
        "description": "data of a heartbeat: how far the bridge has carried one resource scope",
        "additionalProperties": False,
        "required": [
            "cluster",
            "apiVersion",
            "kind",
            "resource",
            "namespace",
            "checkpointId",
            "watermark",
            "objects",
            "secondsSinceLastChange",
            "synced",
            "watchUp",
            "unacknowledged",
            "checkpointLagSeconds",
            "intervalSeconds",
            "sequence",
        ],
        "properties": {
            "cluster": _STRING,
            "apiVersion": _STRING,
            "kind": _STRING,
            "resource": _STRING,
            "namespace": _NULLABLE_STRING,
            "checkpointId": _STRING,
            "watermark": {**_STRING, "description": "the committed watermark"},
            "objects": {"type": "integer", "minimum": 0},
            "secondsSinceLastChange": {"type": ["number", "null"]},
            "synced": {"type": "boolean"},
            "watchUp": {"type": "boolean"},
            "unacknowledged": {"type": "integer", "minimum": 0},
            "checkpointLagSeconds": number,
            "intervalSeconds": number,
            "sequence": {"type": "integer", "minimum": 1},
        },
    }


def envelope(ref: str) -> Schema:
    """The CloudEvents 1.0 structured-mode envelope of every event and heartbeat."""
    return {
        "type": "object",
        "description": "A CloudEvents 1.0 event in structured mode (application/cloudevents+json)",
        "additionalProperties": False,
        "required": [
            "specversion",
            "id",
            "type",
            "source",
            "subject",
            "time",
            "datacontenttype",
            "resourceversion",
            "initial",
            "data",
        ],
        "properties": {
            "specversion": {"const": SPECVERSION},
            "id": {
                **_STRING,
                "description": "{uid}:{resourceVersion}, {uid}:deleted,"
                " {uid}:filtered:{resourceVersion}, {uid}:{resourceVersion}:snapshot:{signal},"
                " hb:{run}:{sequence}: from the change alone",
            },
            "type": {
                "type": "string",
                "anyOf": [{"pattern": CHANGE_TYPE_PATTERN}, {"const": HEARTBEAT_TYPE}],
            },
            "source": {"type": "string", "pattern": r"^k8s://[^/]+/.+/[^/]+$"},
            "subject": _STRING,
            "time": {
                "type": "string",
                "format": "date-time",
                # Also as a pattern: a validator without a date-time checker still checks it.
                "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
                r"(Z|[+-][0-9]{2}:[0-9]{2})$",
            },
            "datacontenttype": {"const": DATACONTENTTYPE},
            "resourceversion": _STRING,
            "initial": {"type": "boolean"},
            "data": {"type": "object"},
            "traceparent": TRACEPARENT,
            "tracestate": TRACESTATE,
        },
        "if": {"properties": {"type": {"const": HEARTBEAT_TYPE}}},
        "then": {"properties": {"data": {"$ref": ref + "heartbeatData"}}},
        "else": {"properties": {"data": {"$ref": ref + "changeData"}}},
    }


def definitions(ref: str) -> dict[str, Schema]:
    return {
        "kubernetesObject": kubernetes_object(),
        "changeData": change_data(ref),
        "heartbeatData": heartbeat_data(),
    }


def event_schema() -> Schema:
    """The standalone JSON Schema of a published event (docs/contract/event.schema.json)."""
    ref = "#/definitions/"
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://k8s-bridge.dev/contract/event.schema.json",
        "title": "k8s-bridge event",
        **envelope(ref),
        "definitions": definitions(ref),
    }


def kafka_headers() -> Schema:
    props: Schema = {name: _STRING for name in ("ce_id", "ce_type", "ce_source", "ce_subject")}
    return {
        "type": "object",
        "description": "CloudEvents Kafka binding headers",
        "required": ["ce_id", "ce_type", "ce_source", "ce_subject"],
        "properties": props | {"ce_traceparent": TRACEPARENT, "ce_tracestate": TRACESTATE},
    }


def nats_headers(route: bool = False) -> Schema:
    """Headers of a NATS change; ``route``: of its copy on one of sink.routes."""
    msg_id = (
        "{id}@{route} (a replayed copy: {id}:replay:{run}@{route}): one id per route, so"
        " JetStream's duplicate window keeps each route's copy and drops a redelivery"
        if route
        else "the event id (a replayed copy: {id}:replay:{run}); JetStream's"
        " duplicate window drops a redelivery"
    )
    return {
        "type": "object",
        "required": ["Nats-Msg-Id"],
        "properties": {
            "Nats-Msg-Id": {**_STRING, "description": msg_id},
            "traceparent": TRACEPARENT,
            "tracestate": TRACESTATE,
        },
    }


def dead_letter_headers(nats: bool) -> Schema:
    props: Schema = {name: _STRING for name in ("ce_id", "ce_type", "ce_source", "ce_subject")}
    props[deadletter.REASON] = {**_STRING, "description": "the bus's refusal"}
    props[deadletter.SIZE] = {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "bytes of the refused event's JSON",
    }
    props[deadletter.CUT] = {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "only when the value was cut to the destination's limit: the bytes kept"
        " (the value is then not valid JSON)",
    }
    required = ["ce_id", "ce_type", "ce_source", "ce_subject", deadletter.REASON, deadletter.SIZE]
    if nats:
        props["Nats-Msg-Id"] = {**_STRING, "description": "{id}" + deadletter.MSG_ID_SUFFIX}
        required.append("Nats-Msg-Id")
    return {"type": "object", "required": required, "properties": props}
