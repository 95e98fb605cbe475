"""The published event schema as an oracle for the tests: ``assert_valid`` checks one
decoded event against docs/contract/event.schema.json (jsonschema, draft-07, formats
checked). The memory sink runs every event it takes through it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft7Validator, FormatChecker

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "contract" / "event.schema.json"


@functools.cache
def _validator() -> Draft7Validator:
    # The committed file, not the generator: tests/unit/test_contract.py keeps them equal.
    return Draft7Validator(orjson.loads(SCHEMA.read_bytes()), format_checker=FormatChecker())


def violations(event: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(envelope)'}: {e.message}"
        for e in _validator().iter_errors(event)
    ]


def assert_valid(event: dict[str, Any]) -> None:
    found = violations(event)
    assert not found, f"event {event.get('id')} breaks the contract: {'; '.join(found)}"
