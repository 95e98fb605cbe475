"""How to decode a LIST body item by item: the contestants measured, in one process.

One LIST body of N Pods (~2.8 KB each, compact JSON as the API server writes
it) is held in memory and handed over in 1 MiB reads, like a socket delivers
it. Each contestant yields the decoded items one way or another:

  a) ``orjson.loads`` of each item's bytes, already cut out (the ceiling)
  b) ``orjson.loads`` of the whole body (what the bridge did before: all items at once)
  c) the bridge's ``ListBody`` (``ListSplitter`` + ``orjson.loads`` per item)
  d) ijson's C backend (``yajl2_c``), ``items(..., "items.item")``, if installed
  e) the stdlib's ``json.JSONDecoder.raw_decode`` walking the decoded text

Prints items/s and the ratio to (a), best of the rounds, and writes the
"List decoding" section of BENCHMARKS.md (``--no-write`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import time
from collections.abc import AsyncIterator, Callable

import orjson

from bench._support import BENCHMARKS_MD, cpu_model, update_benchmarks_md
from bench.decode import make_pod

SECTION = "List decoding"
READ = 1 << 20


def make_body(n: int) -> tuple[bytes, list[bytes]]:
    items = []
    for i in range(n):
        pod = make_pod(i)
        del pod["kind"], pod["apiVersion"]  # list items come without them
        items.append(orjson.dumps(pod))
    head = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"12345"},"items":['
    return head + b",".join(items) + b"]}", items


def contestants(body: bytes, items: list[bytes]) -> dict[str, Callable[[], int]]:
    from bridge.kube.liststream import ListBody

    def ceiling() -> int:
        n = 0
        for raw in items:
            orjson.loads(raw)
            n += 1
        return n

    def whole() -> int:
        return len(orjson.loads(body)["items"])

    def bridge() -> int:
        async def reads() -> AsyncIterator[bytes]:
            for i in range(0, len(body), READ):
                yield body[i : i + READ]

        async def run() -> int:
            n = 0
            async for batch in ListBody(reads(), kind="Pod", api_version="v1", what="bench"):
                n += len(batch)
            return n

        return asyncio.run(run())

    def stdlib() -> int:
        text = body.decode()
        decoder = json.JSONDecoder()
        pos = text.index('"items":[') + len('"items":[')
        n = 0
        while text[pos] != "]":
            _, pos = decoder.raw_decode(text, pos)
            n += 1
            if text[pos] == ",":
                pos += 1
        return n

    out = {
        "(a) `orjson.loads` per item, already cut out (ceiling)": ceiling,
        "(b) `orjson.loads` of the whole body (before)": whole,
        "(c) bridge `ListBody`: `ListSplitter` + `orjson.loads` per item": bridge,
    }
    try:
        import ijson

        if ijson.backend == "yajl2_c":

            def ijson_c() -> int:
                return sum(1 for _ in ijson.items(io.BytesIO(body), "items.item"))

            out["(d) ijson `yajl2_c` `items(…, 'items.item')`"] = ijson_c
    except ImportError:
        pass
    out["(e) stdlib `json.JSONDecoder.raw_decode` per item"] = stdlib
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench listsplit", description=__doc__)
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true")
    args, _ = p.parse_known_args(argv)
    body, items = make_body(args.objects)
    print(f"{args.objects:,} Pods, {len(body) / 2**20:.0f} MiB body")
    results: dict[str, float] = {}
    for name, fn in contestants(body, items).items():
        best = 0.0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            count = fn()
            best = max(best, count / (time.perf_counter() - t0))
            assert count == args.objects, (name, count)
        results[name] = best
        print(f"  {best:>10,.0f} items/s  {name}")
    ceiling = next(iter(results.values()))
    rows = [f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} |" for name, rate in results.items()]
    avg = sum(map(len, items)) // len(items)
    body_md = "\n".join(
        [
            f"`python -m bench listsplit --objects {args.objects} --rounds {args.rounds}` — one",
            f"LIST body of {args.objects:,} Pods (~{avg:,} bytes each, compact as the API server",
            "writes it) in memory, handed over in 1 MiB reads; items/s, best of the rounds.",
            "",
            "| decoder | items/s | vs (a) |",
            "| --- | ---: | ---: |",
            *rows,
            "",
            "(b) holds every item at once, and the collector rescans them as they pile up.",
            "(c) is what the reflector uses: a guess at each item's end (the next item starts",
            'with `},{"<first key>":`) proven by the decode itself. (d) builds the objects in',
            "C but event by event, and would be a new dependency. msgspec is not in the",
            "race: it decodes whole documents only (its `Raw` still needs the whole body).",
            "",
            f"Machine: {cpu_model()}, shared with other work while measuring, Python "
            f"{platform.python_version()}, orjson {orjson.__version__}.",
        ]
    )
    print()
    print(body_md)
    if not args.no_write:
        update_benchmarks_md(BENCHMARKS_MD, SECTION, body_md)
    return 0
