"""docs/development.md names every module of bridge/, room by room, as the tree has them."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _layout_tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "modules_layout", ROOT / "tools/modules-layout.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_room_of_the_tree_is_described() -> None:
    tool = _layout_tool()
    rooms = {p.name for p in (ROOT / "bridge").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(tool.ROOMS), "add the room to ROOMS in tools/modules-layout.py"


def test_the_development_doc_lists_every_module() -> None:
    doc = (ROOT / "docs/development.md").read_text()
    assert _layout_tool().layout() in doc, (
        "docs/development.md's bridge/ block is out of date: "
        "paste the output of `python tools/modules-layout.py` over it"
    )
