"""Idle footprint: the resident memory of a ``k8s-bridge run`` process with nothing to publish.

    python -m bench idle [--rounds 3] [--settle 5] [--tree LABEL=PATH ...] [--no-write]

The emulator (in this process) serves one ConfigMap that the bridge's label
selector does not match; ``k8s-bridge run`` (stdout sink, SQLite checkpoint,
JSON logs) starts, syncs an empty list and then waits on its watch. Once
ready and ``--settle`` seconds later its ``VmRSS`` (and peak ``VmHWM``) is read
from /proc. Also counted: the modules it imported (``sys.modules`` of a
process importing what ``run`` imports).

The floor, measured in the same run: a bare interpreter, and one that imports
asyncio and aiohttp (the HTTP client any watcher in Python needs) and waits.
``--tree LABEL=PATH`` runs the bridge from another source tree too (its
PYTHONPATH), alternating rounds with this one: before/after figures of one run.

Each tree's ``bridge`` package is byte-compiled first (``compileall``, into its
git-ignored ``__pycache__``), as pip compiles the wheel the image installs: a
process that compiles its own modules at start keeps ~3 MiB of the compiler's
leftovers, which no installed bridge pays.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench._support import (
    BENCHMARKS_MD,
    compile_bridge,
    cpu_model,
    free_port,
    update_benchmarks_md,
)

SECTION = "Idle footprint"
HERE = str(Path(__file__).resolve().parent.parent)
# What ``k8s-bridge run`` imports before it reads its settings (bridge/cli/main.py).
RUN_IMPORTS = (
    "import bridge.cli.main, bridge.logging, bridge.service.tuning, bridge.service.app,"
    " bridge.service.settings, bridge.sinks.stdout, bridge.checkpoints.sqlite\n"
    # The CLI's parser is built before the settings are read: what it imports counts.
    "bridge.cli.main.build_parser()"
)
FLOORS = {
    "bare interpreter": "import time; print('ready', flush=True); time.sleep(3600)",
    "asyncio + aiohttp": (
        "import asyncio, aiohttp\n"
        "async def idle():\n"
        "    async with aiohttp.ClientSession():\n"
        "        print('ready', flush=True); await asyncio.sleep(3600)\n"
        "asyncio.run(idle())\n"
    ),
}


def status_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def module_count(tree: str) -> int:
    code = f"{RUN_IMPORTS}\nimport sys\nprint(len(sys.modules))"
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True
    )
    return int(out.stdout.strip() or 0)


async def bridge_rss(tree: str, kubeconfig: Path, workdir: Path, settle: float) -> dict[str, int]:
    port = free_port()
    config = {
        "cluster": {"kubeconfig": str(kubeconfig)},
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": "bench=none"}],
        "sink": {"kind": "stdout"},
        "checkpoint": {"kind": "sqlite", "path": str(workdir / f"state-{port}.db")},
        "server": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "warning"},
    }
    path = workdir / f"bridge-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    # cwd too: ``python -m`` puts the working directory before PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": tree}
    with (workdir / "bridge.log").open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.cli", "run", "--config", str(path),
            stdout=asyncio.subprocess.DEVNULL, stderr=err, env=env, cwd=tree,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"bridge not ready; see {workdir / 'bridge.log'}")
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        await asyncio.sleep(settle)
        return status_kib(proc.pid)
    finally:
        proc.terminate()
        await proc.wait()


def floor_rss(code: str, settle: float) -> dict[str, int]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(min(settle, 1.0))
        return status_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait()


async def run(trees: dict[str, str], rounds: int, settle: float) -> dict[str, list[dict[str, int]]]:
    for tree in trees.values():
        compile_bridge(tree)
    from bridge.emulator import Emulator
    from bridge.emulator.server import write_kubeconfig

    emu = Emulator()
    emu.create({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "other", "namespace": "default"}, "data": {"a": "b"}})  # fmt: skip
    await emu.start()
    got: dict[str, list[dict[str, int]]] = {label: [] for label in [*trees, *FLOORS]}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
            workdir = Path(tmp)
            kubeconfig = write_kubeconfig(workdir / "kubeconfig", emu.url)
            for _ in range(rounds):
                for label, tree in trees.items():
                    got[label].append(await bridge_rss(tree, kubeconfig, workdir, settle))
                    print(f"  {label}: {got[label][-1]}", flush=True)
                for label, code in FLOORS.items():
                    got[label].append(await asyncio.to_thread(floor_rss, code, settle))
    finally:
        await emu.stop()
    return got


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench idle", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle after ready")
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH of another tree")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    trees = {"k8s-bridge run": HERE}
    for item in args.tree:
        label, _, path = item.partition("=")
        trees[f"k8s-bridge run ({label})"] = str(Path(path).resolve())
    got = asyncio.run(run(trees, args.rounds, args.settle))
    modules = {label: module_count(tree) for label, tree in trees.items()}
    floor = statistics.median(r["VmRSS"] for r in got["asyncio + aiohttp"]) / 1024
    rows = []
    for label, samples in got.items():
        rss = [r["VmRSS"] / 1024 for r in samples]
        hwm = [r["VmHWM"] / 1024 for r in samples]
        mods = f"{modules[label]:,}" if label in modules else ""
        rows.append(
            f"| {label} | {min(rss):.1f}-{max(rss):.1f} | {statistics.median(rss):.1f}"
            f" ({statistics.median(rss) / floor:.2f}) | {max(hwm):.1f} | {mods} |"
        )
        print(rows[-1], flush=True)
    body = (
        f"`python -m bench idle --rounds {args.rounds} --settle {args.settle:g}` on"
        f" {cpu_model()} ({os.cpu_count()} cores, shared), Python {platform.python_version()}:"
        " `k8s-bridge run` (stdout sink, SQLite checkpoint) watching ConfigMaps of the emulator"
        " through a selector that matches none, its modules byte-compiled as pip does,"
        " read once ready and"
        f" {args.settle:g} s idle; in brackets the ratio to the floor (asyncio + aiohttp"
        " imported, one session, waiting), measured in the same run; modules: what `run`"
        " imports before its settings are read.\n\n"
        "| process | RSS MiB (min-max) | median (ratio to floor) | peak MiB | modules |\n"
        "| --- | ---: | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n"
    )
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0
