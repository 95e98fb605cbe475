"""Renamed and retired configuration keys: accepted, with one warning line each."""

from __future__ import annotations

import pytest

from bridge.service.settings import load_settings

BASE = {"resources": [{"apiVersion": "v1", "kind": "Pod"}], "sink": {"kind": "stdout"}}


def test_the_old_name_of_commit_interval_is_honoured_with_one_warning() -> None:
    s = load_settings(None, {**BASE, "checkpoint": {"flushInterval": 0.25}}, env={})
    assert s.checkpoint.commit_interval == 0.25
    [line] = s.checkpoint.deprecations()
    assert "checkpoint.flushInterval is deprecated" in line and "commitInterval" in line


def test_the_new_name_wins_when_both_are_given() -> None:
    s = load_settings(
        None, {**BASE, "checkpoint": {"flushInterval": 0.25, "commitInterval": 2.0}}, env={}
    )
    assert s.checkpoint.commit_interval == 2.0
    assert "commitInterval wins" in s.checkpoint.deprecations()[0]


def test_flush_events_is_ignored_but_said_so() -> None:
    s = load_settings(None, {**BASE, "checkpoint": {"flushEvents": 100}}, env={})
    [line] = s.checkpoint.deprecations()
    assert "flushEvents is deprecated and ignored" in line


@pytest.mark.parametrize("checkpoint", [{}, {"commitInterval": 0.5}])
def test_current_keys_warn_nothing(checkpoint: dict[str, float]) -> None:
    s = load_settings(None, {**BASE, "checkpoint": checkpoint}, env={})
    assert s.checkpoint.deprecations() == []
