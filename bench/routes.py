"""``python -m bench routes``: what ``sink.routes`` cost per event, off and on.

Realistic ~3 KB pods (bench/decode.py's, 40 namespaces), built and sealed as the
pipeline does, then turned into the Kafka sink's records (``KafkaSink.records``:
topic, key, value, headers per route) as its publish does before handing them
to the producer. Three configurations:

- **the ceiling**: the builder without routes and one record per event made
  the way the sink made it before routes (``_record``), in the same run;
- **routes off** (``sink.routes: []``): the path every bridge without routes
  runs now;
- **two routes on** (``routing: all``, ``namespace.startsWith('team-0')`` and
  ``labels.app == 'web'``): two CEL evaluations per event, and one or two
  records per event (about a quarter of the pods match both).

Events per CPU second, best of 7 rounds taken in turns; the ratio is against the ceiling. Writes the
"Routes" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from collections.abc import Callable
from datetime import date

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod
from bridge.delivery.changes import Change, ChangeKind
from bridge.delivery.events import EventBuilder
from bridge.delivery.routes import Router
from bridge.sinks.kafka import KafkaSink

SECTION = "Routes"
ROUTES = [
    ("team-0", "object.metadata.namespace.startsWith('team-0')"),
    ("web", "object.metadata.labels.app == 'web'"),
]


def _rates(runs: list[Callable[[], int]], events: int, rounds: int = 7) -> list[float]:
    """Events per CPU second of each run, best of ``rounds``; the runs take turns within
    a round, each after a full collection, so the machine's and the GC's drift hit them
    alike. CPU time, not wall time: on a shared machine the wall clock counts others' work."""
    best = [0.0] * len(runs)
    for _ in range(rounds):
        for i, run in enumerate(runs):
            gc.collect()
            start = time.process_time()
            run()
            best[i] = max(best[i], events / (time.process_time() - start))
    return best


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench routes")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    pods = [make_pod(i) for i in range(args.events)]
    changes = [Change(ChangeKind.MODIFIED, p, "k") for p in pods]

    def builder(router: Router | None) -> EventBuilder:
        return EventBuilder(
            cluster="c", group="", version="v1", kind="Pod", plural="pods", router=router
        )

    plain, routed = builder(None), builder(Router(ROUTES, "all"))
    sink = KafkaSink(["127.0.0.1:9"], topic="k8s", routes={n: f"k8s-{n}" for n, _ in ROUTES})
    off_events = [plain.build(c, sealed=True) for c in changes]
    on_events = [routed.build(c, sealed=True) for c in changes]
    records_on = len(sink.records(on_events))

    def records_ceiling() -> int:
        return len([sink._record(e) for e in off_events])

    def records_off() -> int:
        return len(sink.records(off_events))

    def records_on_() -> int:
        return len(sink.records(on_events))

    def build_ceiling() -> int:
        # Two passes, as the others: events are built, then the batch is published.
        built = [plain.build(c, sealed=True) for c in changes]
        return len([sink._record(e) for e in built])

    def build_off() -> int:
        return len(sink.records([plain.build(c, sealed=True) for c in changes]))

    def build_on() -> int:
        return len(sink.records([routed.build(c, sealed=True) for c in changes]))

    n = len(changes)
    labels = [
        "records, one per event as before routes (ceiling)",
        "records, routes off",
        "records, two routes on",
        "build + seal + records, no routes as before (ceiling)",
        "build + seal + records, routes off",
        "build + seal + records, two routes on",
    ]
    runs = [records_ceiling, records_off, records_on_, build_ceiling, build_off, build_on]
    results = list(zip(labels, _rates(runs, n), strict=True))
    size = sum(len(e.encoded) for e in off_events) // n
    lines = [
        f"`python -m bench routes` — {n:,} pod events of {size:,} bytes (JSON); two routes"
        f" (routing all) give {records_on:,} records; {date.today()}, Python"
        f" {platform.python_version()}, {cpu_model()}.",
        "",
        "| path | events per CPU second | vs its ceiling |",
        "| --- | ---: | ---: |",
    ]
    for i, (label, rate) in enumerate(results):
        ceiling = results[i - i % 3][1]
        lines.append(f"| {label} | {rate:,.0f} | {rate / ceiling:.2f} |")
    lines += [
        "",
        "Off, an event pays one attribute test when built and one tuple more when its"
        " record is made; on, each route is one CEL evaluation over the fields it reads"
        " (metadata here) and each extra route an event goes to one more record.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
