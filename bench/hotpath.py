"""``python -m bench hotpath``: what one watch event costs the bridge, step by step.

Each step of the bridge's per-event work, timed on the same N distinct pod
watch lines (MODIFIED, ~2.8 KB, as the emulator encodes them), in µs per
event and as a multiple of ``orjson.loads`` of the line (the parse ceiling),
beside the alternatives the scale issue lists as worth trying:

- parse: the whole line against the bridge's lazy decode (metadata parsed,
  spec and status kept as the server's bytes, bridge/kube/rawjson.py) and
  against the metadata only (msgspec into a typed struct: name, namespace,
  uid, resourceVersion);
- the fingerprint, the cache record and the sealed event, on whole objects
  and on lazily decoded ones (the bridge's default when no configured path
  reads spec or status); the fingerprint (ignored fields stripped,
  sorted-key JSON, xxh3-128) against xxh3-128 of the raw bytes (a lower bound: a real one
  must leave resourceVersion and managedFields out);
- the sealed CloudEvent: built from the parsed object (what the bridge does)
  against splicing the line's raw object bytes between a prefix and a suffix;
- *hot* steps run right after the parse of the same line; *cold* ones after
  ``--ahead`` lines were parsed first, as a full FIFO holds them (the parsed
  trees no longer in the CPU's caches).

Best of ``--rounds``; no I/O, no event loop, the GC as the app sets it.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections.abc import Callable
from typing import Any

import orjson
import xxhash

from bench._support import BENCHMARKS_MD, cpu_model, tune_as_run, update_benchmarks_md
from bench.decode import make_pod
from bridge.delivery.changes import Change, ChangeKind, Fingerprinter
from bridge.delivery.events import EventBuilder
from bridge.kube.informer import slim_record
from bridge.kube.rawjson import ObjectDecoder

SECTION = "Hot path steps"


def _lines(n: int) -> list[bytes]:
    return [orjson.dumps({"type": "MODIFIED", "object": make_pod(i)}) for i in range(n)]


def _best(rounds: int, n: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def measure(n: int, rounds: int, ahead: int) -> list[tuple[str, float]]:
    import msgspec

    # Built with defstruct: this module's annotations are strings, and msgspec
    # cannot resolve a function's local classes from them.
    meta_type = msgspec.defstruct(
        "Meta", [(f, str, "") for f in ("name", "namespace", "uid", "resourceVersion")]
    )
    obj_type = msgspec.defstruct("Obj", [("metadata", meta_type)])
    line_type = msgspec.defstruct("Line", [("type", str), ("object", obj_type)])

    lines = _lines(n)
    meta_decoder = msgspec.json.Decoder(line_type)
    builder = EventBuilder(cluster="bench", group="", version="v1", kind="Pod", plural="pods")
    prefix = len(b'{"type":"MODIFIED","object":')

    def parse() -> None:
        for line in lines:
            orjson.loads(line)

    def parse_meta() -> None:
        for line in lines:
            meta_decoder.decode(line)

    def raw_hash() -> None:
        for line in lines:
            xxhash.xxh3_128_hexdigest(line)

    def splice() -> None:
        head = b'{"specversion":"1.0","id":"x","type":"t","source":"s","data":{"object":'
        for line in lines:
            b"".join((head, line[prefix:-1], b"}}"))

    fp = Fingerprinter()
    lazy = ObjectDecoder(fp.reads() or ())

    def parse_lazy() -> None:
        for line in lines:
            lazy.watch_event(line)

    def whole(line: bytes) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(line)["object"]
        return obj

    def lazily(line: bytes) -> dict[str, Any]:
        return lazy.watch_event(line)["object"]

    def per_line(
        step: Callable[[dict[str, Any]], object],
        cold: bool,
        decode: Callable[[bytes], dict[str, Any]],
    ) -> Callable[[], None]:
        def run() -> None:
            window = ahead if cold else 1
            for start in range(0, n, window):
                objs = [decode(line) for line in lines[start : start + window]]
                for obj in objs:
                    step(obj)

        return run

    def fingerprint(obj: dict[str, Any]) -> object:
        return fp.fingerprint(obj)

    def record(obj: dict[str, Any]) -> object:
        return slim_record(obj, fp.fingerprint)

    def seal(obj: dict[str, Any]) -> object:
        return builder.build(Change(ChangeKind.MODIFIED, obj, "k"), sealed=True)

    def everything(obj: dict[str, Any]) -> object:
        slim_record(obj, fp.fingerprint)
        return builder.build(Change(ChangeKind.MODIFIED, obj, "k"), sealed=True)

    parse_us = _best(rounds, n, parse)
    rows = [
        ("parse: orjson.loads of the line (the ceiling)", parse_us),
        ("parse: metadata only (msgspec struct)", _best(rounds, n, parse_meta)),
        (
            "parse: the bridge's lazy decode (metadata parsed, spec/status as bytes)",
            _best(rounds, n, parse_lazy),
        ),
        ("hash: xxh3-128 of the raw line (lower bound)", _best(rounds, n, raw_hash)),
        ("event: splice the raw object bytes", _best(rounds, n, splice)),
    ]
    for how, decode in (("whole object", whole), ("lazy", lazily)):
        for cold in (False, True):
            where = f"cold ({ahead} decoded ahead)" if cold else "hot"
            base = _best(rounds, n, per_line(lambda obj: None, cold, decode))
            for label, step in (
                ("fingerprint", fingerprint),
                ("cache record (fingerprint + pack)", record),
                ("sealed CloudEvent (build + encode)", seal),
                ("record + sealed event (the handler's work)", everything),
            ):
                took = _best(rounds, n, per_line(step, cold, decode)) - base
                rows.append((f"{label}, {how}, {where}", took))
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench hotpath", description=__doc__)
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ahead", type=int, default=1000, help="lines parsed ahead for cold steps")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    tune_as_run()
    gc.collect()
    rows = measure(args.objects, args.rounds, args.ahead)
    parse_us = rows[0][1]
    size = len(_lines(1)[0])
    print(f"{args.objects:,} pod watch lines of ~{size:,} bytes; best of {args.rounds}")
    print(f"{'step':62s} {'µs/event':>9s} {'/ parse':>8s}")
    for label, us in rows:
        print(f"{label:62s} {us:9.2f} {us / parse_us:8.2f}")
    if not args.no_write:
        table = [
            f"`python -m bench hotpath --objects {args.objects} --rounds {args.rounds}` —"
            f" {args.objects:,} distinct pod watch lines of ~{size:,} bytes, each step"
            " timed alone (no I/O, no event loop), best of the rounds; *hot*: right after"
            " the line's parse, *cold*: after "
            f"{args.ahead:,} lines were parsed ahead, as a full FIFO holds them.",
            "",
            "| step | µs per event | ratio to the parse |",
            "| --- | ---: | ---: |",
            *(f"| {label} | {us:.2f} | {us / parse_us:.2f} |" for label, us in rows),
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {cpu_model()}, 2 shared cores,"
            f" Python {platform.python_version()}.",
        ]
        update_benchmarks_md(
            BENCHMARKS_MD,
            SECTION,
            "\n".join(table),
        )
    return 0
