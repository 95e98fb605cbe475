"""The same list/watch assertions against the emulator and a real kube-apiserver.

Every test takes ``api``: the in-repo emulator (``tests/fixtures/emulator.py``)
or the session's kube-apiserver + etcd (``kube_cluster``), behind one small
adapter, and speaks raw HTTP with aiohttp as the bridge does. The assertions
are the behaviours the bridge relies on (paginated and resourceVersion LISTs,
watches from an RV, bookmarks, streaming lists, 410 after compaction, the
error bodies it turns into one line). Where the emulator differs from the real
server on purpose, the branch says why; docs/emulator-fidelity.md lists each.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from bridge.emulator import Emulator
from bridge.kube.objects import INITIAL_EVENTS_END_ANNOTATION
from bridge.kube.sharding import fnv1a64
from tests.fixtures.kube import KubeCluster

Body = dict[str, Any]


@dataclass
class Api:
    """One API server under test, and the few things a test does to it besides HTTP."""

    kind: str  # "emulator" | "real"
    url: str
    namespace: str
    token: str
    ssl: ssl.SSLContext | bool
    emulator: Emulator | None = None
    cluster: KubeCluster | None = None

    @property
    def is_emulator(self) -> bool:
        return self.emulator is not None

    def cm_path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps" + (f"/{name}" if name else "")

    def create_cm(self, name: str, **labels: str) -> Body:
        meta: Body = {"name": name, "namespace": self.namespace}
        if labels:
            meta["labels"] = labels
        return self.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}
        )

    def create(self, obj: Body) -> Body:
        if self.emulator is not None:
            return self.emulator.create(obj)
        assert self.cluster is not None
        return self.cluster.create(obj)

    def patch_cm(self, name: str, data: dict[str, str]) -> Body:
        if self.emulator is not None:
            return self.emulator.patch("v1", "ConfigMap", name, {"data": data}, self.namespace)
        assert self.cluster is not None
        return self.cluster.patch("v1", "ConfigMap", name, {"data": data}, self.namespace)

    def patch_labels(self, name: str, labels: dict[str, str]) -> Body:
        patch = {"metadata": {"labels": labels}}
        if self.emulator is not None:
            return self.emulator.patch("v1", "ConfigMap", name, patch, self.namespace)
        assert self.cluster is not None
        return self.cluster.patch("v1", "ConfigMap", name, patch, self.namespace)

    def delete_cm(self, name: str) -> None:
        if self.emulator is not None:
            self.emulator.delete("v1", "ConfigMap", name, self.namespace)
        else:
            assert self.cluster is not None
            self.cluster.delete("v1", "ConfigMap", name, self.namespace)

    def compact(self) -> None:
        """Compact the storage at its current version: LISTs that reach it at an older
        version get 410. On the emulator that is its whole history, so watches, exact
        LISTs and continue tokens from before now 410 at once."""
        if self.emulator is not None:
            self.emulator.chaos.compact()
        else:
            assert self.cluster is not None
            self.cluster.compact()

    def forget_watch_cache(self) -> None:
        """The real server's watch cache keeps serving watches, exact-RV LISTs and continue
        tokens (from its snapshots, since 1.34) out of its own history, and never learns
        of a compaction it did not make itself: only a new kube-apiserver forgets it."""
        if self.cluster is not None:
            self.cluster.restart_apiserver()

    def denied_token(self) -> str:
        """A token whose user may not list or watch Secrets in the namespace."""
        if self.emulator is not None:
            # By design: the emulator authenticates nobody; a forbid rule stands in for RBAC.
            self.emulator.forbid(resource="secrets", namespace=self.namespace)
            return "emulator"
        assert self.cluster is not None
        return self.cluster.service_account_token(self.namespace, "no-rights")

    @asynccontextmanager
    async def session(self, token: str | None = None) -> AsyncIterator[aiohttp.ClientSession]:
        headers = {"Authorization": f"Bearer {token or self.token}", "Accept": "application/json"}
        connector = aiohttp.TCPConnector(ssl=self.ssl)
        async with aiohttp.ClientSession(self.url, headers=headers, connector=connector) as s:
            yield s


def _api(request: pytest.FixtureRequest, *, sharded: bool) -> Api:
    """The emulator or kube-apiserver, with a fresh namespace; ``sharded`` False: the
    ShardedListAndWatch gate off (shardSelector ignored)."""
    if request.param == "emulator":
        emu: Emulator = request.getfixturevalue("emulator")
        emu.sharded_list_watch = sharded
        ns = f"conf-{uuid.uuid4().hex[:8]}"
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        return Api("emulator", emu.url, ns, "emulator", False, emulator=emu)
    fixture = "kube_cluster" if sharded else "kube_cluster_unsharded"
    cluster: KubeCluster = request.getfixturevalue(fixture)
    ns = request.getfixturevalue("kube_namespace")
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    return Api("real", cluster.url, ns, cluster.admin_token, ctx, cluster=cluster)


@pytest.fixture(params=["emulator", "real"])
def api(request: pytest.FixtureRequest) -> Api:
    return _api(request, sharded=True)


@pytest.fixture(params=["emulator", "real"])
def unsharded(request: pytest.FixtureRequest) -> Api:
    """``api`` with the ShardedListAndWatch gate off: it ignores shardSelector."""
    return _api(request, sharded=False)


# -- HTTP helpers ---------------------------------------------------------------------


async def get(api: Api, path: str, token: str | None = None, **params: str) -> tuple[int, Any]:
    async with api.session(token) as http, http.get(path, params=params) as r:
        raw = await r.read()
        try:
            return r.status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return r.status, raw.decode(errors="replace")


class Watch:
    """An open watch: its events as they arrive, each with the time it arrived."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.opened = time.monotonic()

    async def next(self, timeout: float = 10.0) -> Body:
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        assert line, "watch stream ended"
        event: Body = orjson.loads(line)
        return event

    async def until_close(self, timeout: float = 15.0) -> list[tuple[float, Body]]:
        """Every event until the server ends the stream, with seconds since it opened."""
        out: list[tuple[float, Body]] = []

        async def read() -> None:
            async for line in self.resp.content:
                if line.strip():
                    out.append((time.monotonic() - self.opened, orjson.loads(line)))

        await asyncio.wait_for(read(), timeout)
        return out


@asynccontextmanager
async def watch(api: Api, path: str, **params: str) -> AsyncIterator[Watch]:
    async with api.session() as http, http.get(path, params={"watch": "1", **params}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("application/json")
        yield Watch(r)


def names(items: list[Body]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def kinds_and_names(events: list[Body]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def rv_of(obj: Body) -> int:
    return int(obj["metadata"]["resourceVersion"])


def assert_status(body: Any, code: int, reason: str) -> None:
    assert isinstance(body, dict), body
    assert body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == "Failure", body
    assert body["metadata"] == {} or set(body["metadata"]) == {"continue"}, body
    assert (body["code"], body["reason"]) == (code, reason), body


def continue_rv(token: str) -> int:
    """The resourceVersion a continue token pins (both servers encode it the same way)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return int(orjson.loads(raw)["rv"])


# -- LIST ------------------------------------------------------------------------------


async def test_paginated_list_is_one_snapshot_with_remaining_counts(api: Api) -> None:
    for i in range(5):
        api.create_cm(f"cm{i}")
    code, page1 = await get(api, api.cm_path(), limit="2")
    assert code == 200
    assert (page1["kind"], page1["apiVersion"]) == ("ConfigMapList", "v1")
    assert names(page1["items"]) == ["cm0", "cm1"]
    assert "kind" not in page1["items"][0] and "apiVersion" not in page1["items"][0]
    assert page1["metadata"]["remainingItemCount"] == 3
    # Changes after the first page do not reach the later pages: one snapshot.
    api.create_cm("cm9")
    api.delete_cm("cm4")
    token = page1["metadata"]["continue"]
    code, page2 = await get(api, api.cm_path(), limit="2", **{"continue": token})
    assert code == 200 and names(page2["items"]) == ["cm2", "cm3"]
    assert page2["metadata"]["remainingItemCount"] == 1
    code, page3 = await get(
        api, api.cm_path(), limit="2", **{"continue": page2["metadata"]["continue"]}
    )
    assert code == 200 and names(page3["items"]) == ["cm4"]
    assert "continue" not in page3["metadata"] and "remainingItemCount" not in page3["metadata"]
    rvs = {p["metadata"]["resourceVersion"] for p in (page1, page2, page3)}
    assert len(rvs) == 1
    assert continue_rv(token) == int(rvs.pop())
    # A continue token carries its snapshot: repeating the resourceVersion is refused.
    code, body = await get(
        api, api.cm_path(), limit="2", resourceVersion=page1["metadata"]["resourceVersion"],
        **{"continue": token},
    )  # fmt: skip
    assert_status(body, 400, "BadRequest")
    assert body["message"] == "specifying resource version is not allowed when using continue"


async def test_paginated_list_with_a_selector_has_no_count(api: Api) -> None:
    api.create_cm("a", app="web")
    api.create_cm("b", app="web")
    api.create_cm("c")
    code, page1 = await get(api, api.cm_path(), limit="2", labelSelector="app=web")
    assert code == 200 and names(page1["items"]) == ["a", "b"]
    # With a selector the server cannot count what is left, and since it does not
    # look ahead for another match, the page that filled the limit still offers
    # a continue when unmatched items follow: the next page is empty.
    assert "remainingItemCount" not in page1["metadata"]
    token = page1["metadata"]["continue"]
    code, page2 = await get(
        api, api.cm_path(), limit="2", labelSelector="app=web", **{"continue": token}
    )
    assert code == 200 and page2["items"] == [] and "continue" not in page2["metadata"]


async def test_list_resource_version_semantics(api: Api) -> None:
    a = api.create_cm("a")
    then = rv_of(a)
    api.patch_cm("a", {"k": "changed"})
    api.create_cm("b")
    path = api.cm_path()
    # "0": any state the server has, limit ignored (the watch cache serves it whole).
    code, body = await get(api, path, resourceVersion="0", limit="1")
    assert code == 200 and "continue" not in body["metadata"]
    # Exact: the past, as it was at that version.
    code, past = await get(api, path, resourceVersion=str(then), resourceVersionMatch="Exact")
    assert code == 200 and past["metadata"]["resourceVersion"] == str(then)
    assert names(past["items"]) == ["a"] and past["items"][0]["data"] == {"k": "a"}
    # A resourceVersion with a limit and no match is Exact too (the legacy rule).
    code, legacy = await get(api, path, resourceVersion=str(then), limit="5")
    assert code == 200 and legacy["metadata"]["resourceVersion"] == str(then)
    assert names(legacy["items"]) == ["a"]
    # NotOlderThan (or no match, no limit): the current state, at least that new.
    for params in ({"resourceVersionMatch": "NotOlderThan"}, {}):
        code, now = await get(api, path, resourceVersion=str(then), **params)
        assert code == 200 and names(now["items"]) == ["a", "b"]
        assert now["items"][0]["data"] == {"k": "changed"}
        assert int(now["metadata"]["resourceVersion"]) > then
    # resourceVersionMatch needs a resourceVersion.
    code, body = await get(api, path, resourceVersionMatch="NotOlderThan")
    assert code == 422
    assert_status(body, 422, "Invalid")
    assert body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "resourceVersionMatch is forbidden unless resourceVersion is provided"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            "field": "resourceVersionMatch",
        }
    ]


async def test_reads_ahead_of_the_server_are_504_too_large(api: Api) -> None:
    """A LIST, or a streaming list, from a version the server has not reached: after
    waiting 3 s for it (the real server), a 504 Status; the streaming list's comes as
    an ERROR event of a watch that was accepted."""
    ahead = rv_of(api.create_cm("a")) + 1000
    streaming = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "resourceVersion": str(ahead),
    }

    async def stream_error() -> Body:
        async with watch(api, api.cm_path(), **streaming) as w:
            events = [e for _, e in await w.until_close()]
        assert [e["type"] for e in events] == ["ERROR"]
        status: Body = events[0]["object"]
        return status

    listed, streamed = await asyncio.gather(
        get(api, api.cm_path(), resourceVersion=str(ahead), resourceVersionMatch="Exact"),
        stream_error(),
    )
    assert listed[0] == 504
    for body in (listed[1], streamed):
        assert_status(body, 504, "Timeout")
        assert re.fullmatch(
            rf"Timeout: Too large resource version: {ahead}, current: \d+", body["message"]
        )
        assert body["details"] == {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        }


async def test_bad_resource_versions_are_refused(api: Api) -> None:
    why = 'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'
    code, body = await get(api, api.cm_path(), resourceVersion="abc")
    assert code == 400
    assert_status(body, 400, "BadRequest")
    assert body["message"] == f"invalid resource version: {why}"
    # The watch path hands the storage error on as it is: a 500 without a reason.
    code, body = await get(api, api.cm_path(), resourceVersion="abc", watch="1")
    assert code == 500
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": why,
        "code": 500,
    }
    code, body = await get(api, api.cm_path(), **{"continue": "garbage"})
    assert code == 400
    assert_status(body, 400, "BadRequest")
    assert body["message"].startswith("invalid continue token: ")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"resourceVersionMatch": "Foo", "resourceVersion": "1"},
            'resourceVersionMatch: Unsupported value: "Foo": supported values: "Exact", '
            '"NotOlderThan", ""',
        ),
        (
            {"resourceVersionMatch": "Exact", "resourceVersion": "0"},
            'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
            'resourceVersion "0"',
        ),
        (
            {"resourceVersionMatch": "NotOlderThan", "resourceVersion": "1", "continue": "x"},
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue "
            "is provided",
        ),
        (
            {"sendInitialEvents": "true"},
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            {"watch": "1", "resourceVersionMatch": "NotOlderThan", "resourceVersion": "1"},
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch "
            "unless sendInitialEvents is provided",
        ),
    ],
)
async def test_bad_list_options_are_422(api: Api, params: dict[str, str], message: str) -> None:
    code, body = await get(api, api.cm_path(), **params)
    assert code == 422
    assert_status(body, 422, "Invalid")
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {message}'
    field_path, _, cause = message.partition(": ")
    assert body["details"]["causes"][0]["field"] == field_path
    assert body["details"]["causes"][0]["message"] == cause


# -- WATCH -----------------------------------------------------------------------------


async def test_watch_from_a_resource_version_streams_only_later_events_in_order(api: Api) -> None:
    api.create_cm("before")
    start = rv_of(api.create_cm("start"))
    api.create_cm("b")
    api.patch_cm("before", {"k": "x"})
    api.delete_cm("b")
    async with watch(api, api.cm_path(), resourceVersion=str(start)) as w:
        replayed = [await w.next() for _ in range(3)]
        api.create_cm("live")
        live = await w.next()
    events = [*replayed, live]
    assert kinds_and_names(events) == [
        ("ADDED", "b"),
        ("MODIFIED", "before"),
        ("DELETED", "b"),
        ("ADDED", "live"),
    ]
    assert all(
        (e["object"]["kind"], e["object"]["apiVersion"]) == ("ConfigMap", "v1") for e in events
    )
    rvs = [rv_of(e["object"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > start and len(set(rvs)) == 4


async def test_selector_watch_shows_leaving_as_deleted_and_entering_as_added(api: Api) -> None:
    start = rv_of(api.create_cm("a", app="web"))
    async with watch(api, api.cm_path(), resourceVersion=str(start), labelSelector="app=web") as w:
        moved = api.patch_labels("a", {"app": "db"})
        left = await w.next()
        api.create_cm("other", app="db")
        api.patch_labels("a", {"app": "web"})
        entered = await w.next()
        api.delete_cm("a")
        deleted = await w.next()
    assert kinds_and_names([left, entered, deleted]) == [
        ("DELETED", "a"),
        ("ADDED", "a"),
        ("DELETED", "a"),
    ]
    # The last content that matched, at the version of the change that moved it out.
    assert left["object"]["metadata"]["labels"] == {"app": "web"}
    assert rv_of(left["object"]) == rv_of(moved)
    assert entered["object"]["metadata"]["labels"] == {"app": "web"}
    assert rv_of(deleted["object"]) > rv_of(entered["object"])


async def test_watch_ahead_of_the_server_waits_for_that_version(api: Api) -> None:
    """A plain watch from a future RV is accepted and shows only events after it."""
    ahead = rv_of(api.create_cm("a")) + 2
    async with watch(api, api.cm_path(), resourceVersion=str(ahead)) as w:
        for name in ("b", "c", "d", "e"):
            api.create_cm(name)
        first = await w.next()
    assert rv_of(first["object"]) > ahead
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] != "b"


async def test_bookmarks_only_when_asked_past_the_start_and_before_the_timeout(api: Api) -> None:
    """The real server sends a bookmark every minute and from 2 s before the watch's
    deadline, only to watches that asked, and only at a version past the watch's start:
    with timeoutSeconds=4 one comes at ~1.8 s (its timer ticks each ~1 s, so often a
    second one at ~3 s); a watch of a namespace where nothing changed gets none."""
    start = rv_of(api.create_cm("a"))
    params = {"resourceVersion": str(start), "timeoutSeconds": "4"}
    async with watch(api, api.cm_path(), allowWatchBookmarks="true", **params) as w:
        b = api.create_cm("b")
        # Another kind changes: the ConfigMaps' watch cache does not see it.
        other = api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s", "namespace": api.namespace},
            }
        )
        events = await w.until_close()
    params = {"resourceVersion": str(rv_of(b)), "timeoutSeconds": "1"}
    async with watch(api, api.cm_path(), **params) as w:
        api.create_cm("c")
        plain = await w.until_close()
    quiet_from = str(rv_of(api.create_cm("d")))
    # Other kinds change meanwhile; the emulator's bookmarks would carry those versions.
    async with watch(
        api,
        api.cm_path(),
        allowWatchBookmarks="true",
        resourceVersion=quiet_from,
        timeoutSeconds="3",
    ) as w:
        quiet = await w.until_close()
    assert kinds_and_names([e for _, e in events if e["type"] != "BOOKMARK"]) == [("ADDED", "b")]
    bookmarks = [(t, e) for t, e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, events
    first_at, first = bookmarks[0]
    assert 0.5 <= first_at <= 3.8, first_at
    obj = first["object"]
    assert (obj["kind"], obj["apiVersion"]) == ("ConfigMap", "v1")
    assert rv_of(b) <= rv_of(obj) < rv_of(other)
    assert set(obj["metadata"]) == {"resourceVersion"}
    assert [e["type"] for _, e in plain] == ["ADDED"]
    assert quiet == []


async def test_watch_timeout_seconds_ends_the_stream_cleanly(api: Api) -> None:
    start = rv_of(api.create_cm("a"))
    began = time.monotonic()
    async with watch(api, api.cm_path(), resourceVersion=str(start), timeoutSeconds="1") as w:
        events = await w.until_close()
    assert events == []
    assert 0.9 <= time.monotonic() - began < 4


async def test_streaming_list_ends_with_the_annotated_bookmark(api: Api) -> None:
    for name in ("b", "a", "c"):
        last = api.create_cm(name)
    params = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "resourceVersion": "",
    }
    async with watch(api, api.cm_path(), **params) as w:
        initial = [await w.next() for _ in range(4)]
        api.create_cm("live")
        live = await w.next()
    assert sorted(kinds_and_names(initial[:3])) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    end = initial[3]
    assert end["type"] == "BOOKMARK"
    assert (end["object"]["kind"], end["object"]["apiVersion"]) == ("ConfigMap", "v1")
    assert end["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
    assert rv_of(end["object"]) >= rv_of(last)
    assert kinds_and_names([live]) == [("ADDED", "live")]
    assert rv_of(live["object"]) > rv_of(end["object"])


async def test_streaming_list_rules(api: Api) -> None:
    api.create_cm("a")
    # Without resourceVersionMatch=NotOlderThan it is refused.
    code, body = await get(
        api, api.cm_path(), watch="1", sendInitialEvents="true", allowWatchBookmarks="true"
    )
    assert code == 422
    assert_status(body, 422, "Invalid")
    why = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
    assert (
        body["message"]
        == f'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: {why}'
    )
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": [
            {
                "reason": "FieldValueForbidden",
                "message": f"Forbidden: {why}",
                "field": "resourceVersionMatch",
            }
        ],
    }
    # Without allowWatchBookmarks it is served, but nothing marks the end of the initial events.
    params = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "1",
    }
    async with watch(api, api.cm_path(), **params) as w:
        events = [e for _, e in await w.until_close()]
    assert kinds_and_names(events) == [("ADDED", "a")]
    # sendInitialEvents=false: from now on, nothing before, even for resourceVersion "0".
    for rv in ("0", ""):
        params = {
            "sendInitialEvents": "false",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "resourceVersion": rv,
        }
        async with watch(api, api.cm_path(), **params) as w:
            api.create_cm(f"late{rv}")
            event = await w.next()
        assert kinds_and_names([event]) == [("ADDED", f"late{rv}")]


# -- 410 after compaction ---------------------------------------------------------------


async def test_compacted_resource_versions_are_410(api: Api) -> None:
    a = api.create_cm("a")
    old = rv_of(a)
    api.create_cm("b")
    api.create_cm("c")
    code, page1 = await get(api, api.cm_path(), limit="1")
    assert code == 200
    api.create_cm("d")
    api.compact()
    if not api.is_emulator:
        # By design the emulator has no watch cache apart from its history (see
        # docs/emulator-fidelity.md): the real server's cache still replays a watch from
        # before the compaction, and serves the exact LIST, until it is restarted.
        async with watch(api, api.cm_path(), resourceVersion=str(old)) as w:
            assert (await w.next())["object"]["metadata"]["name"] == "b"
        code, body = await get(
            api, api.cm_path(), resourceVersion=str(old), resourceVersionMatch="Exact"
        )
        assert code == 200 and names(body["items"]) == ["a"]
    api.forget_watch_cache()
    now = await get(api, api.cm_path())
    # A watch from a compacted RV: HTTP 200, one ERROR event with a 410 Status, then the end.
    async with watch(api, api.cm_path(), resourceVersion=str(old)) as w:
        events = [e for _, e in await w.until_close()]
    assert [e["type"] for e in events] == ["ERROR"]
    assert_status(events[0]["object"], 410, "Expired")
    assert re.fullmatch(rf"too old resource version: {old} \(\d+\)", events[0]["object"]["message"])
    # A LIST at an exact compacted RV (matched or by the legacy limit rule): HTTP 410.
    for params in ({"resourceVersionMatch": "Exact"}, {"limit": "10"}):
        code, body = await get(api, api.cm_path(), resourceVersion=str(old), **params)
        assert code == 410
        assert_status(body, 410, "Expired")
        assert body["message"] == "The resourceVersion for the provided list is too old."
    # NotOlderThan is no read of the past: it lists the current state.
    code, body = await get(
        api, api.cm_path(), resourceVersion=str(old), resourceVersionMatch="NotOlderThan"
    )
    assert code == 200 and names(body["items"]) == ["a", "b", "c", "d"]
    assert int(body["metadata"]["resourceVersion"]) >= int(now[1]["metadata"]["resourceVersion"])
    # An expired continue token: 410 with a fresh token that goes on at the latest state.
    token = page1["metadata"]["continue"]
    code, body = await get(api, api.cm_path(), limit="1", **{"continue": token})
    assert code == 410
    assert_status(body, 410, "Expired")
    assert body["message"].startswith(
        "The provided continue parameter is too old to display a consistent list result. "
        "You can start a new list without the continue parameter, or use the continue token "
        "in this response to retrieve the remainder of the results."
    )
    fresh = body["metadata"]["continue"]
    assert continue_rv(fresh) == -1
    rest: list[str] = []
    while fresh:
        code, page = await get(api, api.cm_path(), limit="2", **{"continue": fresh})
        assert code == 200, page
        rest += names(page["items"])
        fresh = page["metadata"].get("continue")
    assert rest == ["b", "c", "d"]


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("app in (web", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("a=b=c", "found '=', expected: ',' or 'end of string'"),
        ("!!x", "unable to parse requirement: found '!', expected: identifier"),
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
    ],
)
async def test_bad_label_selector_is_400(api: Api, selector: str, message: str) -> None:
    code, body = await get(api, api.cm_path(), labelSelector=selector)
    assert code == 400
    assert_status(body, 400, "BadRequest")
    assert "details" not in body
    if api.is_emulator:
        # By design: the emulator parses selectors with regular expressions, not the
        # API server's lexer; the wording differs, the code and the reason do not.
        assert selector in body["message"] or body["message"].startswith("unable to parse")
    else:
        assert body["message"] == message


@pytest.mark.parametrize(
    ("path", "selector", "message"),
    [
        (
            "configmaps",
            "data.k=x",
            '"data.k" is not a known field selector: only "metadata.name", "metadata.namespace"',
        ),
        ("pods", "spec.bogus=x", "field label not supported: spec.bogus"),
        (
            "pods",
            "status.phase",
            "invalid selector: 'status.phase'; can't understand 'status.phase'",
        ),
    ],
)
async def test_bad_field_selector_is_400(api: Api, path: str, selector: str, message: str) -> None:
    code, body = await get(
        api, f"/api/v1/namespaces/{api.namespace}/{path}", fieldSelector=selector
    )
    assert code == 400
    assert_status(body, 400, "BadRequest")
    assert body["message"] == message


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/{ns}/nosuchthings",
        "/api/v1/nosuchthings",
        "/apis/apps/v1/nosuchthings",
        "/api/v1/namespaces/{ns}/configmaps/x/nosuchsubresource",
        "/api/v9",
        "/apis/apps/v9",
        "/apis/apps/v9/deployments",
    ],
)
async def test_unknown_resource_is_404_status(api: Api, path: str) -> None:
    code, body = await get(api, path.format(ns=api.namespace))
    assert code == 404
    assert_status(body, 404, "NotFound")
    assert body["message"] == "the server could not find the requested resource"
    assert body["details"] == {}


@pytest.mark.parametrize(
    "path",
    [
        "/apis/nosuch.example.com/v1/things",
        "/apis/nosuch.example.com/v1",
        "/apis/nosuch.example.com",
        "/nonsense",
    ],
)
async def test_unknown_group_version_is_a_plain_404(api: Api, path: str) -> None:
    """Nothing serves the group/version, so Go's mux answers: no Status, plain text."""
    async with api.session() as http, http.get(path) as r:
        assert r.status == 404
        assert r.headers["Content-Type"].startswith("text/plain")
        assert await r.text() == "404 page not found\n"


async def test_missing_object_is_404_naming_it(api: Api) -> None:
    code, body = await get(api, api.cm_path("nope"))
    assert code == 404
    assert_status(body, 404, "NotFound")
    assert body["message"] == 'configmaps "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "configmaps"}


async def test_forbidden_list_and_watch_are_403(api: Api) -> None:
    token = api.denied_token()
    path = f"/api/v1/namespaces/{api.namespace}/secrets"
    for verb, params in (("list", {}), ("watch", {"watch": "1"})):
        code, body = await get(api, path, token=token, **params)
        assert code == 403
        assert_status(body, 403, "Forbidden")
        m = re.fullmatch(
            rf'secrets is forbidden: User "([^"]+)" cannot {verb} resource "secrets" '
            rf'in API group "" in the namespace "{api.namespace}"',
            body["message"],
        )
        assert m, body["message"]
        assert body["details"] == {"kind": "secrets"}


async def test_discovery_documents_name_what_the_bridge_reads(api: Api) -> None:
    code, core = await get(api, "/api/v1")
    assert code == 200
    assert (core["kind"], core["groupVersion"]) == ("APIResourceList", "v1")
    assert "apiVersion" not in core
    entries = {r["name"]: r for r in core["resources"]}
    cms = entries["configmaps"]
    assert (cms["kind"], cms["namespaced"], cms["singularName"]) == ("ConfigMap", True, "configmap")
    assert {"list", "watch", "get"} <= set(cms["verbs"])
    assert entries["namespaces"]["namespaced"] is False
    code, groups = await get(api, "/apis")
    assert code == 200 and groups["kind"] == "APIGroupList"
    apps = next(g for g in groups["groups"] if g["name"] == "apps")
    assert apps["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    code, apps_v1 = await get(api, "/apis/apps/v1")
    assert code == 200
    assert (apps_v1["kind"], apps_v1["apiVersion"]) == ("APIResourceList", "v1")
    deployments = next(r for r in apps_v1["resources"] if r["name"] == "deployments")
    assert (deployments["kind"], deployments["namespaced"]) == ("Deployment", True)


# -- shardSelector (KEP-5866, gate ShardedListAndWatch) ---------------------------------

UID = "object.metadata.uid"


def shard(field_path: str, start: int, end: int) -> str:
    return f"shardRange({field_path}, '0x{start:016x}', '0x{end:016x}')"


async def test_shard_selector_filters_lists_and_echoes_the_selector(api: Api) -> None:
    made = {api.create_cm(f"cm{i}")["metadata"]["uid"]: f"cm{i}" for i in range(8)}
    halves = [shard(UID, 0, 1 << 63), shard(UID, 1 << 63, 1 << 64)]
    seen: list[str] = []
    for selector, low in zip(halves, (True, False), strict=True):
        code, body = await get(api, api.cm_path(), shardSelector=selector)
        assert code == 200
        assert body["metadata"]["shardInfo"] == {"selector": selector}
        expected = sorted(n for u, n in made.items() if (fnv1a64(u.encode()) < 1 << 63) == low)
        assert names(body["items"]) == expected
        seen += expected
    assert sorted(seen) == sorted(made.values())
    # Every page echoes it; a sharded page has no remainingItemCount (nothing counted).
    code, page = await get(api, api.cm_path(), shardSelector=halves[0], limit="1")
    assert code == 200 and page["metadata"]["shardInfo"] == {"selector": halves[0]}
    assert "remainingItemCount" not in page["metadata"]
    # Any CEL spelling is accepted and echoed in the canonical one; "" is no selector.
    loose = halves[0].replace(", ", ",").replace("'", '"')
    code, body = await get(api, api.cm_path(), shardSelector=loose)
    assert code == 200 and body["metadata"]["shardInfo"] == {"selector": halves[0]}
    code, body = await get(api, api.cm_path(), shardSelector="")
    assert code == 200 and "shardInfo" not in body["metadata"] and len(body["items"]) == 8
    # Several ranges of one field, joined with ||.
    quarters = f"{shard(UID, 0, 1 << 62)} || {shard(UID, 1 << 63, 3 << 62)}"
    code, body = await get(api, api.cm_path(), shardSelector=quarters)
    assert code == 200 and body["metadata"]["shardInfo"] == {"selector": quarters}
    assert names(body["items"]) == sorted(
        n for u, n in made.items() if fnv1a64(u.encode()) >> 62 in (0, 2)
    )


async def test_shard_selector_filters_watches_and_streaming_lists(api: Api) -> None:
    # The namespace field: this test's objects all hash alike, so one half has them all.
    ns_hash = fnv1a64(api.namespace.encode())
    mine = shard("object.metadata.namespace", 0, 1 << 63)
    other = shard("object.metadata.namespace", 1 << 63, 1 << 64)
    if ns_hash >= 1 << 63:
        mine, other = other, mine
    first = api.create_cm("a")
    async with (
        watch(api, api.cm_path(), resourceVersion=str(rv_of(first)), shardSelector=mine) as w,
        watch(
            api, api.cm_path(), resourceVersion=str(rv_of(first)), shardSelector=other,
            allowWatchBookmarks="true", timeoutSeconds="2",
        ) as empty,
    ):  # fmt: skip
        api.create_cm("b")
        api.delete_cm("a")
        events = [await w.next(), await w.next()]
        nothing = [e for _, e in await empty.until_close()]
    assert kinds_and_names(events) == [("ADDED", "b"), ("DELETED", "a")]
    assert [e for e in nothing if e["type"] != "BOOKMARK"] == []
    # A streaming list: the initial events are the shard's; the end bookmark carries only
    # the annotation (no echo: a client learns whether it was honoured from a LIST).
    params = {
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
    }
    for selector, expected in ((mine, [("ADDED", "b")]), (other, [])):
        async with watch(api, api.cm_path(), shardSelector=selector, **params) as w:
            initial = [await w.next() for _ in range(len(expected) + 1)]
        assert kinds_and_names(initial[:-1]) == expected
        end = initial[-1]
        assert end["type"] == "BOOKMARK"
        assert end["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END_ANNOTATION: "true"}
        assert set(end["object"]["metadata"]) == {"resourceVersion", "annotations"}


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (" ", "empty shard selector is not allowed; omit the parameter for unfiltered lists"),
        (
            f"shardRange({UID}, '0x0', '0x8000000000000000')",
            'hexStart must be a 0x-prefixed 16-digit hex value, got "0x0" '
            '(did you mean "0x0000000000000000"?)',
        ),
        (
            "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
            'unsupported field path "object.metadata.name"; supported: object.metadata.uid, '
            "object.metadata.namespace",
        ),
        (
            shard(UID, 1 << 63, 0),
            "shard range start 0x8000000000000000 must be less than end 0x0000000000000000",
        ),
        (
            f"shardRange({UID}, '0x8000000000000000')",
            "shardRange() requires exactly 3 arguments, got 2",
        ),
        (
            f"{shard(UID, 0, 1 << 63)} || {shard('object.metadata.namespace', 0, 1 << 63)}",
            'all shard ranges must use the same field, got "object.metadata.uid" and '
            '"object.metadata.namespace"',
        ),
        ("x && y", 'unsupported function "_&&_"; only shardRange() and || are allowed'),
        (
            f"shardRange({UID}, '0XAB', '0x8000000000000000')",
            "hexStart must have '0x' prefix, got \"0XAB\"",
        ),
        (
            f"shardRange({UID}, '0x000000000000000G', '0x8000000000000000')",
            'hexStart: invalid hex character "G" in "0x000000000000000G"',
        ),
        (
            f"shardRange({UID}, '0x20000000000000000', '0x8000000000000000')",
            "hexStart: 17-digit hex value must be '0x10000000000000000' (2^64), got "
            '"0x20000000000000000"',
        ),
        (
            f"shardRange({UID}, 1, '0x8000000000000000')",
            "hexStart must be a string literal, got int64",
        ),
        ("foo(", "CEL parse error: Syntax error: mismatched input"),
    ],
)
async def test_bad_shard_selectors_are_500_on_list_and_watch(
    api: Api, selector: str, message: str
) -> None:
    # The store's parse error reaches the handler untranslated: a 500 without reason.
    for extra in ({}, {"watch": "1"}):
        code, body = await get(api, api.cm_path(), shardSelector=selector, **extra)
        assert code == 500, body
        assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == 500
        assert "reason" not in body
        if message.startswith("CEL parse error"):
            # By design: cel-go's syntax messages are not reproduced, only their start.
            assert body["message"].startswith(f"invalid shard selector: {message}")
        else:
            assert body["message"] == f"invalid shard selector: {message}"


async def test_without_the_gate_shard_selector_is_ignored(unsharded: Api) -> None:
    api = unsharded
    for i in range(3):
        api.create_cm(f"cm{i}")
    for selector in (shard(UID, 0, 1), " ", "foo("):
        code, body = await get(api, api.cm_path(), shardSelector=selector, limit="2")
        assert code == 200, body
        assert "shardInfo" not in body["metadata"]
        assert names(body["items"]) == ["cm0", "cm1"]
        assert body["metadata"]["remainingItemCount"] == 1
    async with watch(api, api.cm_path(), shardSelector=shard(UID, 0, 1), resourceVersion="") as w:
        initial = [await w.next() for _ in range(3)]
    assert sorted(kinds_and_names(initial)) == [
        ("ADDED", "cm0"),
        ("ADDED", "cm1"),
        ("ADDED", "cm2"),
    ]
