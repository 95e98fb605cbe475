"""``meta.k8s.io/v1`` Tables: what ``kubectl get`` asks for (``Accept: ...;as=Table``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.emulator.resources import ResourceType

Body = dict[str, Any]


def _col(name: str, fmt: str = "", description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "format": fmt,
        "description": description,
        "priority": 0,
    }


def human_age(created: str | None) -> str:
    if not created:
        return "<unknown>"
    try:
        then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    secs = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def columns(res: ResourceType) -> list[dict[str, Any]]:
    name = _col("Name", "name", "Name must be unique within a namespace.")
    age = _col("Age", "", "CreationTimestamp of the object.")
    if res.kind == "Pod":
        return [name, _col("Ready"), _col("Status"), _col("Restarts"), age]
    if res.kind == "Deployment":
        return [name, _col("Ready"), _col("Up-to-date"), _col("Available"), age]
    if res.kind == "Namespace":
        return [name, _col("Status"), age]
    return [name, age]


def cells(res: ResourceType, body: Body) -> list[Any]:
    meta = body.get("metadata") or {}
    age = human_age(meta.get("creationTimestamp"))
    name = meta.get("name", "")
    spec = body.get("spec") or {}
    st = body.get("status") or {}
    if res.kind == "Pod":
        containers = spec.get("containers") or []
        statuses = st.get("containerStatuses") or []
        ready = sum(1 for c in statuses if c.get("ready"))
        restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
        return [name, f"{ready}/{len(containers)}", st.get("phase", "Pending"), restarts, age]
    if res.kind == "Deployment":
        want = spec.get("replicas", 1)
        return [
            name,
            f"{st.get('readyReplicas', 0)}/{want}",
            st.get("updatedReplicas", 0),
            st.get("availableReplicas", 0),
            age,
        ]
    if res.kind == "Namespace":
        return [name, st.get("phase", "Active"), age]
    return [name, age]


def _row_object(res: ResourceType, body: Body, include: str) -> Body | None:
    if include == "None":
        return None
    if include == "Object":
        return {"apiVersion": res.api_version, "kind": res.kind, **body}
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": body.get("metadata") or {},
    }


def table(
    res: ResourceType,
    bodies: list[Body],
    list_meta: dict[str, Any],
    include: str = "Metadata",
    with_columns: bool = True,
) -> Body:
    rows = []
    for body in bodies:
        row: Body = {"cells": cells(res, body)}
        obj = _row_object(res, body, include)
        if obj is not None:
            row["object"] = obj
        rows.append(row)
    out: Body = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta}
    if with_columns:
        out["columnDefinitions"] = columns(res)
    out["rows"] = rows
    return out


class TableWatchEncoder:
    """Encodes watch events as one-row Tables; column definitions only in the first."""

    def __init__(self, include: str) -> None:
        self.include = include
        self.sent_columns = False

    def __call__(self, event_type: str, res: ResourceType, body: Body) -> bytes:
        if event_type == "BOOKMARK":
            obj: Body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        else:
            rv = (body.get("metadata") or {}).get("resourceVersion", "")
            obj = table(res, [body], {"resourceVersion": rv}, self.include, not self.sent_columns)
            self.sent_columns = True
        return orjson.dumps({"type": event_type, "object": obj}) + b"\n"
