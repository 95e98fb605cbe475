"""A Kubernetes API server emulator for tests, benchmarks and the demo.

    async with Emulator(bookmark_interval=1.0) as emu:
        emu.register_resource(group="example.com", version="v1", kind="Widget", plural="widgets")
        emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
        emu.write_kubeconfig(tmp_path / "kubeconfig")

Huge objects: ``emu.chaos.huge_object(name, namespace, size=2 * 1024 * 1024)``
creates a ConfigMap whose JSON is about ``size`` bytes.
"""

from bridge.emulator.chaos import Chaos
from bridge.emulator.server import Emulator, ForbidRule, RequestRecord, write_kubeconfig

__all__ = ["Chaos", "Emulator", "ForbidRule", "RequestRecord", "write_kubeconfig"]
