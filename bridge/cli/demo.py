"""``k8s-bridge demo``: the bridge against an embedded emulator with realistic churn, no setup.

Events are printed as one human line each (or as whole CloudEvents with
``--json``); on Ctrl-C (or after ``--duration``) the bridge flushes and a
summary shows what was published and what was suppressed as no real change.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from bridge.aiotasks import cancel_and_wait
from bridge.cli.stdio import EXIT_BROKEN_PIPE, discard_stdout
from bridge.emulator.churn import ChurnGenerator
from bridge.emulator.server import Emulator
from bridge.ground.envelope import Event
from bridge.logging import configure_logging
from bridge.service.app import BridgeApp
from bridge.service.settings import load_settings
from bridge.service.wiring import build_sink
from bridge.sinks.base import Sink

DEMO_RESOURCES = [
    {"apiVersion": "v1", "kind": "Pod", "ignoreFields": ["status.conditions"]},
    {"apiVersion": "apps/v1", "kind": "Deployment"},
    {"apiVersion": "v1", "kind": "Node", "ignoreFields": ["status.conditions"]},
    {"apiVersion": "example.com/v1", "kind": "Widget"},
]


class PrintingSink:
    """Wraps the real sink and prints each acknowledged event on the terminal.

    When the reader of ``out`` goes away (``demo | head``), printing stops and
    ``on_reader_gone`` asks the demo to end, quietly, like any Unix tool.
    """

    def __init__(
        self,
        inner: Sink | None,
        out: TextIO,
        *,
        as_json: bool,
        on_reader_gone: Callable[[], None] = lambda: None,
    ) -> None:
        self.inner = inner
        self.out = out
        self.as_json = as_json
        self.on_reader_gone = on_reader_gone
        self.reader_gone = False
        self.counts: Counter[str] = Counter()

    async def start(self) -> None:
        if self.inner is not None:
            await self.inner.start()

    async def publish(self, events: Sequence[Event]) -> Mapping[int, str]:
        refused: Mapping[int, str] = {}
        if self.inner is not None:
            refused = await self.inner.publish(events)
        if self.reader_gone:
            return refused
        try:
            self._print([e for i, e in enumerate(events) if i not in refused])
        except BrokenPipeError:
            self.reader_gone = True
            if self.out is sys.stdout:
                discard_stdout()
            self.on_reader_gone()
        return refused

    def _print(self, events: Sequence[Event]) -> None:
        for e in events:
            change = e.type.rsplit(".", 1)[-1]
            kind = e.type.split(".")[-2]
            self.counts[f"{kind} {change}"] += 1
            if self.as_json:
                self.out.write(e.to_json().decode() + "\n")
            else:
                initial = "  (initial list)" if e.initial else ""
                tomb = "  (tombstone)" if e.data.get("tombstone") else ""
                self.out.write(
                    f"{change.upper():9} {kind:11} {e.subject:40} rv={e.resource_version}{initial}{tomb}\n"
                )
        self.out.flush()

    async def ping(self) -> bool:
        return True if self.inner is None else await self.inner.ping()

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


async def run_demo(args: argparse.Namespace, stop: asyncio.Event, out: TextIO) -> int:
    configure_logging("console", "warning")
    with tempfile.TemporaryDirectory(prefix="k8s-bridge-demo-") as tmp:
        emu = Emulator(bookmark_interval=5.0)
        churn = ChurnGenerator(emu, rate=args.rate, seed=7)
        await emu.start()
        try:
            churn.setup()
            kubeconfig = emu.write_kubeconfig(Path(tmp) / "kubeconfig")
            settings = load_settings(
                None,
                {
                    "cluster": {"kubeconfig": str(kubeconfig), "name": "demo"},
                    "resources": DEMO_RESOURCES,
                    "sink": {
                        "kind": args.sink,
                        "nats": {"servers": [args.nats_url]},
                        "kafka": {"bootstrapServers": [args.kafka_bootstrap]},
                    },
                    "checkpoint": {"kind": "memory", "flushInterval": 0.2},
                    "server": {"host": "127.0.0.1", "port": 0},
                },
                env={},
            )
            inner = None if args.sink == "stdout" else build_sink(settings)
            sink = PrintingSink(inner, out, as_json=args.json, on_reader_gone=stop.set)
            app = BridgeApp(settings, sink=sink)
            out.write(
                f"k8s-bridge demo: emulated API at {emu.url}, sink {args.sink}, "
                f"{args.rate:g} changes/s; Ctrl-C stops\n"
            )
            out.flush()
            started = time.monotonic()
            churn_task = asyncio.create_task(_churn_when_synced(app, churn), name="churn")
            timer = asyncio.create_task(_stop_after(stop, args.duration), name="timer")
            try:
                await app.run(stop)
            finally:
                await cancel_and_wait([churn_task, timer])
            if sink.reader_gone:
                return EXIT_BROKEN_PIPE
            _summary(out, app, sink, churn, time.monotonic() - started)
        finally:
            await emu.stop()
    return 0


async def _churn_when_synced(app: BridgeApp, churn: ChurnGenerator) -> None:
    while not app.readiness()[0]:
        await asyncio.sleep(0.1)
    await churn.run()


async def _stop_after(stop: asyncio.Event, seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)
        stop.set()


def _summary(
    out: TextIO, app: BridgeApp, sink: PrintingSink, churn: ChurnGenerator, elapsed: float
) -> None:
    published = sum(sink.counts.values())
    suppressed = sum(p.stats.suppressed for p in app.pipelines)
    out.write(
        f"\n--- {elapsed:.1f}s: {churn.changes} changes made, {published} events published, "
        f"{suppressed} updates suppressed as no real change ---\n"
    )
    for what, n in sorted(sink.counts.items()):
        out.write(f"  {what:24} {n}\n")
    out.flush()
