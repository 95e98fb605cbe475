"""Process tuning: what it sets, only once, and only from ``k8s-bridge run``.

What each setting earns is measured by the benchmarks (BENCHMARKS.md, "Process
tuning"), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import main as cli
from bridge.service import tuning
from bridge.service.settings import InformerSettings
from bridge.service.tuning import Tuning

ROOT = Path(__file__).resolve().parents[2]

# Applies the tuning given as JSON in a process of its own (the settings are
# process-wide and applied once), then prints what the interpreter reports.
_APPLY = textwrap.dedent(
    """
    import gc, json, sys
    from bridge.service import tuning

    before = {"threshold": gc.get_threshold()[0], "switch": sys.getswitchinterval()}
    applied = tuning.apply(tuning.Tuning(**json.loads(sys.argv[1])))
    try:
        tuning.apply(applied)
        again = "applied twice"
    except RuntimeError as e:
        again = str(e)
    print(json.dumps({
        "before": before,
        "threshold": gc.get_threshold()[0],
        "switch": sys.getswitchinterval(),
        "mmap": applied.mmap_threshold,
        "applied": tuning.applied() == applied,
        "again": again,
    }))
    """
)


def _apply_in_a_process(**settings: Any) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _APPLY, json.dumps(settings)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_apply_sets_what_is_given_once() -> None:
    r = _apply_in_a_process(gc_threshold=12_345, switch_interval=0.0005, mmap_threshold=512 << 10)
    assert r["threshold"] == 12_345
    assert r["switch"] == pytest.approx(0.0005)
    if sys.platform.startswith("linux") and tuning._c_function("mallopt") is not None:
        assert r["mmap"] == 512 << 10
    assert r["applied"]
    assert "once" in r["again"]


def test_apply_leaves_what_is_not_given_at_the_interpreters_default() -> None:
    r = _apply_in_a_process()
    assert r["threshold"] == r["before"]["threshold"]
    assert r["switch"] == pytest.approx(r["before"]["switch"])
    assert r["mmap"] is None


def test_run_tunes_from_the_informer_settings() -> None:
    default = Tuning.for_run(InformerSettings())
    assert default.gc_threshold == 50_000
    assert default.switch_interval == tuning.SWITCH_INTERVAL
    assert default.mmap_threshold == tuning.MMAP_THRESHOLD
    assert default.trim_after_sync
    off = Tuning.for_run(InformerSettings(gc_threshold=None, gc_freeze=False))
    assert off == Tuning(
        switch_interval=tuning.SWITCH_INTERVAL, mmap_threshold=tuning.MMAP_THRESHOLD
    )


def test_without_leaves_the_named_settings_at_their_default() -> None:
    run = Tuning.for_run(InformerSettings())
    assert run.without({"switch_interval", "mmap_threshold", "trim_after_sync"}) == Tuning(
        gc_threshold=50_000
    )
    with pytest.raises(ValueError, match="unknown"):
        run.without({"stack_size"})


def test_after_first_sync_hands_free_pages_back_only_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trimmed: list[int] = []
    monkeypatch.setattr(tuning, "_c_function", lambda name: trimmed.append)
    Tuning().after_first_sync()
    assert trimmed == []
    Tuning(trim_after_sync=True).after_first_sync()
    assert trimmed == [0]


def test_the_run_command_tunes_the_process_before_the_app_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``k8s-bridge run`` applies the tuning, then builds the app with its after-sync step."""
    calls: list[str] = []
    applied: list[Tuning] = []
    seen: dict[str, Any] = {}

    def fake_apply(t: Tuning) -> Tuning:
        calls.append("apply")
        applied.append(t)
        return t

    class FakeApp:
        def __init__(self, settings: Any, *, after_first_sync: Any = None) -> None:
            calls.append("app")
            seen["after_first_sync"] = after_first_sync

        async def run(self, stop: Any) -> None:
            calls.append("run")

    import bridge.logging
    import bridge.service.app as app_module

    # The command configures logging for the whole process; later tests must not inherit it.
    monkeypatch.setattr(bridge.logging, "configure_logging", lambda *a, **k: None)
    monkeypatch.setattr(tuning, "apply", fake_apply)
    monkeypatch.setattr(app_module, "BridgeApp", FakeApp)
    config = tmp_path / "bridge.yaml"
    config.write_text(
        "resources: [{apiVersion: v1, kind: ConfigMap}]\n"
        "sink: {kind: nats, nats: {servers: ['nats://127.0.0.1:4222']}}\n"
        "informer: {gcThreshold: 777}\n"
    )
    assert cli.main(["run", "--config", str(config)]) == 0
    assert calls == ["apply", "app", "run"]
    assert applied == [Tuning.for_run(InformerSettings(gc_threshold=777))]
    assert seen["after_first_sync"] == applied[0].after_first_sync
