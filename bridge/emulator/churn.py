"""A realistic change generator: what a small busy cluster does to its API server.

Namespaces hold Deployments whose replicas own Pods (scaling creates and
deletes Pods), Pods move Pending → Running and refresh heartbeat-like condition
timestamps (changes a bridge should usually ignore), Nodes heartbeat, Widgets
(example.com/v1) are created, resized and deleted, and now and then a Pod dies
and is replaced. Every change goes through the emulator's normal rules, so
watches and lists see it exactly as they would see kubectl's.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from bridge.emulator.server import Emulator
from bridge.emulator.store import now_rfc3339
from bridge.errors import ApiStatusError

WIDGET = ("example.com/v1", "Widget")


class ChurnGenerator:
    """Drives ``rate`` changes per second into an emulator until cancelled."""

    def __init__(
        self,
        emulator: Emulator,
        *,
        rate: float = 10.0,
        namespaces: int = 3,
        deployments_per_namespace: int = 2,
        nodes: int = 3,
        widgets_per_namespace: int = 2,
        seed: int | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("churn rate must be positive")
        self.emu = emulator
        self.rate = rate
        self.namespaces = [f"demo-{i}" for i in range(namespaces)]
        self.deployments_per_namespace = deployments_per_namespace
        self.node_names = [f"node-{i}" for i in range(nodes)]
        self.widgets_per_namespace = widgets_per_namespace
        self.rng = random.Random(seed)
        self.changes = 0
        self._serial = 0

    # -- setup -------------------------------------------------------------------

    def setup(self) -> None:
        """Create the starting cluster (idempotent: existing objects are kept)."""
        if self.emu.registry.by_kind(*WIDGET) is None:
            self.emu.register_resource(
                group="example.com", version="v1", kind="Widget", plural="widgets"
            )
        for name in self.node_names:
            self._ensure({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        for ns in self.namespaces:
            self._ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            for d in range(self.deployments_per_namespace):
                self._ensure(self._deployment(ns, f"app-{d}", self.rng.randint(1, 3)))
                self._reconcile(ns, f"app-{d}")
            for w in range(self.widgets_per_namespace):
                self._ensure(self._widget(ns, f"widget-{w}"))

    def _ensure(self, obj: dict[str, Any]) -> None:
        try:
            self.emu.create(obj)
        except ApiStatusError as err:
            if err.code != 409:
                raise

    # -- objects -------------------------------------------------------------------

    @staticmethod
    def _deployment(ns: str, name: str, replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "main", "image": "registry.local/app:1"}]},
                },
            },
        }

    def _widget(self, ns: str, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"size": self.rng.randint(1, 10), "color": self.rng.choice(["red", "blue"])},
        }

    def _pod(self, ns: str, deployment: dict[str, Any]) -> dict[str, Any]:
        self._serial += 1
        name = deployment["metadata"]["name"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{self._serial:05d}",
                "namespace": ns,
                "labels": {"app": name},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": name,
                        "uid": deployment["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": self.rng.choice(self.node_names) if self.node_names else "",
                "containers": deployment["spec"]["template"]["spec"]["containers"],
            },
            "status": {"phase": "Pending"},
        }

    def _pods_of(self, ns: str, name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.emu.list("v1", "Pod", ns)
            if (p["metadata"].get("labels") or {}).get("app") == name
        ]

    def _reconcile(self, ns: str, name: str) -> None:
        """What the Deployment controller does: make the Pod count match replicas."""
        deployment = self.emu.get("apps/v1", "Deployment", name, ns)
        want = int(deployment["spec"].get("replicas", 1))
        pods = self._pods_of(ns, name)
        for _ in range(want - len(pods)):
            self.emu.create(self._pod(ns, deployment))
        for pod in pods[want:] if len(pods) > want else []:
            self.emu.delete("v1", "Pod", pod["metadata"]["name"], ns)
        pods = self._pods_of(ns, name)
        ready = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        self.emu.patch(
            "apps/v1",
            "Deployment",
            name,
            {
                "status": {
                    "replicas": len(pods),
                    "updatedReplicas": len(pods),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                }
            },
            ns,
        )

    # -- changes -------------------------------------------------------------------

    def step(self) -> str:
        """Make one random change; returns what it did (for logs and tests)."""
        self.changes += 1
        ns = self.rng.choice(self.namespaces)
        roll = self.rng.random()
        try:
            if roll < 0.30:
                return self._pod_status(ns)
            if roll < 0.45:
                return self._node_heartbeat()
            if roll < 0.60:
                return self._scale(ns)
            if roll < 0.75:
                return self._widget_change(ns)
            if roll < 0.85:
                return self._kill_pod(ns)
            return self._pod_heartbeat(ns)
        except ApiStatusError as err:
            # A race with our own earlier change (e.g. the object just went away).
            return f"skipped: {err}"

    def _pod_status(self, ns: str) -> str:
        pods = self.emu.list("v1", "Pod", ns)
        pending = [p for p in pods if (p.get("status") or {}).get("phase") != "Running"]
        if not pending:
            return self._pod_heartbeat(ns)
        pod = self.rng.choice(pending)
        now = now_rfc3339()
        status = {
            "phase": "Running",
            "podIP": f"10.0.{self.rng.randint(0, 255)}.{self.rng.randint(1, 254)}",
            "startTime": now,
            "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
            ],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0}],
        }
        name = pod["metadata"]["name"]
        self.emu.patch("v1", "Pod", name, {"status": status}, ns)
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name")
        if owner:
            self._reconcile(ns, owner)
        return f"pod {ns}/{name} running"

    def _pod_heartbeat(self, ns: str) -> str:
        pods = [
            p
            for p in self.emu.list("v1", "Pod", ns)
            if (p.get("status") or {}).get("phase") == "Running"
        ]
        if not pods:
            return self._node_heartbeat()
        pod = self.rng.choice(pods)
        conditions = [dict(c) for c in pod["status"].get("conditions") or []]
        for c in conditions:
            c["lastProbeTime"] = f"{now_rfc3339()[:-1]}.{self.changes % 1000:03d}Z"
        name = pod["metadata"]["name"]
        self.emu.patch("v1", "Pod", name, {"status": {"conditions": conditions}}, ns)
        return f"pod {ns}/{name} heartbeat"

    def _node_heartbeat(self) -> str:
        if not self.node_names:
            return "no nodes"
        name = self.rng.choice(self.node_names)
        beat = f"{now_rfc3339()[:-1]}.{self.changes % 1000:03d}Z"
        condition = {"type": "Ready", "status": "True", "lastHeartbeatTime": beat}
        self.emu.patch("v1", "Node", name, {"status": {"conditions": [condition]}})
        return f"node {name} heartbeat"

    def _scale(self, ns: str) -> str:
        name = f"app-{self.rng.randrange(max(1, self.deployments_per_namespace))}"
        replicas = self.rng.randint(0, 4)
        self.emu.patch("apps/v1", "Deployment", name, {"spec": {"replicas": replicas}}, ns)
        self._reconcile(ns, name)
        return f"deployment {ns}/{name} scaled to {replicas}"

    def _widget_change(self, ns: str) -> str:
        widgets = self.emu.list(*WIDGET, ns)
        if widgets and self.rng.random() < 0.25:
            name = self.rng.choice(widgets)["metadata"]["name"]
            self.emu.delete(*WIDGET, name, ns)
            return f"widget {ns}/{name} deleted"
        if len(widgets) < self.widgets_per_namespace or not widgets:
            self._serial += 1
            name = f"widget-x{self._serial}"
            self.emu.create(self._widget(ns, name))
            return f"widget {ns}/{name} created"
        name = self.rng.choice(widgets)["metadata"]["name"]
        self.emu.patch(*WIDGET, name, {"spec": {"size": self.rng.randint(1, 10)}}, ns)
        return f"widget {ns}/{name} resized"

    def _kill_pod(self, ns: str) -> str:
        pods = self.emu.list("v1", "Pod", ns)
        if not pods:
            return self._scale(ns)
        pod = self.rng.choice(pods)
        name = pod["metadata"]["name"]
        self.emu.delete("v1", "Pod", name, ns)
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name")
        if owner:
            self._reconcile(ns, owner)
        return f"pod {ns}/{name} died"

    async def run(self, duration: float | None = None) -> None:
        """Make about ``rate`` changes per second, for ``duration`` seconds or until cancelled."""
        self.setup()
        loop = asyncio.get_running_loop()
        started = loop.time()
        tick = max(0.01, min(0.2, 1.0 / self.rate))
        owed = 0.0
        while duration is None or loop.time() - started < duration:
            owed += self.rate * tick
            while owed >= 1.0:
                self.step()
                owed -= 1.0
            await asyncio.sleep(tick)
