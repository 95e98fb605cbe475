"""LIST and WATCH of one resource in one scope, as raw JSON (client-go's ListWatch)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar, cast

import orjson

from bridge.errors import NotFoundError
from bridge.kube.client import KubeClient
from bridge.kube.discovery import ResourceInfo
from bridge.kube.liststream import ItemDecoder, ListBody
from bridge.kube.objects import ListResponse, RawObject, WatchEvent
from bridge.kube.protocols import ListOptions, ListStream, WatchOptions
from bridge.kube.rawjson import ObjectDecoder
from bridge.kube.shardfilter import ShardedListBody, ShardFilter
from bridge.kube.sharding import ShardRange

T = TypeVar("T")

# Metadata only: the API server answers with PartialObjectMetadata(List), each
# object its apiVersion, kind and metadata; the rest of the object never travels.
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_PARTIAL = "PartialObjectMetadata"


class ListWatch:
    """``ListerWatcher`` for one resource in one namespace (or all, when ``namespace`` is None).

    Selectors go to the server. LIST items come back without kind/apiVersion
    (as the API server sends them); they are filled in so downstream code can
    name the object.

    ``decoder``: objects from ``list_stream`` and ``watch`` keep the top-level
    values nobody reads as the server's bytes (bridge/kube/rawjson.py); None
    parses them whole.

    ``shard``: only the objects in this slice of the hash space (bridge/kube/sharding.py).
    ``shardSelector`` goes with every LIST page, WATCH and streaming list. A LIST
    page whose ``metadata.shardInfo.selector`` echoes it was filtered by the server
    and is trusted; any other page is filtered here with the same hash. A watch
    carries no echo (not even the initial-events-end bookmark of a streaming list),
    so its objects are always checked (bridge/kube/shardfilter.py), which keeps the
    result exact behind API servers that disagree (a rolling upgrade, the gate on
    some and off others). Before a watch, a ListWatch that has not listed yet asks
    with a one-object LIST whether the server applies the selector.

    ``metadata_only``: lists and watches ask for ``PartialObjectMetadata``; each
    object comes back as apiVersion, kind and metadata, renamed here to the
    resource's own apiVersion and kind, so ids, keys and events name it as usual.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: ResourceInfo,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        decoder: ObjectDecoder | None = None,
        shard: ShardRange | None = None,
        metadata_only: bool = False,
    ) -> None:
        self.client = client
        self.decoder = decoder
        self.metadata_only = metadata_only
        self._list_accept = METADATA_LIST_ACCEPT if metadata_only else "application/json"
        self._watch_accept = METADATA_ACCEPT if metadata_only else "application/json"
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.shard = shard
        self.path = resource.path(namespace)
        self._filter = (
            ShardFilter(
                shard, resource=f"{resource.api_version}/{resource.plural}", namespace=namespace
            )
            if shard is not None
            else None
        )

    def __repr__(self) -> str:
        scope = self.namespace or "*"
        shard = f" shard {self.shard.label()}" if self.shard is not None else ""
        return f"ListWatch({self.resource.api_version} {self.resource.plural} in {scope}{shard})"

    @property
    def shard_honoured(self) -> bool | None:
        """Whether the API server applies ``shardSelector``: None until a LIST answer
        (or an object outside the shard on a watch) says; always None without a shard."""
        return self._filter.honoured if self._filter is not None else None

    @property
    def client_filtered(self) -> int:
        """Objects dropped here because the server sent them although outside the shard."""
        return self._filter.dropped if self._filter is not None else 0

    def _not_served(self, e: NotFoundError) -> NotFoundError:
        """A 404 for the collection itself: discovery served the resource when the
        pipeline started, so it went away since (a CustomResourceDefinition deleted;
        the real server answers a bare "404 page not found", naming nothing)."""
        r = self.resource
        return NotFoundError(
            f"the API server no longer serves {r.plural} of {r.api_version} ({e}); "
            "was its CustomResourceDefinition deleted?",
            code=404,
            reason=e.reason,
            status=e.status,
        )

    @asynccontextmanager
    async def _opened(self, cm: AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
        """``cm`` entered, its 404 named (``_not_served``); errors once open pass as they are."""
        async with AsyncExitStack() as stack:
            try:
                value = await stack.enter_async_context(cm)
            except NotFoundError as e:
                raise self._not_served(e) from e
            yield value

    def _selectors(self, params: dict[str, str | int | bool]) -> None:
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        if self.shard is not None:
            params["shardSelector"] = self.shard.selector()

    def _list_params(self, options: ListOptions) -> dict[str, str | int | bool]:
        params: dict[str, str | int | bool] = {}
        self._selectors(params)
        if options.resource_version is not None:
            params["resourceVersion"] = options.resource_version
        if options.resource_version_match:
            params["resourceVersionMatch"] = options.resource_version_match
        if options.limit:
            params["limit"] = options.limit
        if options.continue_token:
            params["continue"] = options.continue_token
        if options.timeout_seconds:
            params["timeoutSeconds"] = options.timeout_seconds
        return params

    async def list(self, options: ListOptions) -> ListResponse:
        if self.decoder is not None:
            # Decoded as the reflector's lists are, so fingerprints agree with theirs.
            items: list[Any] = []
            async with self.list_stream(options) as body:
                async for batch in body:
                    items.extend(batch)
            listed: ListResponse = {
                "apiVersion": self.resource.api_version,
                "kind": f"{self.resource.kind}List",
                "metadata": body.metadata,
                "items": items,
            }
            return listed
        params = self._list_params(options)
        try:
            result = await self.client.request_json(
                "GET", self.path, params=params, accept=self._list_accept
            )
        except NotFoundError as e:
            raise self._not_served(e) from e
        kind = self.resource.kind
        api_version = self.resource.api_version
        for item in result.get("items") or ():
            if "kind" not in item or item["kind"] == _PARTIAL:
                item["kind"] = kind
                item["apiVersion"] = api_version
        if self._filter is not None and not self._filter.judge(result.get("metadata")):
            result["items"] = self._filter.keep(result.get("items") or [])
        return cast(ListResponse, result)

    @asynccontextmanager
    async def list_stream(self, options: ListOptions) -> AsyncIterator[ListStream]:
        params = self._list_params(options)
        decode: ItemDecoder = self.decoder.object if self.decoder is not None else orjson.loads
        if self.metadata_only:
            decode = self._renamed(decode)
        f = self._filter
        stream = self.client.stream_body("GET", self.path, params, accept=self._list_accept)
        async with self._opened(stream) as chunks:
            if f is not None:
                decode = f.item_decoder(decode, lambda: body.partial_metadata)
            body = ListBody(
                chunks,
                kind=self.resource.kind,
                api_version=self.resource.api_version,
                what=f"GET {self.path}",
                decode=decode,
            )
            try:
                yield body if f is None else ShardedListBody(body, f)
            finally:
                # Its read-ahead task must let go of the body before the stream closes.
                await body.aclose()

    def watch(
        self, options: WatchOptions
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        params: dict[str, str | int | bool] = {"watch": 1}
        self._selectors(params)
        if options.resource_version is not None:
            params["resourceVersion"] = options.resource_version
        if options.timeout_seconds:
            params["timeoutSeconds"] = options.timeout_seconds
        if options.allow_watch_bookmarks:
            params["allowWatchBookmarks"] = True
        if options.send_initial_events is not None:
            params["sendInitialEvents"] = options.send_initial_events
        if options.resource_version_match:
            params["resourceVersionMatch"] = options.resource_version_match
        decode: Callable[[bytes], Any] = (
            self.decoder.watch_event if self.decoder is not None else orjson.loads
        )
        if self.metadata_only:
            decode = self._renamed_events(decode)
        if self._filter is not None:
            decode = self._filter.watch_decoder(decode)
        stream: AbstractAsyncContextManager[AsyncIterator[Any]] = self.client.stream_decoded(
            "GET", self.path, params, decode=decode, accept=self._watch_accept
        )
        if self._filter is None:
            return self._opened(stream)
        return self._sharded_watch(stream, self._filter)

    def _renamed(self, decode: ItemDecoder) -> ItemDecoder:
        """``decode``, then a PartialObjectMetadata named as the resource's object."""
        kind, api_version = self.resource.kind, self.resource.api_version

        def renamed(data: bytearray) -> RawObject | None:
            obj = decode(data)
            if obj is not None and obj.get("kind") == _PARTIAL:
                obj["kind"] = kind
                obj["apiVersion"] = api_version
            return obj

        return renamed

    def _renamed_events(self, decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        kind, api_version = self.resource.kind, self.resource.api_version

        def renamed(line: bytes) -> Any:
            event = decode(line)
            obj = event.get("object") if isinstance(event, dict) else None
            if isinstance(obj, dict) and obj.get("kind") == _PARTIAL:
                obj["kind"] = kind
                obj["apiVersion"] = api_version
            return event

        return renamed

    @asynccontextmanager
    async def _sharded_watch(
        self, stream: AbstractAsyncContextManager[AsyncIterator[Any]], f: ShardFilter
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        if f.honoured is None:
            await self.probe_shard()
        async with self._opened(stream) as events:
            yield f.watch(events)

    async def probe_shard(self) -> bool | None:
        """``shard_honoured`` as one LIST of at most one object says (None without a
        shard). A watch that cannot say (a resumed watch, a streaming list) asks this
        first; ``check`` asks it too. Raises ``KubeError`` as that LIST would."""
        if self._filter is None:
            return None
        params: dict[str, str | int | bool] = {"limit": 1}
        self._selectors(params)
        try:
            result = await self.client.request_json(
                "GET", self.path, params=params, accept=self._list_accept
            )
        except NotFoundError as e:
            raise self._not_served(e) from e
        self._filter.judge(result.get("metadata"))
        return self._filter.honoured
