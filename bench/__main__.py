"""``python -m bench [name ...] [--options for them]``: run the named benchmarks, or all of them.

A benchmark is any module of this package that defines ``main(argv) -> int``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path


def discover() -> dict[str, Callable[[list[str]], int]]:
    found: dict[str, Callable[[list[str]], int]] = {}
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{mod.name}")
        main = getattr(module, "main", None)
        if callable(main):
            found[mod.name] = main
    return found


def run(argv: list[str]) -> int:
    # Leading bare words name benchmarks; everything from the first option on is theirs.
    names: list[str] = []
    rest = list(argv)
    while rest and not rest[0].startswith("-"):
        names.append(rest.pop(0))
    if rest[:1] == ["--"]:
        rest.pop(0)
    benches = discover()
    unknown = [n for n in names if n not in benches]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(sorted(benches))}")
        return 2
    status = 0
    for name in names or sorted(benches):
        print(f"== {name}")
        status |= benches[name](rest)
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
