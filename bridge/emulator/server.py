"""The emulator: an aiohttp server that answers like a small Kubernetes API server.

``Emulator`` is both the HTTP server and a Python API over the same state, so a
test can change objects directly (``emu.create(...)``) and watch the change
arrive over HTTP, with the same rules either way.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import orjson
import yaml
from aiohttp import web

from bridge.emulator import status
from bridge.emulator.chaos import Chaos, ExpiredMode
from bridge.emulator.patching import APPLY, apply_patch
from bridge.emulator.resources import Registry, ResourceType, builtin_resources
from bridge.emulator.selectors import combine, parse_field_selector, parse_label_selector
from bridge.emulator.sharding import ShardSelector, parse_shard_selector
from bridge.emulator.store import (
    Body,
    Store,
    Watcher,
    bookmark_object,
    encode_event,
    full_object,
)
from bridge.emulator.tables import TableWatchEncoder, table
from bridge.errors import ApiStatusError, NotFoundError, status_error

log = logging.getLogger(__name__)
DEFAULT_WATCH_TIMEOUT = 1800.0
# The watch cache's last bookmark comes this long before a watch's timeoutSeconds.
PRE_TIMEOUT_BOOKMARK = 2.0
# The bearer token of the kubeconfig the emulator writes; its TokenReviews know only it.
EMULATOR_TOKEN = "emulator"
# Large answers go out in pieces of about this size, encoded as they are sent:
# 100k objects never sit in one buffer, and other requests are served between pieces.
WRITE_CHUNK = 256 * 1024
# A LIST with more items than this is streamed (chunked), as the API server's
# streaming list encoder does; smaller ones are one JSON body with a length.
STREAM_LIST_ITEMS = 500
VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One API request as the emulator received it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str = ""
    accept: str = ""


@dataclass(frozen=True, slots=True)
class ForbidRule:
    """Requests matching every given field get 403 (None matches anything)."""

    verb: str | None = None
    resource: str | None = None
    group: str | None = None
    namespace: str | None = None

    def matches(self, verb: str, group: str, resource: str, namespace: str | None) -> bool:
        return (
            (self.verb is None or self.verb == verb)
            and (self.resource is None or self.resource == resource)
            and (self.group is None or self.group == group)
            and (self.namespace is None or self.namespace == (namespace or ""))
        )


@dataclass(slots=True)
class _Target:
    res: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None = None
    extra: list[str] = field(default_factory=list)


def _json(body: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body),
        status=status_code,
        content_type="application/json",
        headers=headers,
    )


def _page_not_found() -> web.Response:
    return web.Response(text="404 page not found\n", status=404, content_type="text/plain")


def _status_response(err: ApiStatusError) -> web.Response:
    body = err.status or status.status(err.code, err.reason, str(err))
    headers = None
    if err.code == 429 or err.retry_after is not None:
        secs = (body.get("details") or {}).get("retryAfterSeconds", 1)
        headers = {"Retry-After": str(secs)}
    return _json(body, err.code, headers)


def _deep_copy(obj: Body) -> Body:
    # JSON objects only: an orjson round trip is several times faster than copy.deepcopy.
    out: Body = orjson.loads(orjson.dumps(obj))
    return out


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


class Emulator:
    """A Kubernetes API server emulator for tests, benchmarks and the demo."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 60.0,
        history_limit: int | None = None,
        watch_list: bool = True,
        expired_mode: Literal["event", "http"] = "event",
        sharded_list_watch: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.watch_list = watch_list
        # The ShardedListAndWatch gate: False ignores shardSelector (a server with the
        # gate off, or older than 1.36: everything is sent, nothing echoed).
        self.sharded_list_watch = sharded_list_watch
        self.user = "emulator-admin"
        # With watch_list=False: True answers sendInitialEvents with 422 (a 1.27-1.31 server
        # with the WatchList gate off); False ignores it (a server that predates it).
        self.reject_watch_list = False
        self.registry = Registry()
        for res in builtin_resources():
            self.registry.add(res)
        self.store = Store(history_limit=history_limit)
        self.chaos = Chaos(self, expired_mode)
        self.requests: builtins.list[RequestRecord] = []
        self.forbid_rules: builtins.list[ForbidRule] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        for ns in ("default", "kube-system", "kube-public"):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- lifecycle ---------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self.store.rv

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up ends its watch handler at once.
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=2.0,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        for watcher in self.store.all_watchers():
            watcher.stop("stop")
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Emulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- Python API --------------------------------------------------------------

    def register_resource(
        self,
        *,
        group: str,
        version: str,
        kind: str,
        plural: str,
        namespaced: bool = True,
        short_names: list[str] | None = None,
    ) -> None:
        self.registry.add(
            ResourceType(group, version, kind, plural, namespaced, tuple(short_names or ()))
        )

    def forbid(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        group: str | None = None,
        namespace: str | None = None,
    ) -> ForbidRule:
        """HTTP requests (and access reviews) matching the rule get 403 / allowed=false."""
        rule = ForbidRule(verb, resource, group, namespace)
        self.forbid_rules.append(rule)
        return rule

    def _resource(self, api_version: str, kind: str) -> ResourceType:
        res = self.registry.by_kind(api_version, kind)
        if res is None:
            raise NotFoundError(
                f"the server could not find the requested resource ({api_version} {kind})",
                reason="NotFound",
            )
        return res

    @staticmethod
    def _ns(res: ResourceType, namespace: str | None) -> str:
        return (namespace or "default") if res.namespaced else ""

    @staticmethod
    def _copy(res: ResourceType, body: Body) -> Body:
        return _deep_copy(full_object(res, body))

    def create(self, obj: Body) -> Body:
        res = self._resource(obj["apiVersion"], obj["kind"])
        ns = self._ns(res, (obj.get("metadata") or {}).get("namespace"))
        return self._copy(res, self.store.create(res, ns, _deep_copy(obj)))

    def update(self, obj: Body) -> Body:
        res = self._resource(obj["apiVersion"], obj["kind"])
        ns = self._ns(res, (obj.get("metadata") or {}).get("namespace"))
        return self._copy(res, self.store.update(res, ns, _deep_copy(obj)))

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: dict[str, Any],
        namespace: str | None = None,
    ) -> Body:
        res = self._resource(api_version, kind)
        ns = self._ns(res, namespace)
        return self._copy(res, self._patch(res, ns, name, patch, "application/merge-patch+json"))

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Body:
        res = self._resource(api_version, kind)
        return self._copy(res, self.store.delete(res, self._ns(res, namespace), name))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Body:
        res = self._resource(api_version, kind)
        return self._copy(res, self.store.get(res, self._ns(res, namespace), name))

    def list(
        self, api_version: str, kind: str, namespace: str | None = None
    ) -> builtins.list[Body]:
        res = self._resource(api_version, kind)
        items, _, _, _ = self.store.list_objects(res, namespace if res.namespaced else None, None)
        return [self._copy(res, b) for b in items]

    def write_kubeconfig(self, path: str | os.PathLike[str], context: str = "emulator") -> Path:
        if not self.url:
            raise RuntimeError("start the emulator before writing its kubeconfig")
        return write_kubeconfig(path, self.url, context)

    # -- shared rules ------------------------------------------------------------

    def _patch(self, res: ResourceType, ns: str, name: str, patch: Any, content_type: str) -> Body:
        try:
            current = self.store.get(res, ns, name)
        except NotFoundError:
            if content_type.startswith(APPLY) and isinstance(patch, dict):
                body = dict(patch)
                body.setdefault("metadata", {})["name"] = name
                return self.store.create(res, ns, body)
            raise
        if isinstance(patch, dict):
            asked = (patch.get("metadata") or {}).get("resourceVersion")
            if asked and asked != current["metadata"]["resourceVersion"]:
                raise status.conflict(res.group, res.plural, name)
        patched = apply_patch(full_object(res, current), patch, content_type)
        patched.setdefault("metadata", {})["name"] = name
        patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.store.update(res, ns, patched)

    # -- HTTP ------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_emulator/"):
            return await self._control(request)
        query = {k: v for k, v in request.query.items()}
        self.requests.append(
            RequestRecord(
                request.method,
                path,
                query,
                request.headers.get("Content-Type", ""),
                request.headers.get("Accept", ""),
            )
        )
        try:
            failure = self.chaos.take_failure()
            if failure is not None:
                code, retry_after = failure
                if code == 429:
                    raise status.too_many_requests(retry_after)
                raise status.internal_error()
            return await self._dispatch(request, path, query)
        except ApiStatusError as err:
            return _status_response(err)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # Malformed input the handlers did not foresee: answer as the server would.
            log.warning("emulator: %s %s failed: %r", request.method, path, exc)
            return _status_response(status.internal_error(f"Internal error occurred: {exc!r}"))

    async def _dispatch(
        self, request: web.Request, path: str, query: dict[str, str]
    ) -> web.StreamResponse:
        parts = [p for p in path.split("/") if p]
        if path == "/version" or path == "/version/":
            return _json(VERSION_INFO)
        if parts == ["api"]:
            return _json(self.registry.api_versions())
        if parts == ["apis"]:
            return _json(self.registry.api_group_list())
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 2:
            if len(parts) == 2:
                for g in self.registry.api_group_list()["groups"]:
                    if g["name"] == parts[1]:
                        return _json({"kind": "APIGroup", "apiVersion": "v1", **g})
                return _page_not_found()
            group, version, rest = parts[1], parts[2], parts[3:]
            if group not in self.registry.group_versions():
                # No handler serves that group: Go's mux answers, not the API.
                return _page_not_found()
        else:
            return _page_not_found()
        if not rest:
            doc = self.registry.resource_list(group, version)
            if doc is None:
                raise self._no_route()
            return _json(doc)
        target = self._target(group, version, rest)
        return await self._serve(request, target, query)

    @staticmethod
    def _no_route() -> ApiStatusError:
        return status.error(
            404, "NotFound", "the server could not find the requested resource", details={}
        )

    def _target(self, group: str, version: str, rest: builtins.list[str]) -> _Target:
        if len(rest) >= 3 and rest[0] == "namespaces":
            res = self.registry.by_plural(group, version, rest[2])
            if res is not None and res.namespaced:
                return _Target(
                    res,
                    rest[1],
                    rest[3] if len(rest) > 3 else None,
                    rest[4] if len(rest) > 4 else None,
                    rest[5:],
                )
        res = self.registry.by_plural(group, version, rest[0])
        if res is None or len(rest) > 3:
            raise self._no_route()
        return _Target(
            res, None, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        )

    def _check_allowed(self, verb: str, target: _Target) -> None:
        res = target.res
        for rule in self.forbid_rules:
            if rule.matches(verb, res.group, res.plural, target.namespace):
                raise status.forbidden(
                    self.user, verb, res.group, res.plural, target.namespace, target.name
                )

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        ctype = request.headers.get("Content-Type", "")
        if "protobuf" in ctype or "cbor" in ctype:
            # Only JSON is spoken; client-go falls back to JSON after a 415.
            raise status.unsupported_media(ctype)
        try:
            if "yaml" in ctype:
                return yaml.safe_load(raw)
            return orjson.loads(raw) if raw else {}
        except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
            raise status.bad_request(f"cannot decode request body: {exc}") from exc

    async def _serve(
        self, request: web.Request, target: _Target, query: dict[str, str]
    ) -> web.StreamResponse:
        res, method = target.res, request.method
        ns = target.namespace or ""
        as_table = "as=Table" in request.headers.get("Accept", "")
        if target.subresource not in (None, "status"):
            raise self._no_route()
        if method == "GET":
            if target.name is not None:
                self._check_allowed("get", target)
                body = self.store.get(res, ns, target.name)
                if as_table:
                    meta = {"resourceVersion": body["metadata"]["resourceVersion"]}
                    return _json(table(res, [body], meta, query.get("includeObject", "Metadata")))
                return _json(full_object(res, body))
            if _truthy(query.get("watch")):
                self._check_allowed("watch", target)
                return await self._watch(request, target, query, as_table)
            self._check_allowed("list", target)
            return await self._list(request, target, query, as_table)
        if method == "POST" and target.name is None:
            self._check_allowed("create", target)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise status.bad_request("request body must be an object")
            if res.kind in ("SelfSubjectAccessReview", "SubjectAccessReview"):
                return _json(self._access_review(body), 201)
            if res.kind == "TokenReview":
                return _json(self._token_review(body), 201)
            body_ns = (body.get("metadata") or {}).get("namespace")
            if res.namespaced and body_ns and body_ns != ns:
                raise status.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            created = self.store.create(res, ns, body)
            return _json(full_object(res, created), 201)
        if method == "PUT" and target.name is not None:
            self._check_allowed("update", target)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise status.bad_request("request body must be an object")
            name = (body.get("metadata") or {}).get("name")
            if name != target.name:
                raise status.bad_request(
                    "the name of the object does not match the name on the URL"
                )
            if target.subresource == "status":
                current = self.store.get(res, ns, target.name)
                body = {**current, "status": body.get("status"), "metadata": body["metadata"]}
            updated = self.store.update(res, ns, body)
            return _json(full_object(res, updated))
        if method == "PATCH" and target.name is not None:
            self._check_allowed("patch", target)
            patch = await self._body(request)
            ctype = request.headers.get("Content-Type", "application/merge-patch+json")
            if target.subresource == "status" and isinstance(patch, dict):
                patch = {k: v for k, v in patch.items() if k in ("status", "metadata")}
            patched = self._patch(res, ns, target.name, patch, ctype)
            return _json(full_object(res, patched))
        if method == "DELETE":
            if target.name is None:
                self._check_allowed("deletecollection", target)
                items = self._list_items(target, query)
                for body in items:
                    meta = body["metadata"]
                    self.store.delete(res, meta.get("namespace", ""), meta["name"])
                return _json(status.success({"kind": res.plural, "group": res.group}))
            self._check_allowed("delete", target)
            raw = await request.read()
            try:
                opts = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                opts = {}  # DeleteOptions in another encoding: only preconditions matter here
            pre = opts.get("preconditions") or {} if isinstance(opts, dict) else {}
            deleted = self.store.delete(
                res,
                ns,
                target.name,
                precondition_rv=pre.get("resourceVersion"),
                precondition_uid=pre.get("uid"),
            )
            meta = deleted["metadata"]
            return _json(
                status.success(
                    {
                        "name": meta["name"],
                        "group": res.group,
                        "kind": res.plural,
                        "uid": meta.get("uid"),
                    }
                )
            )
        raise status.error(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    def _token_review(self, body: Body) -> Body:
        # The emulator authenticates nobody itself; a review knows only its
        # kubeconfig's token, as the emulator's one user.
        token = (body.get("spec") or {}).get("token")
        status: Body = {"authenticated": False, "error": "invalid bearer token"}
        if token == EMULATOR_TOKEN:
            status = {"authenticated": True, "user": {"username": self.user, "groups": []}}
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": body.get("spec") or {},
            "status": status,
        }

    def _access_review(self, body: Body) -> Body:
        # A non-resource request (nonResourceAttributes) matches a forbid rule
        # whose resource is its path.
        spec = body.get("spec") or {}
        attrs = spec.get("resourceAttributes") or spec.get("nonResourceAttributes") or {}
        verb = attrs.get("verb", "")
        group = attrs.get("group", "")
        resource = attrs.get("resource") or attrs.get("path") or ""
        namespace = attrs.get("namespace") or None
        denied = any(r.matches(verb, group, resource, namespace) for r in self.forbid_rules)
        out = {
            "kind": body.get("kind") or "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": body.get("spec") or {},
            "status": {"allowed": not denied},
        }
        if denied:
            out["status"] = {"allowed": False, "reason": "denied by an emulator forbid rule"}
        return out

    def _matcher(self, res: ResourceType, query: dict[str, str]) -> Any:
        return combine(
            parse_label_selector(query.get("labelSelector")),
            parse_field_selector(query.get("fieldSelector"), res.selectable_fields),
        )

    def _shard(self, query: dict[str, str]) -> ShardSelector | None:
        """The request's shard selector; parsed, as the server does, after the
        request's other options were validated (its store parses it)."""
        if not self.sharded_list_watch:
            return None
        return parse_shard_selector(query.get("shardSelector"))

    def _list_items(self, target: _Target, query: dict[str, str]) -> builtins.list[Body]:
        items, _, _, _ = self.store.list_objects(
            target.res, target.namespace, self._matcher(target.res, query)
        )
        return items

    @staticmethod
    def _parse_rv(raw: str, *, watch: bool = False) -> int:
        try:
            if not raw.isdigit():
                raise ValueError(raw)
            return int(raw)
        except ValueError:
            why = (
                f'resourceVersion: Invalid value: "{raw}": strconv.ParseUint: '
                f'parsing "{raw}": invalid syntax'
            )
            if watch:
                # The watch path hands the storage error on untranslated: a bare 500.
                body = {**status.status(500, "", why), "code": 500}
                body.pop("reason")
                raise status_error(body) from None
            raise status.bad_request(f"invalid resource version: {why}") from None

    async def _list(
        self, request: web.Request, target: _Target, query: dict[str, str], as_table: bool
    ) -> web.StreamResponse:
        res = target.res
        matcher = self._matcher(res, query)
        rv_raw = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        limit_raw = query.get("limit")
        limit = int(limit_raw) if limit_raw and limit_raw.isdigit() and int(limit_raw) > 0 else None
        cont = query.get("continue") or None
        self._validate_list_options(query)
        shard = self._shard(query)
        if shard is not None:
            matcher = combine(matcher, shard.matcher())
        if cont and rv_raw not in ("", "0"):
            raise status.bad_request(
                "specifying resource version is not allowed when using continue"
            )
        if rv_raw == "0" and not cont:
            # Like the watch cache: RV=0 lists are served whole, the limit is ignored.
            limit = None
        exact: int | None = None
        if rv_raw and rv_raw != "0" and not cont:
            rv = self._parse_rv(rv_raw)
            # A resourceVersion with a limit and no match is Exact (the legacy rule).
            if match == "Exact" or (not match and limit):
                exact = rv
            elif rv > self.store.rv:
                raise status.too_large_rv(rv, self.store.rv)
        items, list_rv, token, remaining = self.store.list_objects(
            res,
            target.namespace,
            matcher,
            limit=limit,
            continue_token=cont,
            exact_rv=exact,
        )
        if not rv_raw and not cont:
            self.store.caught_up(res)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if token:
            meta["continue"] = token
            if matcher is None and remaining is not None:
                meta["remainingItemCount"] = remaining
        if shard is not None:
            meta["shardInfo"] = {"selector": shard.echo()}
        if as_table:
            return _json(table(res, items, meta, query.get("includeObject", "Metadata")))
        head = {"kind": res.list_kind, "apiVersion": res.api_version, "metadata": meta}
        if len(items) <= STREAM_LIST_ITEMS:
            return _json({**head, "items": items})
        return await self._stream_list(request, head, items)

    async def _stream_list(
        self, request: web.Request, head: Body, items: builtins.list[Body]
    ) -> web.StreamResponse:
        """The same bytes as one ``orjson.dumps`` of the list, written in pieces.

        ``items`` is a snapshot of stored bodies, which are never mutated, so
        changes made while the pieces go out do not reach this answer.
        """
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        dumps = orjson.dumps
        piece = [dumps(head)[:-1] + b',"items":[']
        size = 0
        try:
            for i, body in enumerate(items):
                line = dumps(body)
                piece.append(b"," + line if i else line)
                size += len(line)
                if size >= WRITE_CHUNK:
                    await resp.write(b"".join(piece))
                    piece.clear()
                    size = 0
            piece.append(b"]}")
            await resp.write(b"".join(piece))
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            self._abort(request)
        return resp

    async def _watch(
        self, request: web.Request, target: _Target, query: dict[str, str], as_table: bool
    ) -> web.StreamResponse:
        res = target.res
        store = self.store
        matcher = self._matcher(res, query)
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        rv_raw = query.get("resourceVersion", "")
        timeout_raw = query.get("timeoutSeconds")
        timeout = float(timeout_raw) if timeout_raw else DEFAULT_WATCH_TIMEOUT
        send_initial = self.watch_list and "sendInitialEvents" in query
        initial_events = send_initial and _truthy(query.get("sendInitialEvents"))
        self._validate_watch_options(query)
        shard = self._shard(query)
        if shard is not None:
            matcher = combine(matcher, shard.matcher())
        encoder = TableWatchEncoder(query.get("includeObject", "Metadata")) if as_table else None
        watcher = Watcher(res, target.namespace, matcher, encoder)
        start_rv = store.rv
        # sendInitialEvents defaults to true for RV ""/"0" (the legacy synthetic ADDEDs);
        # an explicit false there means "from now on, nothing before".
        synthetic = initial_events or (rv_raw in ("", "0") and not send_initial)
        if synthetic:
            asked = 0 if rv_raw in ("", "0") else self._parse_rv(rv_raw, watch=True)
            if asked > store.rv:
                # The watch cache waited (3 s) for a version it never reached; it says
                # so in the stream, as it says every failure after the request was read.
                return await self._error_event(request, status.too_large_rv(asked, store.rv))
            items, _, _, _ = store.list_objects(res, target.namespace, matcher)
            if initial_events and not rv_raw:
                store.caught_up(res)  # a streaming list from "" is a consistent read
            # Encoded as they are written; the watcher is registered below with no await
            # in between, so every later change queues behind this snapshot.
            # The end of the initial events is marked only for a watch that takes bookmarks.
            watcher.initial = self._initial_lines(
                watcher, items, start_rv if initial_events and bookmarks else None
            )
        elif rv_raw in ("", "0"):
            pass
        else:
            from_rv = self._parse_rv(rv_raw, watch=True)
            # A watch from a version the server has not reached is served, as the watch
            # cache serves it: only events after that version, whenever they come.
            watcher.after_rv = from_rv
            if from_rv < store.compacted_rv:
                err = status.too_old(from_rv, store.compacted_rv)
                if self.chaos.expired_mode == "http":
                    raise err
                return await self._error_event(request, err)
            store.replay(watcher, from_rv)
            # Bookmarks must pass what the watch starts from, replayed events included.
            start_rv = max(from_rv, watcher.pending[-1][0]) if watcher.pending else from_rv
        store.add_watcher(watcher)
        try:
            return await self._stream(request, watcher, start_rv, bookmarks, timeout)
        finally:
            store.remove_watcher(watcher)

    @staticmethod
    async def _error_event(request: web.Request, err: ApiStatusError) -> web.StreamResponse:
        """A watch that fails once it was accepted: HTTP 200, one ERROR event, the end."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(encode_event("ERROR", err.status))
        await resp.write_eof()
        return resp

    @staticmethod
    def _validate_list_options(query: dict[str, str]) -> None:
        """The API server's ListOptions validation for a LIST, in its order and words."""
        forbidden = status.forbidden_option
        errors: builtins.list[tuple[str, str, str]] = []
        match = query.get("resourceVersionMatch", "")
        rv_raw = query.get("resourceVersion", "")
        if match:
            if not rv_raw:
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )
                )
            if query.get("continue"):
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    )
                )
            if match not in ("Exact", "NotOlderThan"):
                errors.append(
                    status.unsupported_option(
                        "resourceVersionMatch", match, ("Exact", "NotOlderThan", "")
                    )
                )
            if match == "Exact" and rv_raw == "0":
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        if "sendInitialEvents" in query:
            errors.append(forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
        if errors:
            raise status.invalid_options(*errors)

    def _validate_watch_options(self, query: dict[str, str]) -> None:
        """The API server's ListOptions validation for a WATCH, in its order and words.

        allowWatchBookmarks is not among them: a streaming list without it is served,
        without the initial-events-end bookmark.
        """
        forbidden = status.forbidden_option
        errors: builtins.list[tuple[str, str, str]] = []
        has_initial = "sendInitialEvents" in query
        if not self.watch_list and not self.reject_watch_list:
            return  # a server that predates streaming lists: the parameters mean nothing
        match = query.get("resourceVersionMatch", "")
        if has_initial:
            if match != "NotOlderThan":
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    )
                )
            if not self.watch_list:
                errors.append(
                    forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature "
                        "gate is enabled",
                    )
                )
        if match:
            if not has_initial:
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                        "is provided",
                    )
                )
            if match != "NotOlderThan":
                errors.append(
                    status.unsupported_option("resourceVersionMatch", match, ("NotOlderThan",))
                )
            if query.get("continue"):
                errors.append(
                    forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    )
                )
        if errors:
            raise status.invalid_options(*errors)

    @staticmethod
    def _initial_lines(
        watcher: Watcher, items: builtins.list[Body], end_rv: int | None
    ) -> Iterator[bytes]:
        for body in items:
            yield watcher.encode("ADDED", body)
        if end_rv is not None:
            end = bookmark_object(watcher.res, end_rv, True)
            if watcher.encoder is not None:
                yield watcher.encode("BOOKMARK", end)
            else:
                yield encode_event("BOOKMARK", end)

    def _bookmark_line(self, watcher: Watcher, rv: int) -> bytes:
        obj = bookmark_object(watcher.res, rv)
        if watcher.encoder is not None:
            return watcher.encode("BOOKMARK", {"metadata": obj["metadata"]})
        return encode_event("BOOKMARK", obj)

    def _bookmark_rv(self, watcher: Watcher, last_rv: int) -> int:
        # What the resource's watch cache has seen: not the changes to other kinds.
        return max(last_rv, self.store.seen_rv.get(watcher.res, 0))

    def _next_bookmark(self, now: float, deadline: float) -> float | None:
        """When the next bookmark is due, as the watch cache schedules them: every
        interval (a minute on the real server) and 2 s before the watch's deadline,
        the last one; None when that moment has passed (no bookmark at the close)."""
        due = min(now + self.bookmark_interval, deadline - PRE_TIMEOUT_BOOKMARK)
        return due if due > now else None

    async def _stream(
        self,
        request: web.Request,
        watcher: Watcher,
        last_rv: int,
        bookmarks: bool,
        timeout: float,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        deadline = loop.time() + timeout
        next_bookmark = self._next_bookmark(loop.time(), deadline)
        # The watch cache sends no bookmark at or before the version a watch started from:
        # a watch of a resource that has not changed since gets none.
        floor = last_rv
        try:
            while True:
                if watcher.kill == "stop":
                    break
                if watcher.kill is not None:
                    if watcher.kill == "truncate":
                        line = next(watcher.initial, None) if watcher.initial else None
                        if line is None:
                            line = (
                                watcher.pending[0][1]
                                if watcher.pending
                                else self._bookmark_line(
                                    watcher, self._bookmark_rv(watcher, last_rv)
                                )
                            )
                        await resp.write(line[: max(1, len(line) // 2)])
                    self._abort(request)
                    return resp
                wait: float | None = None
                if not self.chaos.stalled:
                    if watcher.initial is not None:
                        chunk = _take(watcher.initial, WRITE_CHUNK)
                        if chunk:
                            await resp.write(chunk)
                            continue
                        watcher.initial = None
                    if watcher.pending:
                        lines = []
                        size = 0
                        while watcher.pending and size < WRITE_CHUNK:
                            rv, line = watcher.pending.popleft()
                            last_rv = max(last_rv, rv)
                            lines.append(line)
                            size += len(line)
                        await resp.write(b"".join(lines))
                        continue
                    now = loop.time()
                    if now >= deadline:
                        break
                    if bookmarks and next_bookmark is not None and now >= next_bookmark:
                        last_rv = self._bookmark_rv(watcher, last_rv)
                        next_bookmark = self._next_bookmark(now, deadline)
                        if last_rv > floor:
                            await resp.write(self._bookmark_line(watcher, last_rv))
                        continue
                    wake_at = deadline
                    if bookmarks and next_bookmark is not None:
                        wake_at = min(deadline, next_bookmark)
                    wait = wake_at - now
                watcher.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await watcher.wake.wait()
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            # The client went away mid-write; nothing left to tell it.
            self._abort(request)
        return resp

    @staticmethod
    def _abort(request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()

    # -- control endpoints -------------------------------------------------------

    async def _control(self, request: web.Request) -> web.StreamResponse:
        action = request.path[len("/_emulator/") :].strip("/")
        raw = await request.read()
        args: dict[str, Any] = orjson.loads(raw) if raw else {}
        args.update(request.query)
        try:
            result: Any = None
            if action == "drop_watches":
                result = self.chaos.drop_watches()
            elif action == "truncate_watches":
                result = self.chaos.truncate_watches()
            elif action == "stall_watches":
                self.chaos.stall_watches()
            elif action == "resume_watches":
                self.chaos.resume_watches()
            elif action == "fail_next":
                self.chaos.fail_next(
                    int(args.get("n", 1)),
                    int(args.get("status", 500)),
                    float(args.get("retry_after", 1.0)),
                )
            elif action == "compact":
                rv = args.get("rv")
                result = self.chaos.compact(int(rv) if rv is not None else None)
            elif action == "expired_mode":
                mode: ExpiredMode = "http" if args.get("mode") == "http" else "event"
                self.chaos.set_expired_mode(mode)
            elif action == "huge_object":
                result = self.chaos.huge_object(
                    str(args.get("name", "huge")),
                    str(args.get("namespace", "default")),
                    int(args.get("size", 2 * 1024 * 1024)),
                )["metadata"]
            elif action == "register_resource":
                self.register_resource(
                    group=str(args["group"]),
                    version=str(args["version"]),
                    kind=str(args["kind"]),
                    plural=str(args["plural"]),
                    namespaced=str(args.get("namespaced", True)).lower() not in ("false", "0"),
                    short_names=list(args.get("short_names") or []),
                )
            elif action == "forbid":
                self.forbid(
                    verb=args.get("verb"),
                    resource=args.get("resource"),
                    group=args.get("group"),
                    namespace=args.get("namespace"),
                )
            elif action == "requests":
                result = [
                    {"method": r.method, "path": r.path, "query": r.query} for r in self.requests
                ]
            elif action == "state":
                result = {
                    "resourceVersion": self.store.rv,
                    "compactedResourceVersion": self.store.compacted_rv,
                    "watchers": len(self.store.all_watchers()),
                }
            else:
                return _json({"error": f"unknown action {action!r}"}, 404)
        except (KeyError, ValueError, TypeError) as exc:
            return _json({"error": str(exc)}, 400)
        return _json({"ok": True, "result": result})


def _take(lines: Iterator[bytes], limit: int) -> bytes:
    """Lines from ``lines`` joined, until ``limit`` bytes or the end."""
    out: builtins.list[bytes] = []
    size = 0
    for line in lines:
        out.append(line)
        size += len(line)
        if size >= limit:
            break
    return b"".join(out)


def write_kubeconfig(path: str | os.PathLike[str], url: str, context: str = "emulator") -> Path:
    """A kubeconfig pointing at ``url`` with a dummy token (the emulator does not authenticate)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": f"{context}-admin", "user": {"token": EMULATOR_TOKEN}}],
        "contexts": [
            {
                "name": context,
                "context": {"cluster": context, "user": f"{context}-admin", "namespace": "default"},
            }
        ],
        "current-context": context,
        "preferences": {},
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out
