"""A resource the bridge may not list or watch (missing RBAC rules) stops ``run`` at
start with exit 1 and one line naming the resource and the server's reason, instead
of retrying in silence while it publishes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, run_until_exit
from tests.e2e.test_bad_selectors import config_with

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


async def test_a_forbidden_list_at_start_stops_run_with_one_line(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    emulator.forbid(resource="pods")  # list and watch (a streaming list is a watch)
    bridge = BridgeProcess(config_with(tmp_path, kubeconfig))
    code, log = await run_until_exit(bridge)
    assert code == 1, log
    assert "Traceback" not in log, log
    last = log.splitlines()[-1]
    assert last.startswith("k8s-bridge run: resource v1/pods: the API server forbids it: "), last
    assert last.endswith("(the RBAC rules must allow list and watch)"), last
    # It gave up at the first answer, not after retrying.
    asked = [r for r in emulator.requests if r.path.endswith("/pods")]
    assert len(asked) <= 2, asked  # a streaming list, then the LIST it falls back to
