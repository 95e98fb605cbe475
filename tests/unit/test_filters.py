"""The filter expression: compiled once, one-line errors, evaluation on the fields it reads."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.delivery.filters import Filter, _prune, _read_paths, compile_filter
from bridge.errors import ConfigError
from bridge.service.settings import load_settings

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web-1", "namespace": "default", "labels": {"tier": "db", "app": "web"}},
    "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}], "nodeName": "n1"},
    "status": {"phase": "Running"},
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("object.status.phase == 'Running'", True),
        ("object.status.phase == 'Failed'", False),
        ("type == 'deleted' || object.metadata.labels['tier'] == 'db'", True),
        ("object.spec.containers.exists(c, c.image.startsWith('nginx'))", True),
        ("has(object.status.reason)", False),
        ("'app' in object.metadata.labels && size(object.metadata.labels) == 2", True),
        ("size(object) == 5", True),  # uses object whole
        ("oldObject == null", True),
        ("object['kind'] == 'Pod'", True),
    ],
)
def test_an_expression_sees_the_object_as_the_api_server_returned_it(
    expression: str, expected: bool
) -> None:
    assert Filter(expression).matches(POD) is expected


def test_type_and_old_object_are_what_the_caller_passes() -> None:
    f = Filter("type == 'added' || object.status.phase != oldObject.status.phase")
    assert f.matches(POD, None, "added")
    old = copy.deepcopy(POD)
    assert not f.matches(POD, old, "modified")
    old["status"]["phase"] = "Pending"
    assert f.matches(POD, old, "modified")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "object.status.phase ==",
            "does not compile: line 1, column 23: Syntax error: mismatched input '<EOF>'",
        ),
        ("  ", "the filter expression is empty"),
        (
            "phase == 'Failed'",
            "unknown variable 'phase' (the filter sees object, oldObject and type)",
        ),
    ],
)
def test_an_expression_that_does_not_compile_is_one_line_with_the_position(
    expression: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        compile_filter(expression)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_bad_filter_in_the_config_names_the_key(tmp_path: Any) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "sink: {kind: stdout}\n"
        "resources:\n"
        "  - {apiVersion: v1, kind: Pod}\n"
        "  - {apiVersion: v1, kind: Secret, filter: \"object.type = 'x'\"}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(str(path))
    message = str(info.value)
    assert message.startswith("config error: resources[1].filter: ")
    assert "does not compile: line 1, column 13" in message
    assert "\n" not in message


def test_an_evaluation_error_is_no_match_counted_and_warned_at_most_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    f = Filter("object.status.phase == 'Failed'", label="v1/pods", clock=lambda: now[0])
    no_status = {"metadata": {"name": "a", "namespace": "default"}}
    warnings: list[str] = []
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert f.matches(no_status) is False
        now[0] = 31.0
        assert f.matches(no_status) is False
    warnings = [r.getMessage() for r in caplog.records if "filter could not" in r.getMessage()]
    assert f.errors == 6
    assert len(warnings) <= 2


def test_a_result_that_is_not_a_bool_is_no_match() -> None:
    f = Filter("object.metadata.name")
    assert f.matches(POD) is False
    assert f.errors == 1


def test_the_paths_read_are_found_outside_string_literals_and_method_calls() -> None:
    paths = _read_paths(
        "object.metadata.labels['a.b'] == 'object.spec.x' && "
        "object.spec.containers.exists(c, c.image.startsWith('x')) && oldObject.status.phase == ''"
    )
    assert paths == {
        "object": [("metadata", "labels"), ("spec", "containers")],
        "oldObject": [("status", "phase")],
    }
    assert _read_paths("size(object) > 0 && object.status.phase == ''")["object"] is None


# Expressions over paths that may be missing, of mixed depth: the pruned object
# must give the same answer (or the same "cannot evaluate") as the whole object.
EXPRESSIONS = [
    "object.status.phase == 'Failed'",
    "has(object.status.phase) && object.status.phase == 'Running'",
    "object.metadata.labels['tier'] == 'db' || type == 'deleted'",
    "has(object.spec.nodeName) && object.spec.nodeName.startsWith('n')",
    "object.spec.containers.exists(c, c.image == 'nginx:1.25')",
    "has(object.metadata.annotations) && 'x' in object.metadata.annotations",
    "object.status.phase == oldObject.status.phase",
]

values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 5),
        st.sampled_from(["db", "n1", "Failed", "Running"]),
    ),
    lambda inner: st.dictionaries(
        st.sampled_from(["tier", "phase", "x", "nodeName"]), inner, max_size=3
    ),
    max_leaves=6,
)
objects = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"labels": values, "annotations": values, "name": st.just("a")}
        ),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "nodeName": values,
                "containers": st.lists(
                    st.fixed_dictionaries({"image": st.sampled_from(["nginx:1.25", "x"])}),
                    max_size=2,
                ),
            },
        ),
        "status": values,
    },
)


@settings(max_examples=200, deadline=None)
@given(objects, objects, st.sampled_from(EXPRESSIONS))
def test_the_pruned_object_gives_the_same_answer_as_the_whole_one(
    obj: dict[str, Any], old: dict[str, Any], expression: str
) -> None:
    program = compile_filter(expression)
    paths = _read_paths(expression)

    def evaluate(o: Any, p: Any) -> Any:
        try:
            return program.execute({"object": o, "oldObject": p, "type": "modified"})
        except Exception:
            return "error"

    whole = evaluate(obj, old)
    pruned = evaluate(_prune(obj, paths["object"] or []), _prune(old, paths["oldObject"] or []))
    assert pruned == whole
