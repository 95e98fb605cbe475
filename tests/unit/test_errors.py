"""Errors: a Status becomes the matching class of the one documented tree."""

from __future__ import annotations

from bridge import errors


def test_status_410_becomes_expired() -> None:
    err = errors.status_error(
        {
            "kind": "Status",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version: 1 (5)",
        }
    )
    assert isinstance(err, errors.ExpiredError)
    assert err.code == 410 and err.reason == "Expired"
    assert "too old" in str(err)


def test_status_429_carries_retry_after_from_details() -> None:
    err = errors.status_error({"code": 429, "details": {"retryAfterSeconds": 3}})
    assert isinstance(err, errors.TooManyRequestsError)
    assert err.retry_after == 3.0


def test_unknown_5xx_is_server_error() -> None:
    err = errors.status_error({}, http_code=503)
    assert isinstance(err, errors.ServerError) and err.code == 503
