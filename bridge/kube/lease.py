"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One replica leads (publishes); the others wait to take over. The rules that
make this safe are those of client-go's ``tools/leaderelection``:

* A candidate takes the Lease only when ``leaseDuration`` has passed since *it
  observed* the last change of the lease record, on its own monotonic clock.
  The holder's ``renewTime`` is never compared with the local wall clock, so
  clock skew between nodes cannot shorten a lease (checklist 36).
* A leader that has not renewed within ``renewDeadline`` of its last successful
  renewal stops leading. Because ``renewDeadline < leaseDuration``, it has
  stopped before any candidate's lease duration can have run out (checklist 37).
* Every write is a PUT of the object last read, carrying its
  ``metadata.resourceVersion``: a concurrent writer makes it fail with 409 and
  the attempt simply counts as failed. Taking over from another holder
  increments ``leaseTransitions`` (checklist 38).

``LeaseClient`` is the seam: ``KubeLeaseClient`` talks to the API server,
``InMemoryLeaseClient`` is the twin for tests.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from bridge.errors import ConflictError, KubeError, NotFoundError
from bridge.logging import get_logger

Lease = dict[str, Any]

LEASE_API = "/apis/coordination.k8s.io/v1"
# client-go's JitterFactor for the acquire loop: waits of retry * [1, 2.2).
JITTER_FACTOR = 1.2

_log = get_logger(__name__)


class LeaseClient(Protocol):
    """Get/create/update of one Lease object as raw JSON."""

    async def get(self, namespace: str, name: str) -> Lease:
        """The Lease; raises ``NotFoundError`` when it does not exist."""
        ...

    async def create(self, namespace: str, lease: Lease) -> Lease:
        """Create; raises ``ConflictError`` when it already exists."""
        ...

    async def update(self, namespace: str, lease: Lease) -> Lease:
        """PUT with ``metadata.resourceVersion``; raises ``ConflictError`` when stale."""
        ...


class _JsonRequester(Protocol):
    async def request_json(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: Any = None,
        content_type: str = ...,
    ) -> dict[str, Any]: ...


class KubeLeaseClient:
    """``LeaseClient`` over ``bridge.kube.client.KubeClient.request_json``."""

    def __init__(self, client: _JsonRequester) -> None:
        self._client = client

    async def get(self, namespace: str, name: str) -> Lease:
        return await self._client.request_json(
            "GET", f"{LEASE_API}/namespaces/{namespace}/leases/{name}"
        )

    async def create(self, namespace: str, lease: Lease) -> Lease:
        return await self._client.request_json(
            "POST", f"{LEASE_API}/namespaces/{namespace}/leases", body=lease
        )

    async def update(self, namespace: str, lease: Lease) -> Lease:
        name = lease["metadata"]["name"]
        return await self._client.request_json(
            "PUT", f"{LEASE_API}/namespaces/{namespace}/leases/{name}", body=lease
        )


class InMemoryLeaseClient:
    """A ``LeaseClient`` holding Leases in a dict, with the API server's rules for
    resourceVersion (bumped on every write, 409 on a stale PUT) and AlreadyExists."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], Lease] = {}
        self._rv = 0

    def _stamp(self, lease: Lease) -> Lease:
        self._rv += 1
        stored = _copy(lease)
        stored.setdefault("apiVersion", "coordination.k8s.io/v1")
        stored.setdefault("kind", "Lease")
        stored["metadata"]["resourceVersion"] = str(self._rv)
        return stored

    async def get(self, namespace: str, name: str) -> Lease:
        stored = self.leases.get((namespace, name))
        if stored is None:
            raise NotFoundError(f'leases "{name}" not found', reason="NotFound")
        return _copy(stored)

    async def create(self, namespace: str, lease: Lease) -> Lease:
        key = (namespace, lease["metadata"]["name"])
        if key in self.leases:
            raise ConflictError(f'leases "{key[1]}" already exists', reason="AlreadyExists")
        stored = self._stamp(lease)
        stored["metadata"]["namespace"] = namespace
        self.leases[key] = stored
        return _copy(stored)

    async def update(self, namespace: str, lease: Lease) -> Lease:
        key = (namespace, lease["metadata"]["name"])
        current = self.leases.get(key)
        if current is None:
            raise NotFoundError(f'leases "{key[1]}" not found', reason="NotFound")
        if lease["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ConflictError(
                f'Operation cannot be fulfilled on leases "{key[1]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                reason="Conflict",
            )
        stored = self._stamp(lease)
        self.leases[key] = stored
        return _copy(stored)


def _copy(lease: Lease) -> Lease:
    out = dict(lease)
    out["metadata"] = dict(lease.get("metadata") or {})
    out["spec"] = dict(lease.get("spec") or {})
    return out


def _micro_time(epoch: float) -> str:
    # metav1.MicroTime: RFC 3339 with microseconds.
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_RECORD_KEYS = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
)


def _record(spec: dict[str, Any]) -> dict[str, Any]:
    """The leader election record inside a Lease spec (what counts as a change)."""
    return {k: spec.get(k) for k in _RECORD_KEYS}


class LeaderElector:
    """Campaign for a Lease; run a callback while leading.

    ``clock`` is the monotonic clock used to time observations and deadlines;
    omitted, it is the event loop's clock (``time.monotonic`` on a normal loop),
    so it stays in step with ``asyncio.sleep`` even under a fake-time loop.
    ``wall_clock`` only stamps ``acquireTime``/``renewTime`` for humans.
    """

    def __init__(
        self,
        client: LeaseClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        release_on_cancel: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if lease_duration <= renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if renew_deadline <= retry_period:
            raise ValueError("renew_deadline must be greater than retry_period")
        self._client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall_clock = wall_clock
        self._release_on_cancel = release_on_cancel
        self._rng = rng or random.Random()
        self._leading = False
        # What this replica last saw of the record, when it saw it change, and the
        # object it came in (its resourceVersion makes the next PUT conditional).
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._lease: Lease | None = None
        # The reason of the last refused attempt already logged as a warning.
        self._warned: str | None = None

    # -- state -------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True between the start and the stop of leading."""
        return self._leading

    @property
    def observed_holder(self) -> str | None:
        """The holder identity in the record this replica last observed."""
        return (self._observed or {}).get("holderIdentity") or None

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()

    def _holds_record(self) -> bool:
        return self._observed is not None and self._observed.get("holderIdentity") == self.identity

    def _lease_valid(self, now: float) -> bool:
        if self._observed is None:
            return False
        duration = self._observed.get("leaseDurationSeconds") or 0
        return self._observed_at + float(duration) > now

    def _observe(self, lease: Lease, now: float) -> None:
        record = _record(lease.get("spec") or {})
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        self._lease = lease

    def _set_own(self, lease: Lease, now: float) -> None:
        # Our own successful write: the record changed at the time we wrote it.
        self._observed = _record(lease.get("spec") or {})
        self._observed_at = now
        self._lease = lease
        self._warned = None

    def _refused(self, what: str, exc: KubeError) -> None:
        """An attempt failed. A 409 is the race the resourceVersion exists for (someone
        wrote first; the next attempt re-reads). Anything else, such as a namespace that
        does not exist or RBAC without the Lease verbs, would leave this replica a
        standby for ever without a word: one warning per reason, repeats at debug."""
        if isinstance(exc, ConflictError) or str(exc) == self._warned:
            _log.debug(f"lease {what} failed", lease=self.name, error=str(exc))
            return
        self._warned = str(exc)
        _log.warning(
            f"cannot {what} the leader election lease; retrying",
            lease=f"{self.namespace}/{self.name}",
            error=str(exc),
        )

    # -- one attempt (tryAcquireOrRenew) -------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease. True when this replica holds it now."""
        now = self._now()
        stamp = _micro_time(self._wall_clock())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.lease_duration),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }

        # Fast path for the leader: PUT over the object we last wrote.
        if self._holds_record() and self._lease_valid(now) and self._lease is not None:
            assert self._observed is not None
            spec["acquireTime"] = self._observed.get("acquireTime") or stamp
            spec["leaseTransitions"] = self._observed.get("leaseTransitions") or 0
            try:
                updated = await self._client.update(self.namespace, self._with_spec(spec))
            except KubeError as exc:
                _log.debug("lease renew failed, re-reading", lease=self.name, error=str(exc))
            else:
                self._set_own(updated, now)
                return True

        try:
            current = await self._client.get(self.namespace, self.name)
        except NotFoundError:
            lease: Lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            try:
                created = await self._client.create(self.namespace, lease)
            except KubeError as exc:
                self._refused("create", exc)
                return False
            self._set_own(created, now)
            return True
        except KubeError as exc:
            self._refused("get", exc)
            return False

        self._observe(current, now)
        assert self._observed is not None
        holder = self._observed.get("holderIdentity")
        if holder and self._lease_valid(now) and not self._holds_record():
            return False

        transitions = int(self._observed.get("leaseTransitions") or 0)
        if self._holds_record():
            spec["acquireTime"] = self._observed.get("acquireTime") or stamp
            spec["leaseTransitions"] = transitions
        else:
            spec["leaseTransitions"] = transitions + 1
        try:
            updated = await self._client.update(self.namespace, self._with_spec(spec))
        except KubeError as exc:
            self._refused("update", exc)
            return False
        self._set_own(updated, now)
        return True

    def _with_spec(self, spec: dict[str, Any]) -> Lease:
        assert self._lease is not None
        lease = _copy(self._lease)
        lease["spec"] = {**lease["spec"], **spec}
        return lease

    # -- loops -----------------------------------------------------------------------

    async def _attempt(self, budget: float) -> bool:
        try:
            async with asyncio.timeout(budget):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            return False

    async def _acquire(self) -> float:
        """Retry until this replica holds the Lease; returns when the winning attempt began."""
        while True:
            started = self._now()
            if await self._attempt(self.renew_deadline):
                return started
            jitter = 1.0 + self._rng.random() * JITTER_FACTOR
            await asyncio.sleep(self.retry_period * jitter)

    async def _renew(self, renewed_at: float, work: asyncio.Task[None]) -> bool:
        """Keep renewing every retry_period. Returns False when leadership is lost
        (no renewal within renew_deadline, or another holder observed) and True
        when ``work`` failed."""
        while True:
            if await _sleep_unless_failed(work, self.retry_period):
                return True
            deadline = renewed_at + self.renew_deadline
            while True:
                started = self._now()
                remaining = deadline - started
                if remaining <= 0:
                    return False
                if await self._attempt(remaining):
                    renewed_at = started
                    break
                if self.observed_holder not in (None, self.identity):
                    return False  # someone else holds it: stop now, not at the deadline
                remaining = deadline - self._now()
                if remaining <= 0:
                    return False
                if await _sleep_unless_failed(work, min(self.retry_period, remaining)):
                    return True

    async def _release(self) -> None:
        """Give the Lease up so a successor need not wait out the lease duration."""
        if not self._holds_record() or self._lease is None:
            return
        stamp = _micro_time(self._wall_clock())
        assert self._observed is not None
        spec = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": self._observed.get("leaseTransitions") or 0,
        }
        try:
            async with asyncio.timeout(self.retry_period):
                released = await self._client.update(self.namespace, self._with_spec(spec))
        except (KubeError, TimeoutError) as exc:
            _log.warning("could not release lease", lease=self.name, error=str(exc))
            return
        self._set_own(released, self._now())
        _log.info("released lease", lease=self.name, identity=self.identity)

    async def run(
        self,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
    ) -> None:
        """Campaign, lead, and return once leadership ends.

        ``on_started_leading()`` runs as a task while this replica leads (it may
        return at once; leading goes on); it is cancelled when leadership is
        lost, then ``on_stopped_leading()`` is awaited. Leadership ends when
        renewal fails (the Lease stays with whoever takes it), when the leading
        task raises (the Lease is released; the exception propagates), or when
        ``run`` is cancelled (released if ``release_on_cancel``). Call ``run``
        again to campaign anew.
        """
        renewed_at = await self._acquire()
        _log.info(
            "started leading",
            lease=f"{self.namespace}/{self.name}",
            identity=self.identity,
            transitions=(self._observed or {}).get("leaseTransitions"),
        )
        self._leading = True
        work = asyncio.create_task(_run_awaitable(on_started_leading), name=f"leading:{self.name}")
        work_failed = False
        cancelled = False
        try:
            work_failed = await self._renew(renewed_at, work)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._leading = False
            if not work_failed:
                _log.warning(
                    "stopped leading",
                    lease=f"{self.namespace}/{self.name}",
                    identity=self.identity,
                    reason="cancelled" if cancelled else "lost the lease",
                )
            await _cancel_and_wait(work)
            try:
                await on_stopped_leading()
            finally:
                if work_failed or (cancelled and self._release_on_cancel):
                    await self._release()
        exc = None if work.cancelled() else work.exception()
        if exc is not None:
            if work_failed:
                raise exc
            _log.error("leading task failed while stopping", error=repr(exc))


async def _run_awaitable(factory: Callable[[], Awaitable[None]]) -> None:
    await factory()


async def _sleep_unless_failed(task: asyncio.Task[None], delay: float) -> bool:
    """Sleep ``delay``; True (early) if ``task`` failed meanwhile. A task that
    returned normally is no reason to stop leading (client-go runs
    OnStartedLeading in a goroutine and keeps renewing)."""
    if not task.done():
        start = asyncio.get_running_loop().time()
        await asyncio.wait({task}, timeout=delay)
        delay -= asyncio.get_running_loop().time() - start
    if _failed(task):
        return True
    if delay > 0:
        await asyncio.sleep(delay)
    return False


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
