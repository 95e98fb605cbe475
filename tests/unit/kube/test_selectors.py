"""Selector syntax as the API server parses it (apimachinery's labels and fields packages)."""

from __future__ import annotations

import pytest

from bridge.kube.selectors import (
    SelectorError,
    normalize_field_selector,
    normalize_label_selector,
)

VALID_LABEL = [
    "",
    "app",
    "!app",
    "app=web",
    "app==web",
    "app!=web",
    "app=",
    "app in (a,b)",
    "app notin (a)",
    "app in(a, b), tier",
    "example.com/tier=x,  !k",
    "app.kubernetes.io/name=web",
    "k>1",
    "k<-2",
    "a.b_c-d=E.f",
]

INVALID_LABEL = {
    "app in (a,": "not closed with ')'",
    "app in (a": "not closed with ')'",
    "app in ()": "has no values",
    "app in a": "parenthesised list",
    "=x": "expected a key",
    "app=web,": "no requirement after it",
    ",app": "expected a key",
    "app = a b": "found 'b', expected ','",
    "Example.com/k=v": "DNS subdomain",
    "k/=v": "key 'k/'",
    "k=-x": "value '-x'",
    "k>x": "expected an integer",
    "app in (a b)": "found 'b'",
    "!": "after '!', expected a key",
    "a!b": "expected an operator",
    "k=v)": "found ')'",
    "x" * 64 + "=v": "at most 63",
}


@pytest.mark.parametrize("text", VALID_LABEL)
def test_valid_label_selectors_pass(text: str) -> None:
    normalize_label_selector(text)


@pytest.mark.parametrize(("text", "why"), INVALID_LABEL.items())
def test_invalid_label_selectors_say_why(text: str, why: str) -> None:
    with pytest.raises(SelectorError) as info:
        normalize_label_selector(text)
    assert why in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "metadata.name=x",
        "spec.bogus=1",
        "status.phase!=Running,spec.nodeName==n1",
        "a=",
        "a=x\\,y",
    ],
)
def test_valid_field_selectors_pass(text: str) -> None:
    normalize_field_selector(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("metadata.name", "has no '=', '==' or '!='"),
        ("=x", "needs a field name"),
        ("meta data=x", "needs a field name"),
        ("a=b=c", "must be escaped"),
        ("a=b\\x", "invalid escape"),
        ("a=b\\", "unfinished"),
    ],
)
def test_invalid_field_selectors_say_why(text: str, why: str) -> None:
    with pytest.raises(SelectorError) as info:
        normalize_field_selector(text)
    assert why in str(info.value)


def test_the_same_selection_normalizes_the_same() -> None:
    assert normalize_label_selector("tier, app in (b, a),x==1") == normalize_label_selector(
        "x=1,app in(a,b),tier"
    )
    assert normalize_label_selector("a=1") != normalize_label_selector("a!=1")
    assert normalize_field_selector("b=1,a==2") == normalize_field_selector("a=2,b=1")
    assert normalize_field_selector("a=1") != normalize_field_selector("a!=1")
