"""A benchmark rewrites its own section of BENCHMARKS.md and keeps what was written by hand."""

from __future__ import annotations

from pathlib import Path

from bench._support import NOTES_MARK, update_benchmarks_md

BEFORE = f"""# Benchmarks

## Sinks

sinks table

## In process

old table

{NOTES_MARK}

Earlier runs, by hand.

### An experiment

Kept too.

## Slow bus

slow table

Said by hand without a mark: part of the measured text.
"""


def test_a_rerun_replaces_only_the_measured_part_of_its_section(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE)
    update_benchmarks_md(path, "In process", "new table")
    text = path.read_text()
    assert "old table" not in text
    assert f"## In process\n\nnew table\n\n{NOTES_MARK}\n\nEarlier runs, by hand." in text
    assert "### An experiment\n\nKept too.\n\n## Slow bus" in text
    assert "sinks table" in text


def test_a_section_whose_notes_start_at_a_subheading_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE.replace(f"{NOTES_MARK}\n\nEarlier runs, by hand.\n\n", ""))
    update_benchmarks_md(path, "In process", "new table")
    assert "## In process\n\nnew table\n\n### An experiment\n\nKept too." in path.read_text()


def test_the_last_section_is_replaced_to_the_end_and_a_new_one_appended(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BEFORE)
    update_benchmarks_md(path, "Slow bus", "new slow table")
    update_benchmarks_md(path, "Restart", "restart table")
    text = path.read_text()
    assert "Said by hand without a mark" not in text
    assert text.endswith("## Slow bus\n\nnew slow table\n\n## Restart\n\nrestart table\n")
