"""A Kubernetes API server emulator for tests, benchmarks and the demo.

    async with Emulator(bookmark_interval=1.0) as emu:
        emu.register_resource(group="example.com", version="v1", kind="Widget", plural="widgets")
        emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
        emu.write_kubeconfig(tmp_path / "kubeconfig")

Huge objects: ``emu.chaos.huge_object(name, namespace, size=2 * 1024 * 1024)``
creates a ConfigMap whose JSON is about ``size`` bytes.

A subprocess emulator (``python -m bridge.emulator --port P --kubeconfig PATH``,
which prints ``emulator serving URL`` once ready) is driven over HTTP: POST (JSON
body or query) to ``/_emulator/<action>`` with action one of ``drop_watches``,
``truncate_watches``, ``stall_watches``, ``resume_watches``, ``fail_next``
(n, status, retry_after), ``compact`` (rv), ``expired_mode`` (mode),
``huge_object`` (name, namespace, size), ``register_resource`` (group, version,
kind, plural, namespaced, short_names), ``forbid`` (verb, resource, group,
namespace); GET ``/_emulator/requests`` and ``/_emulator/state``.

Known differences from a real API server (docs/emulator-fidelity.md lists them all;
tests/real/test_conformance.py runs the same assertions against both): only JSON
is spoken (protobuf bodies, as ``kubectl create configmap`` sends, get 415); no
OpenAPI documents (``kubectl apply`` needs ``--validate=false``); namespaces need
not exist before objects are created in them, and deleting one removes its
objects at once; status is not a separate subresource on the main resource (a
PUT may change it); strategic merge patch merges lists of objects by ``name``
(and a few other keys) only; a compaction also empties the watch history at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.emulator.chaos import Chaos
    from bridge.emulator.server import Emulator, ForbidRule, RequestRecord, write_kubeconfig

__all__ = ["Chaos", "Emulator", "ForbidRule", "RequestRecord", "write_kubeconfig"]

# Loaded on first use: `k8s-bridge run` builds its argument parser with the
# emulator's options (bridge/emulator/cli.py), and must not import the server
# (aiohttp.web) to do so.
_HOMES = {
    "Chaos": "bridge.emulator.chaos",
    "Emulator": "bridge.emulator.server",
    "ForbidRule": "bridge.emulator.server",
    "RequestRecord": "bridge.emulator.server",
    "write_kubeconfig": "bridge.emulator.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
