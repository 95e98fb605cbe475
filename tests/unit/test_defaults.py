"""Defaults live in settings.py: a component's own default for the same option agrees.

A disagreement means the same option behaves differently built from a config
file and built in code (tests, benchmarks, embedding): e.g. the Kafka batch
size once was 16 KiB in settings and 1 MiB in the sink.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from bridge.delivery.pipeline import PipelineSettings
from bridge.ground.sections import Section, fields_of
from bridge.service.settings import InformerSettings, KafkaSettings, NatsSettings, SinkSettings
from bridge.sinks.kafka import KafkaSink
from bridge.sinks.nats import NatsSink


def init_defaults(cls: type) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def model_defaults(model: type[Section]) -> dict[str, Any]:
    out = {}
    for name, field in fields_of(model).items():
        value = field.get_default()
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


@pytest.mark.parametrize(
    ("component", "section"), [(KafkaSink, KafkaSettings), (NatsSink, NatsSettings)]
)
def test_a_sinks_defaults_are_its_settings_defaults(component: type, section: type) -> None:
    ours, theirs = init_defaults(component), model_defaults(section)
    shared = set(ours) & set(theirs)
    assert shared, "no option in common?"
    differ = {
        k: (ours[k], theirs[k])
        for k in shared
        if (list(ours[k]) if isinstance(ours[k], tuple) else ours[k]) != theirs[k]
    }
    assert not differ, f"{component.__name__} defaults disagree with settings: {differ}"


def test_the_pipelines_defaults_are_the_settings_defaults() -> None:
    p = PipelineSettings()
    sink, informer = SinkSettings(kind="stdout"), InformerSettings()
    assert (p.max_batch, p.linger, p.steady_linger, p.poison_policy) == (
        sink.max_batch,
        sink.linger,
        sink.steady_linger,
        sink.poison_policy,
    )
    assert (p.slim, p.max_queued, p.resync_period) == (
        informer.slim,
        informer.max_queued,
        informer.resync_period,
    )
