"""Status objects the emulator answers with, built as the real API server builds them.

Each helper returns an error from ``bridge.errors`` carrying the Status dict, so
the Python API raises the same errors a client would translate from HTTP.
"""

from __future__ import annotations

import math
from typing import Any

from bridge.errors import ApiStatusError, status_error


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def error(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> ApiStatusError:
    retry = None
    if details and details.get("retryAfterSeconds") is not None:
        retry = float(details["retryAfterSeconds"])
    return status_error(status(code, reason, message, details), retry_after=retry)


def _gr(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def _details(name: str | None, group: str, plural: str) -> dict[str, Any]:
    # Empty name and group are left out, as Go's omitempty does.
    return {k: v for k, v in (("name", name), ("group", group), ("kind", plural)) if v}


def not_found(group: str, plural: str, name: str) -> ApiStatusError:
    return error(
        404,
        "NotFound",
        f'{_gr(group, plural)} "{name}" not found',
        _details(name, group, plural),
    )


def already_exists(group: str, plural: str, name: str) -> ApiStatusError:
    return error(
        409,
        "AlreadyExists",
        f'{_gr(group, plural)} "{name}" already exists',
        _details(name, group, plural),
    )


def conflict(group: str, plural: str, name: str) -> ApiStatusError:
    return error(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_gr(group, plural)} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        _details(name, group, plural),
    )


def expired(message: str) -> ApiStatusError:
    return error(410, "Expired", message)


def too_old(requested: int, oldest: int) -> ApiStatusError:
    """A watch from before the watch cache's window (an ERROR event on the real server)."""
    return expired(f"too old resource version: {requested} ({oldest})")


def list_too_old() -> ApiStatusError:
    """An exact-RV LIST that reached etcd after that revision was compacted."""
    return expired("The resourceVersion for the provided list is too old.")


def continue_expired(fresh_token: str) -> ApiStatusError:
    """A continue token whose snapshot was compacted: 410, and in the Status's list
    metadata a token that goes on from the same key at the latest state (etcd3 store)."""
    err = expired(
        "The provided continue parameter is too old to display a consistent list result. "
        "You can start a new list without the continue parameter, or use the continue token "
        "in this response to retrieve the remainder of the results. Continuing with the "
        "provided token results in an inconsistent list - objects that were created, "
        "modified, or deleted between the time the first chunk was returned and now may show "
        "up in the list."
    )
    err.status["metadata"] = {"continue": fresh_token}
    return err


def too_large_rv(asked: int, current: int) -> ApiStatusError:
    # The watch cache's answer after waiting for ``asked`` (storage.NewTooLargeResourceVersionError).
    return error(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {asked}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def invalid_options(*errors: tuple[str, str, str]) -> ApiStatusError:
    """422 for bad ListOptions, as ``apierrors.NewInvalid`` words it; each error is
    (field, cause type, message body such as "Forbidden: ...")."""
    causes = [{"reason": kind, "message": body, "field": path} for path, kind, body in errors]
    listed = [f"{path}: {body}" for path, _, body in errors]
    summary = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
    return error(
        422,
        "Invalid",
        f'ListOptions.meta.k8s.io "" is invalid: {summary}',
        {"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes},
    )


def forbidden_option(path: str, why: str) -> tuple[str, str, str]:
    return (path, "FieldValueForbidden", f"Forbidden: {why}")


def unsupported_option(path: str, value: str, supported: tuple[str, ...]) -> tuple[str, str, str]:
    quoted = ", ".join(f'"{v}"' for v in supported)
    return (
        path,
        "FieldValueNotSupported",
        f'Unsupported value: "{value}": supported values: {quoted}',
    )


def bad_request(message: str) -> ApiStatusError:
    return error(400, "BadRequest", message)


def invalid(kind: str, name: str, message: str) -> ApiStatusError:
    return error(
        422, "Invalid", f'{kind} "{name}" is invalid: {message}', {"name": name, "kind": kind}
    )


def forbidden(
    user: str, verb: str, group: str, plural: str, namespace: str | None, name: str | None = None
) -> ApiStatusError:
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    target = f'{_gr(group, plural)} "{name}"' if name else _gr(group, plural)
    return error(
        403,
        "Forbidden",
        f'{target} is forbidden: User "{user}" cannot {verb} resource "{plural}" '
        f'in API group "{group}" {where}',
        _details(name, group, plural),
    )


def too_many_requests(retry_after: float) -> ApiStatusError:
    seconds = max(0, math.ceil(retry_after))
    return error(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": seconds},
    )


def internal_error(message: str = "Internal error occurred: injected failure") -> ApiStatusError:
    return error(500, "InternalError", message)


def unsupported_media(content_type: str) -> ApiStatusError:
    return error(
        415,
        "UnsupportedMediaType",
        f'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got "{content_type}")',
    )


def success(details: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }
