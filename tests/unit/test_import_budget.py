"""What ``k8s-bridge run`` imports stays within a budget: an idle bridge's memory is mostly
the modules it loaded (docs/sizing.md, BENCHMARKS.md *Idle footprint*).

A fresh interpreter imports what ``run`` imports before it reads its settings
(with the stdout sink and the SQLite checkpoint) and reports its ``sys.modules``.
kubernetes-asyncio is not among them: importing any part of it loads its
generated API models (~860 modules, ~37 MiB); the bridge reads kubeconfigs
itself (bridge/kube/kubeconfig.py). Nor are a terminal renderer and a syntax
highlighter (rich and pygments, which a logging library imported when installed:
~4.8 MiB), pydantic and pydantic-settings (~9 MiB of modules for a few dozen keys
read once: the settings sections validate themselves, bridge/ground/sections.py,
and read the environment themselves), the NATS client when the sink is not NATS,
prometheus_client (its exposition server pulls wsgiref, socketserver, http.server;
the bridge writes the text format itself, bridge/ground/prometheus.py) or aiohttp's
server (the health endpoints are served by bridge/ground/httpserver.py); the CLI's
parser is built too, as ``run`` builds it (it once imported the API emulator's
aiohttp server).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.idle import RUN_IMPORTS

# 436 measured when the budget was set (2026-11-28, settings without pydantic, metrics
# and health server of the bridge's own; was 472, 543, 645 and 680 before), with room
# for a few more.
MODULE_BUDGET = 455
# Top-level packages that have no place in an idle stdout/SQLite bridge.
UNWANTED = (
    "kubernetes_asyncio",
    "kubernetes",
    "rich",
    "pygments",
    "pydantic",
    "pydantic_core",
    "pydantic_settings",
    "nats",
    "prometheus_client",
    "wsgiref",
    "socketserver",
)
# Modules by prefix, where their package stays (aiohttp's client does).
UNWANTED_PREFIXES = ("aiohttp.web", "bridge.emulator.server")
ROOT = Path(__file__).resolve().parents[2]


def run_imports() -> list[str]:
    code = f"{RUN_IMPORTS}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    modules: list[str] = json.loads(out.stdout)
    return modules


def test_run_imports_no_kubernetes_client_and_stays_within_its_module_budget() -> None:
    modules = run_imports()
    heavy = sorted({m.split(".")[0] for m in modules} & set(UNWANTED))
    heavy += sorted(m for m in modules if m.startswith(UNWANTED_PREFIXES))
    assert heavy == [], f"k8s-bridge run imports {', '.join(heavy)}"
    assert len(modules) <= MODULE_BUDGET, (
        f"k8s-bridge run imports {len(modules)} modules, over its budget of {MODULE_BUDGET}"
    )
