"""The emulator's state: objects, one global resourceVersion, event history, watchers.

Stored bodies are never mutated once stored (every change builds a new dict),
so an event record, a list page and a watcher can share them without copies.
Bodies are kept without ``kind``/``apiVersion`` (list items lack them); the
full object is built once per change, when its watch line is encoded. That one
encoded line is shared by every watcher without selectors.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import builtins
import random
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson

from bridge.emulator import status
from bridge.emulator.resources import ResourceType
from bridge.emulator.selectors import Matcher
from bridge.kube.objects import INITIAL_EVENTS_END_ANNOTATION

Body = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def full_object(res: ResourceType, body: Body) -> Body:
    return {"apiVersion": res.api_version, "kind": res.kind, **body}


def with_rv(body: Body, rv: int) -> Body:
    return {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": str(rv)}}


def encode_event(event_type: str, obj: Body) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def bookmark_object(res: ResourceType, rv: int, initial_end: bool = False) -> Body:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
    return {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}


class EventRecord:
    """One change, as history keeps it and watchers receive it."""

    __slots__ = ("body", "event_type", "line", "namespace", "prev", "res", "rv")

    def __init__(
        self,
        rv: int,
        event_type: str,
        res: ResourceType,
        namespace: str,
        body: Body,
        prev: Body | None,
    ) -> None:
        self.rv = rv
        self.event_type = event_type
        self.res = res
        self.namespace = namespace
        self.body = body
        self.prev = prev
        self.line = encode_event(event_type, full_object(res, body))


Encoder = Any  # Callable[[str, ResourceType, Body], bytes]; kept loose for the Table encoder


class Watcher:
    """A watch connection's mailbox: encoded lines waiting to be written."""

    def __init__(
        self,
        res: ResourceType,
        namespace: str | None,
        matcher: Matcher | None,
        encoder: Encoder | None = None,
    ) -> None:
        self.res = res
        self.namespace = namespace
        self.matcher = matcher
        self.encoder = encoder
        # The synthetic initial events, encoded as they are written; before ``pending``.
        self.initial: Iterator[bytes] | None = None
        self.pending: deque[tuple[int, bytes]] = deque()
        self.wake = asyncio.Event()
        self.kill: str | None = None  # "drop" | "truncate" | "stop"
        # Events at or before this version are not for this watch (one from a future RV).
        self.after_rv = 0

    def encode(self, event_type: str, body: Body) -> bytes:
        if self.encoder is not None:
            return bytes(self.encoder(event_type, self.res, body))
        return encode_event(event_type, full_object(self.res, body))

    def offer(self, rec: EventRecord) -> None:
        if (self.namespace and rec.namespace != self.namespace) or rec.rv <= self.after_rv:
            return
        if self.matcher is None and self.encoder is None:
            self.pending.append((rec.rv, rec.line))
            self.wake.set()
            return
        match = self.matcher or (lambda _obj: True)
        if rec.event_type == "ADDED":
            if match(rec.body):
                self._push(rec.rv, "ADDED", rec.body)
        elif rec.event_type == "DELETED":
            if match(rec.prev or rec.body):
                self._push(rec.rv, "DELETED", rec.body)
        else:
            cur = match(rec.body)
            old = rec.prev is not None and match(rec.prev)
            if cur and old:
                self._push(rec.rv, "MODIFIED", rec.body)
            elif cur:
                self._push(rec.rv, "ADDED", rec.body)
            elif old and rec.prev is not None:
                # Like the watch cache: the object left the selector; show its last
                # matching content at the event's resourceVersion.
                self._push(rec.rv, "DELETED", with_rv(rec.prev, rec.rv))

    def _push(self, rv: int, event_type: str, body: Body) -> None:
        self.pending.append((rv, self.encode(event_type, body)))
        self.wake.set()

    def stop(self, how: str) -> None:
        self.kill = how
        self.wake.set()


class Store:
    """Objects by resource, the global resourceVersion counter and retained history."""

    def __init__(self, history_limit: int | None = None) -> None:
        self.rv = 1
        self.history_limit = history_limit
        self.objects: dict[ResourceType, dict[Key, Body]] = {}
        self.history: deque[EventRecord] = deque()
        # Every event with rv > compacted_rv is in history.
        self.compacted_rv = 0
        self.watchers: dict[ResourceType, set[Watcher]] = {}
        self._sorted: dict[ResourceType, list[Key]] = {}
        # Per resource, the newest version its watch cache has seen (what its bookmarks
        # carry): its own events, and the global version after a consistent read.
        self.seen_rv: dict[ResourceType, int] = {}

    # -- reading ---------------------------------------------------------------

    def bucket(self, res: ResourceType) -> dict[Key, Body]:
        return self.objects.setdefault(res, {})

    def get(self, res: ResourceType, namespace: str, name: str) -> Body:
        body = self.bucket(res).get((namespace if res.namespaced else "", name))
        if body is None:
            raise status.not_found(res.group, res.plural, name)
        return body

    def sorted_keys(self, res: ResourceType) -> list[Key]:
        keys = self._sorted.get(res)
        if keys is None:
            keys = sorted(self.bucket(res))
            self._sorted[res] = keys
        return keys

    def state_at(self, res: ResourceType, rv: int) -> dict[Key, Body]:
        """The objects of ``res`` as they were at ``rv`` (rv must be >= compacted_rv)."""
        state = dict(self.bucket(res))
        for rec in reversed(self.history):
            if rec.rv <= rv:
                break
            if rec.res is not res:
                continue
            key = (rec.namespace, rec.body["metadata"]["name"])
            if rec.event_type == "ADDED":
                state.pop(key, None)
            elif rec.prev is not None:
                state[key] = rec.prev
        return state

    def list_objects(
        self,
        res: ResourceType,
        namespace: str | None,
        matcher: Matcher | None,
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        exact_rv: int | None = None,
    ) -> tuple[list[Body], int, str | None, int | None]:
        """Items, list RV, continue token, remaining count."""
        start_after: Key | None = None
        list_rv = self.rv
        if continue_token:
            list_rv, start_after = decode_continue(continue_token)
            if list_rv == LATEST:
                # The token an expired continue's 410 hands out: on at the latest state.
                list_rv = self.rv
            elif list_rv < self.compacted_rv:
                raise status.continue_expired(encode_continue(LATEST, start_after))
            elif list_rv > self.rv:
                raise status.too_large_rv(list_rv, self.rv)
        elif exact_rv is not None:
            if exact_rv > self.rv:
                raise status.too_large_rv(exact_rv, self.rv)
            if exact_rv < self.compacted_rv:
                raise status.list_too_old()
            list_rv = exact_rv
        if list_rv == self.rv:
            source = self.bucket(res)
            keys = self.sorted_keys(res)
        else:
            source = self.state_at(res, list_rv)
            keys = sorted(source)
        ns_filter = namespace if res.namespaced and namespace else None
        # Keys sort by (namespace, name): a namespace and a continue point are ranges.
        lo, hi = 0, len(keys)
        if ns_filter is not None:
            lo = bisect.bisect_left(keys, (ns_filter, ""))
            hi = bisect.bisect_left(keys, (ns_filter + "\x00", ""))
        if start_after is not None:
            lo = max(lo, bisect.bisect_right(keys, start_after))
        items: list[Body] = []
        remaining = 0
        last: Key | None = None
        full = False
        for pos in range(lo, hi):
            if full:
                # Like the server, no look-ahead for another match: any key left gives a
                # continue (with a selector the next page may be empty) and the count.
                remaining = hi - pos
                break
            key = keys[pos]
            body = source[key]
            if matcher is not None and not matcher(body):
                continue
            items.append(body)
            last = key
            if limit and len(items) >= limit:
                full = True
        token = encode_continue(list_rv, last) if full and remaining and last else None
        # With a selector the server reports no count: it would count unmatched items.
        return items, list_rv, token, (remaining if token and matcher is None else None)

    # -- writing ---------------------------------------------------------------

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def caught_up(self, res: ResourceType) -> None:
        """A consistent read of ``res``: its cache asked for progress and reached now."""
        self.seen_rv[res] = self.rv

    def _emit(self, rec: EventRecord) -> None:
        self.seen_rv[rec.res] = rec.rv
        self.history.append(rec)
        if self.history_limit is not None:
            while len(self.history) > self.history_limit:
                self.compacted_rv = self.history.popleft().rv
        for watcher in self.watchers.get(rec.res, ()):
            watcher.offer(rec)

    def create(self, res: ResourceType, namespace: str, body: Body) -> Body:
        meta = dict(body.get("metadata") or {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise status.invalid(
                    res.kind, "", "metadata.name: Required value: name or generateName is required"
                )
            suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
            meta["name"] = prefix + suffix
        name = meta["name"]
        ns = namespace if res.namespaced else ""
        bucket = self.bucket(res)
        key = (ns, name)
        if key in bucket:
            raise status.already_exists(res.group, res.plural, name)
        rv = self._next_rv()
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(rv)
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        stored = {k: v for k, v in body.items() if k not in ("kind", "apiVersion", "metadata")}
        stored = _fold_string_data(res, {"metadata": meta, **stored})
        if res.kind == "Namespace":
            stored.setdefault("spec", {"finalizers": ["kubernetes"]})
            stored.setdefault("status", {"phase": "Active"})
        bucket[key] = stored
        self._sorted.pop(res, None)
        self._emit(EventRecord(rv, "ADDED", res, ns, stored, None))
        return stored

    def update(
        self, res: ResourceType, namespace: str, body: Body, *, check_rv: bool = True
    ) -> Body:
        meta = dict(body.get("metadata") or {})
        name = meta.get("name") or ""
        ns = namespace if res.namespaced else ""
        bucket = self.bucket(res)
        old = bucket.get((ns, name))
        if old is None:
            raise status.not_found(res.group, res.plural, name)
        old_meta = old["metadata"]
        asked_rv = meta.get("resourceVersion")
        if check_rv and asked_rv and asked_rv != old_meta["resourceVersion"]:
            raise status.conflict(res.group, res.plural, name)
        for fixed in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
            else:
                meta.pop(fixed, None)
        stored = {k: v for k, v in body.items() if k not in ("kind", "apiVersion", "metadata")}
        stored = _fold_string_data(res, {"metadata": meta, **stored})
        if stored == old:
            return old
        if _spec_of(stored) != _spec_of(old):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        bucket[(ns, name)] = stored
        self._emit(EventRecord(rv, "MODIFIED", res, ns, stored, old))
        return stored

    def delete(
        self,
        res: ResourceType,
        namespace: str,
        name: str,
        *,
        precondition_rv: str | None = None,
        precondition_uid: str | None = None,
    ) -> Body:
        ns = namespace if res.namespaced else ""
        bucket = self.bucket(res)
        old = bucket.get((ns, name))
        if old is None:
            raise status.not_found(res.group, res.plural, name)
        if (precondition_rv and precondition_rv != old["metadata"]["resourceVersion"]) or (
            precondition_uid and precondition_uid != old["metadata"].get("uid")
        ):
            raise status.conflict(res.group, res.plural, name)
        if res.kind == "Namespace":
            # Namespace deletion takes its objects with it (immediately, no Terminating phase).
            for other, objs in list(self.objects.items()):
                if other.namespaced:
                    for key in [k for k in objs if k[0] == name]:
                        self.delete(other, name, key[1])
        del bucket[(ns, name)]
        self._sorted.pop(res, None)
        rv = self._next_rv()
        final = with_rv(old, rv)
        self._emit(EventRecord(rv, "DELETED", res, ns, final, old))
        return final

    def compact(self, rv: int | None = None) -> int:
        target = self.rv if rv is None else min(rv, self.rv)
        while self.history and self.history[0].rv <= target:
            self.history.popleft()
        self.compacted_rv = max(self.compacted_rv, target)
        return self.compacted_rv

    # -- watching --------------------------------------------------------------

    def add_watcher(self, watcher: Watcher) -> None:
        self.watchers.setdefault(watcher.res, set()).add(watcher)

    def remove_watcher(self, watcher: Watcher) -> None:
        self.watchers.get(watcher.res, set()).discard(watcher)

    def all_watchers(self) -> builtins.list[Watcher]:
        return [w for ws in self.watchers.values() for w in ws]

    def replay(self, watcher: Watcher, after_rv: int) -> None:
        """Queue the retained events of the watcher's resource with rv > after_rv."""
        # History is in rv order: skip to the first event after after_rv from the end.
        records = list(self.history)
        lo, hi = 0, len(records)
        while lo < hi:
            mid = (lo + hi) // 2
            if records[mid].rv <= after_rv:
                lo = mid + 1
            else:
                hi = mid
        for rec in records[lo:]:
            if rec.res is watcher.res:
                watcher.offer(rec)


def _fold_string_data(res: ResourceType, body: Body) -> Body:
    """A Secret's ``stringData`` merged into ``data`` (base64) and never stored, as the
    API server does; so the plain text of a Secret lives on only where a client
    copied it, e.g. kubectl apply's last-applied-configuration annotation."""
    if res.group or res.kind != "Secret" or "stringData" not in body:
        return body
    body = dict(body)
    plain = body.pop("stringData") or {}
    data = dict(body.get("data") or {})
    for key, value in plain.items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    body["data"] = data
    return body


def _spec_of(body: Body) -> Body:
    return {k: v for k, v in body.items() if k not in ("metadata", "status")}


# A continue token's resourceVersion for "the latest state" (the etcd3 store's -1).
LATEST = -1


def encode_continue(rv: int, last: Key) -> str:
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{last[0]}/{last[1]}"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, Key]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = orjson.loads(base64.urlsafe_b64decode(padded))
        ns, _, name = str(data["start"]).partition("/")
        return int(data["rv"]), (ns, name)
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise status.bad_request(f"invalid continue token: {exc}") from exc
