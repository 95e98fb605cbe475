"""What ``k8s-bridge run`` imports stays within a budget: an idle bridge's memory is mostly
the modules it loaded (docs/sizing.md, BENCHMARKS.md *Idle footprint*).

A fresh interpreter imports what ``run`` imports before it reads its settings
(with the stdout sink and the SQLite checkpoint) and reports its ``sys.modules``.
kubernetes-asyncio is not among them: importing any part of it loads its
generated API models (~860 modules, ~37 MiB); the bridge reads kubeconfigs
itself (bridge/kube/kubeconfig.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.idle import RUN_IMPORTS

# 645 measured when the budget was set (2026-11-27), with room for a few more.
MODULE_BUDGET = 680
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
    heavy = [m for m in modules if m.split(".")[0] in ("kubernetes_asyncio", "kubernetes")]
    assert heavy == [], f"k8s-bridge run imports {len(heavy)} kubernetes client modules"
    assert len(modules) <= MODULE_BUDGET, (
        f"k8s-bridge run imports {len(modules)} modules, over its budget of {MODULE_BUDGET}"
    )
