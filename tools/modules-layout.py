"""Prints the layout block of docs/development.md: every module of bridge/, by room.

tests/unit/test_layout_doc.py fails when the block and the tree disagree; run
`python tools/modules-layout.py` and paste its output over the block.
"""

from __future__ import annotations

import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent / "bridge"

# What each room holds, in one line; the modules follow.
ROOMS = {
    "ground": "the ground floor: envelope, checkpoint row, bus connections, config sections,"
    " HTTP, metrics",
    "kube": "talking to Kubernetes (ListWatch → Reflector → RealFIFO → informer)",
    "sinks": "the Sink protocol and the buses",
    "checkpoints": "the CheckpointStore protocol and the stores",
    "delivery": "deciding and delivering one resource",
    "service": "the running bridge: settings, wiring, app, health, metrics",
    "consuming": "consumer groups: positions, Kafka group, JetStream durable",
    "mirroring": "Mirror, an informer over the bus, and its readers",
    "mirror": "`k8s-bridge mirror`: the bus into PostgreSQL",
    "cli": "one module per command; main parses and dispatches",
    "contract": "the published contract (JSON Schema, AsyncAPI), generated from the code",
    "emulator": "the Kubernetes API server emulator (tests, benchmarks, demo)",
}


def modules(room: pathlib.Path) -> list[str]:
    return sorted(p.stem for p in room.glob("*.py") if p.stem not in ("__init__", "__main__"))


def layout() -> str:
    lines = ["bridge/"]
    for room, what in ROOMS.items():
        lines.append(f"  {room + '/':13}{what}:")
        body = ", ".join(modules(ROOT / room))
        lines += textwrap.wrap(body, 86, initial_indent=" " * 15, subsequent_indent=" " * 15)
    top = ", ".join(f"{m}.py" for m in modules(ROOT))
    lines.append(f"  {top}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(layout())
