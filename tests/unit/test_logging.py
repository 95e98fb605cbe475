"""Logs follow their configuration in every module, in the order production sets them up.

Modules make their loggers at import, and the CLI reads the settings (and so
calls ``configure_logging``) only afterwards. A logger that kept what was in
force at import would write console lines, every level, forever.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.logging import (
    LibraryRateLimit,
    capture_logs,
    configure_logging,
    get_logger,
    reset_logging,
)

# Imports every bridge module first, configures (JSON, level warning) second, then
# logs from each module's logger; prints nothing itself.
SCRIPT = textwrap.dedent(
    """
    import importlib, json, logging, pkgutil, sys
    import bridge

    for info in pkgutil.walk_packages(bridge.__path__, "bridge."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)

    from bridge.logging import configure_logging

    configure_logging("json", "warning")
    probed = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("bridge"):
            continue
        for attr in ("log", "_log"):
            logger = vars(module).get(attr)
            if logger is None:
                continue
            if isinstance(logger, logging.Logger):
                logger.info("below the level %s", name)
                logger.warning("probe %s", name)
                probed[name] = "stdlib"
            else:
                logger.info("below the level", module=name)
                logger.warning("probe", module=name, password="hunter2")
                probed[name] = "bridge"
    with open(sys.argv[1], "w") as fh:
        json.dump(probed, fh)
    """
)

EXPECTED = {
    "bridge.service.app",
    "bridge.delivery.pipeline",
    "bridge.service.observer",
    "bridge.cli.replay",
    "bridge.consumer",
    "bridge.kube.lease",
    "bridge.kube.reflector",
    "bridge.kube.informer",
    "bridge.delivery.snapshot",
    "bridge.delivery.heartbeat",
}


def test_every_module_logs_as_configured_after_being_imported_first(tmp_path: Path) -> None:
    probed_file = tmp_path / "probed.json"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(probed_file)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    probed: dict[str, str] = json.loads(probed_file.read_text())
    assert EXPECTED <= probed.keys()
    assert proc.stdout == "", "log lines went to stdout"
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # JSON, every one
    assert all(line["level"] == "warning" for line in lines), "the level was not applied"
    for name, kind in probed.items():
        if kind == "bridge":
            mine = [line for line in lines if line.get("module") == name]
            assert [(m["event"], m["password"]) for m in mine] == [("probe", "[redacted]")]
        else:
            stdlib = [line["event"] for line in lines if line.get("logger") == name]
            assert stdlib == [f"probe {name}"]
    assert "hunter2" not in proc.stderr


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    reset_logging()


@pytest.mark.usefixtures("restore_logging")
def test_a_logger_follows_each_new_configuration_and_binds_lazily() -> None:
    log = get_logger("bridge.test")
    bound = log.bind(part="one")
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", "info", stream=first)
    bound.info("to the first", token="t")
    configure_logging("json", "warning", stream=second)
    bound.info("below the new level")
    bound.warning("to the second")
    assert [json.loads(line)["event"] for line in first.getvalue().splitlines()] == ["to the first"]
    line = json.loads(second.getvalue())
    assert (line["event"], line["logger"], line["part"]) == ("to the second", "bridge.test", "one")
    with capture_logs() as captured:
        bound.warning("captured")
    assert captured == [
        {"event": "captured", "logger": "bridge.test", "part": "one", "log_level": "warning"}
    ]


def test_a_client_library_repeating_itself_is_held_to_one_line_per_period() -> None:
    """An outage makes aiokafka repeat one complaint hundreds of times; the bridge's
    own warnings are never limited."""
    now = [0.0]
    limit = LibraryRateLimit(every=30.0, clock=lambda: now[0])

    def record(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), None)

    passed = [limit.filter(record("aiokafka", "Unable connect to %s")) for _ in range(294)]
    assert passed.count(True) == 1
    assert all(limit.filter(record("bridge.delivery.pipeline", "publish failed")) for _ in range(5))
    now[0] = 31.0
    again = record("aiokafka", "Unable connect to %s")
    assert limit.filter(again)
    assert "293 more like this" in str(again.msg)
