"""docs/informer-checklist.md and the tests that cite it stay in step.

Every checklist number a test (or the code, the README, a page of docs/) cites is a
statement of the page; every statement names at least one test, by file and
function, and those exist, unless it says the bridge does not reproduce it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "informer-checklist.md"
THIS = Path(__file__).resolve()
# The pages beside the checklist that may cite it.
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p != DOC)]

STATEMENT = re.compile(r"^### (\d+)\. ", re.M)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
# "checklist 14", "Checklist 1, 5", "checklist 1-13, 15-18", "Checklists 36-38", "Checklist 1/2/8"
TEXT_REF = re.compile(r"[Cc]hecklists? (\d+(?:\s*[-,/]\s*\d+)*)")
# test_checklist_12_…; test_checklist_8_9_… cites 8 and 9 (numbers in a row), not 10_429_… → 429
NAME_REF = re.compile(r"^test_checklist_(\d+)((?:_\d+)*)")
# A statement the bridge does not reproduce keeps its number and names no test.
NOT_REPRODUCED = "*Not reproduced.*"


def statements() -> dict[int, str]:
    text = DOC.read_text()
    marks = list(STATEMENT.finditer(text))
    return {
        int(m.group(1)): text[m.start() : marks[i + 1].start() if i + 1 < len(marks) else None]
        for i, m in enumerate(marks)
    }


def numbers_in_text(text: str) -> set[int]:
    found: set[int] = set()
    for m in TEXT_REF.finditer(text):
        for part in re.split(r"\s*[,/]\s*", m.group(1)):
            low, _, high = re.sub(r"\s*-\s*", "-", part).partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


def numbers_in_name(name: str) -> set[int]:
    m = NAME_REF.match(name)
    if m is None:
        return set()
    found = [int(m.group(1))]
    for token in m.group(2).split("_")[1:]:
        if int(token) != found[-1] + 1:
            break
        found.append(int(token))
    return set(found)


def cited() -> dict[int, set[str]]:
    """Checklist number → where it is cited (tests, the bridge's code, the README, docs/)."""
    out: dict[int, set[str]] = {}
    files = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bridge").rglob("*.py"))]
    for path in [*files, *PAGES]:
        if path.resolve() == THIS:
            continue
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        for n in numbers_in_text(text):
            out.setdefault(n, set()).add(where)
        if path.suffix == ".py" and path.name.startswith("test_"):
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    for n in numbers_in_name(node.name):
                        out.setdefault(n, set()).add(f"{where}::{node.name}")
    return out


def test_the_reference_grammar() -> None:
    assert numbers_in_text("Checklist 1, 5: x; checklist 1-3, 15-16 and checklists 36-38") == {
        1, 2, 3, 5, 15, 16, 36, 37, 38,
    }  # fmt: skip
    assert numbers_in_text("# Checklist 1/2/8: ...; (checklist 11)") == {1, 2, 8, 11}
    assert numbers_in_name("test_checklist_8_9_expired_watch") == {8, 9}
    assert numbers_in_name("test_checklist_10_429_with_retry_after") == {10}
    assert numbers_in_name("test_checklist_01_first_list") == {1}
    assert numbers_in_name("test_other") == set()


def test_statements_are_numbered_once_each_in_order() -> None:
    numbers = [int(m.group(1)) for m in STATEMENT.finditer(DOC.read_text())]
    assert numbers == list(range(1, len(numbers) + 1))


def test_every_cited_number_is_a_statement_of_the_page() -> None:
    stated = statements()
    missing = {n: sorted(where) for n, where in cited().items() if n not in stated}
    assert not missing, f"cited but not in {DOC.relative_to(ROOT)}: {missing}"


def test_every_statement_names_tests_that_exist() -> None:
    for number, block in statements().items():
        refs = TEST_REF.findall(block)
        if NOT_REPRODUCED in block:
            assert not refs, f"statement {number} is not reproduced yet names tests"
            continue
        assert refs, f"statement {number} names no test"
        for file, name in refs:
            path = ROOT / file
            assert path.is_file(), f"statement {number}: {file} does not exist"
            functions = {
                node.name
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in functions, f"statement {number}: {file} has no {name}"


def test_nothing_points_at_the_old_file_name() -> None:
    old = "INFORMER-" + "CHECKLIST.md"  # spelled apart so this file does not match itself
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bridge").rglob("*.py")]
    stale = [
        str(p.relative_to(ROOT))
        for p in [*files, *PAGES]
        if p.resolve() != THIS and old in p.read_text()
    ]
    assert stale == []
