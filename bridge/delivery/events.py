"""Building events from changes: ids, subjects and the CloudEvents envelope are
those of bridge/ground/envelope.py (docs/events.md); here the object is projected,
redacted (Secret values, the last-applied annotation) and given its patch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
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
from bridge.delivery.routes import Router
from bridge.delivery.views import compile_projection, select
from bridge.ground.envelope import (
    EncodedData,
    Event,
    UtcStamp,
    held,
    nats_token,
    rfc3339,
    utc_now,
)
from bridge.kube.objects import RawObject, meta

REDACTED = "<redacted>"
# kubectl apply keeps the whole applied manifest here, Secret values included.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_SECRET_VALUE_FIELDS = ("data", "stringData")


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
        router: Router | None = None,
        clock: Callable[[], datetime] = utc_now,
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
            UtcStamp() if clock is utc_now else (lambda: rfc3339(clock()))
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
        # sink.routes: decided here, once per event, on the object as it came (before
        # projection and redaction, as a filter sees it).
        self._router = router

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
        if self._router is not None:
            routed = self._router.reads()
            if routed is None:
                return None
            keys |= routed
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
        if self._router is not None:
            event.routes = self._router.decide(obj, change.old, kind.value)
        if sealed:
            # Encoded here, the event just made: the parsed object is let go with it.
            event.encoded = held(orjson.dumps(event.to_dict()))
            event.data = EncodedData(event.encoded)
        return event


# Bounds the namespace-token cache: far above any cluster's namespace count.
_MAX_NAMESPACE_TOKENS = 10_000
