"""``python -m bench views``: the cost of change triggers and projections per object.

Fingerprints/s over realistic ~3 KB pods (bench/decode.py's), each a distinct
object (the fingerprinter remembers only the last one), for: the plain
fingerprint (ignore paths only), ``triggerPaths``, ``generationOnly`` and
``fields``; and events/s of ``EventBuilder.build`` with and without ``fields``.
The ceiling is ``orjson.dumps`` of the whole object (every fingerprint
serialises at least what it hashes). Writes the "Triggers and projections"
section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from datetime import date
from typing import Any

import orjson

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod
from bridge.delivery.changes import Change, ChangeKind, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.delivery.views import fingerprinter_for

SECTION = "Triggers and projections"
IGNORE = ["status.conditions"]
TRIGGERS = ["spec.nodeName", "status.phase", "spec.containers.image"]
FIELDS = ["spec.nodeName", "status.phase", "metadata.labels"]


def _rate(fn: Callable[[Any], Any], objs: list[Any], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while True:
        for o in objs:
            fn(o)
        n += len(objs)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench views")
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    pods = [make_pod(i) for i in range(args.objects)]
    for p in pods:
        p["metadata"].setdefault("generation", 1)  # as pods of a Deployment carry
    size = sum(len(orjson.dumps(p)) for p in pods) // len(pods)

    def fp(f: Fingerprinter) -> Callable[[Any], Any]:
        return f.fingerprint

    def build(b: EventBuilder) -> Callable[[Any], Any]:
        return lambda o: b.build(Change(ChangeKind.MODIFIED, o, "k")).to_json()

    def builder(**kw: Any) -> EventBuilder:
        return EventBuilder(cluster="c", group="", version="v1", kind="Pod", plural="pods", **kw)

    rows: list[tuple[str, Callable[[Any], Any]]] = [
        ("`orjson.dumps` of the whole object (ceiling)", orjson.dumps),
        ("fingerprint, ignore paths only (before)", fp(Fingerprinter(IGNORE))),
        (
            "fingerprint, `triggerPaths` (3 paths)",
            fp(fingerprinter_for(ignore_fields=IGNORE, trigger=TRIGGERS)),
        ),
        (
            "fingerprint, `generationOnly`",
            fp(fingerprinter_for(ignore_fields=IGNORE, generation_only=True)),
        ),
        (
            "fingerprint, `fields` (3 paths)",
            fp(fingerprinter_for(ignore_fields=IGNORE, fields=FIELDS)),
        ),
        ("event build + encode, whole object", build(builder())),
        ("event build + encode, `fields` (3 paths)", build(builder(fields=FIELDS))),
    ]
    results = []
    for label, fn in rows:
        rate = _rate(fn, pods, args.seconds)
        results.append((label, rate))
    ceiling = results[0][1]
    lines = [
        "`python -m bench views` — per object, over distinct realistic pods of "
        f"{size:,} bytes (JSON); {date.today()}, Python {platform.python_version()}, "
        f"{cpu_model()}.",
        "",
        "| what | objects/s | vs ceiling |",
        "| --- | ---: | ---: |",
    ]
    for label, rate in results:
        lines.append(f"| {label} | {rate:,.0f} | {rate / ceiling:.2f} |")
    whole = len(builder().build(Change(ChangeKind.MODIFIED, pods[0], "k")).to_json())
    cut = len(builder(fields=FIELDS).build(Change(ChangeKind.MODIFIED, pods[0], "k")).to_json())
    lines += [
        "",
        f"Event size: {whole:,} bytes whole, {cut:,} bytes with `fields` (3 paths). "
        "Triggers and projections make fingerprints cheaper, not dearer: less is "
        "serialised and hashed than the whole object.",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
