"""The health and metrics HTTP server: ``/healthz``, ``/readyz``, ``/metrics``, and the
control endpoint ``POST /snapshot?resource=KIND`` (bridge/delivery/snapshot.py).

``/healthz`` answers 200 while the event loop runs (a liveness probe that fails
only when the process is wedged). ``/readyz`` asks the app's readiness callable
and answers 503 with one line per failing reason, so ``kubectl describe`` and a
curl show why. ``/metrics`` renders the instance's own registry
(bridge/ground/prometheus.py). The HTTP is bridge/ground/httpserver.py's: a path
answers only its methods (405 otherwise, HEAD too), keep-alive connections
(Prometheus keeps one from scrape to scrape) close after 75 s idle.

``POST /snapshot`` makes the bridge do work (a LIST, events on the bus), so it
answers only POST (a scrape or a probe never triggers it), listens only where
the server binds (``server.host``), and lets in only the callers its
``ControlAuth`` lets in (``server.controlAuth``, bridge/service/control.py: a
Kubernetes token allowed by the API server, or ``server.controlToken``); the
check comes before anything else is read from the request. Its answer is JSON:
the counts, or ``{"error": one line}`` with the status of the refusal (401
no or bad token, 403 not allowed, 503 the check could not be made).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bridge.errors import SnapshotError, listen_error
from bridge.ground.httpserver import Handler, HttpServer, Request, Response
from bridge.ground.prometheus import CONTENT_TYPE, Registry
from bridge.logging import get_logger
from bridge.service.control import ControlAuth

log = get_logger(__name__)

Readiness = Callable[[], tuple[bool, list[str]]]
# resource (Kind or apiVersion/Kind) → the snapshot's result as JSON; raises SnapshotError.
Snapshotter = Callable[[str], Awaitable[dict[str, Any]]]


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: Registry,
        readiness: Readiness,
        *,
        snapshot: Snapshotter | None = None,
        control_auth: ControlAuth | None = None,
        before_scrape: Callable[[], None] | None = None,
    ) -> None:
        if snapshot is not None and control_auth is None:
            # Closed by default: an endpoint that makes the bridge work needs a check.
            raise ValueError("a snapshot endpoint needs a control_auth")
        self._snapshot = snapshot
        self._control_auth = control_auth
        self._host = host
        self._requested_port = port
        self._registry = registry
        self._readiness = readiness
        # The pipelines keep plain counters that are carried over once a second; a
        # scrape carries them first, so /metrics never trails what the bus acknowledged.
        self._before_scrape = before_scrape
        routes: dict[tuple[str, str], Handler] = {
            ("GET", "/healthz"): self._healthz,
            ("GET", "/readyz"): self._readyz,
            ("GET", "/metrics"): self._metrics,
        }
        if snapshot is not None:
            routes["POST", "/snapshot"] = self._snapshot_request
        self._server = HttpServer(host, port, routes)

    @property
    def listening(self) -> bool:
        return self._server.listening

    @property
    def port(self) -> int:
        """The bound port (the one picked by the OS when 0 was asked); valid after start()."""
        if not self._server.listening:
            raise RuntimeError("HealthServer is not started")
        return self._server.port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self._host in ("0.0.0.0", "", "::") else self._host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        try:
            await self._server.start()  # a second start() is a no-op
        except OSError as exc:
            # host and port come from the server section of the settings: name them.
            raise listen_error(
                "server.host", "server.port", self._host, self._requested_port, exc
            ) from exc

    async def stop(self) -> None:
        await self._server.stop()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _healthz(self, _request: Request) -> Response:
        return Response.text("ok\n")

    async def _readyz(self, _request: Request) -> Response:
        try:
            ready, reasons = self._readiness()
        except Exception as exc:  # a broken check must read as not ready, not as a 500
            ready, reasons = False, [f"readiness check failed: {exc!r}"]
        if ready:
            return Response.text("ok\n")
        lines = [r.replace("\n", " ") for r in reasons] or ["not ready"]
        return Response.text("\n".join(lines) + "\n", 503)

    async def _metrics(self, _request: Request) -> Response:
        if self._before_scrape is not None:
            self._before_scrape()
        return Response(200, self._registry.exposition(), CONTENT_TYPE)

    async def _snapshot_request(self, request: Request) -> Response:
        assert self._snapshot is not None and self._control_auth is not None
        decision = await self._control_auth.check(request.headers.get("authorization", ""))
        if not decision.allowed:
            log.info(
                "control request refused",
                status=decision.status,
                error=decision.message,
                peer=request.remote,
            )
            headers = {"WWW-Authenticate": "Bearer"} if decision.status == 401 else None
            return Response.json(
                {"error": decision.message}, status=decision.status, headers=headers
            )
        resource = request.query.get("resource", "").strip()
        if not resource:
            return Response.json({"error": "missing ?resource=KIND"}, status=400)
        if decision.user:
            log.info("control request", user=decision.user, resource=resource)
        try:
            result = await self._snapshot(resource)
        except SnapshotError as e:
            return Response.json({"error": str(e).replace("\n", " ")}, status=e.status)
        return Response.json(result)
