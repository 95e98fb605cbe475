"""A bad selector never hangs: a syntax error stops ``config validate``; a field the kind
cannot be selected by (the API server answers the LIST with 400) fails ``check`` and
stops ``run`` with exit 1 and one line naming the resource and the server's reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.emulator import Emulator
from tests.e2e.bridge_process import BridgeProcess, cli, run_until_exit, write_config
from tests.e2e.test_check import check, failures

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

BOGUS = "spec.bogus=1"


def config_with(tmp_path: Path, kubeconfig: Path, **pod: str) -> Path:
    return write_config(
        tmp_path / "bridge.yaml",
        kubeconfig=kubeconfig,
        sink={"kind": "stdout"},
        resources=[
            {"apiVersion": "v1", "kind": "Pod", **pod},
            {"apiVersion": "example.com/v1", "kind": "Widget"},
        ],
    )


async def test_label_selector_syntax_error_fails_config_validate_naming_the_key(
    tmp_path: Path, kubeconfig: Path
) -> None:
    config = config_with(tmp_path, kubeconfig, labelSelector="app in (a,")
    code, out, err = await cli("config", "validate", "--config", str(config))
    assert code == 2, (out, err)
    assert err.splitlines() == [
        "config error: resources[0].labelSelector: 'app in (a,' is not a valid label "
        "selector: the 'in' list is not closed with ')'"
    ]


async def test_unsupported_field_selector_fails_check_for_that_resource(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    code, lines, err = await check(config_with(tmp_path, kubeconfig, fieldSelector=BOGUS))
    assert "Traceback" not in err, err
    assert code == 1, (lines, err)
    assert failures(lines) == [
        "FAIL  resource v1/Pod list: allowed in all namespaces, but the LIST fails: "
        "field label not supported: spec.bogus"
    ]
    assert any("resource example.com/v1/Widget list: allowed" in line for line in lines)


async def test_unsupported_field_selector_stops_run_with_one_line(
    tmp_path: Path, kubeconfig: Path, emulator: Emulator
) -> None:
    bridge = BridgeProcess(config_with(tmp_path, kubeconfig, fieldSelector=BOGUS))
    code, log = await run_until_exit(bridge)
    assert code == 1, log
    assert "Traceback" not in log, log
    assert log.splitlines()[-1] == (
        "k8s-bridge run: resource v1/pods: the API server rejected the LIST: "
        "field label not supported: spec.bogus"
    )
    # It gave up at the first answer, not after retrying.
    rejected = [r for r in emulator.requests if r.query.get("fieldSelector") == BOGUS]
    assert len([r for r in rejected if not r.query.get("watch")]) == 1
