"""PATCH bodies: JSON merge patch, JSON patch, and enough of strategic merge for ``kubectl apply``.

Strategic merge is approximated: lists of objects whose items carry a ``name``
(containers, env, volumes, ports...) merge by that key, ``$patch: delete`` items
are removed, other ``$``-directives are dropped. That is what ``kubectl apply``
sends for the usual edits.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from bridge.emulator.status import bad_request, unsupported_media

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_MERGE_KEYS = ("name", "containerPort", "mountPath", "ip", "type")


def _merge_key(items: list[Any]) -> str | None:
    dicts = [i for i in items if isinstance(i, dict)]
    if not dicts or len(dicts) != len(items):
        return None
    for key in _MERGE_KEYS:
        if all(key in i for i in dicts):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        current = result.get(key)
        if isinstance(value, list) and isinstance(current, list):
            mk = _merge_key([v for v in value if not (isinstance(v, dict) and "$patch" in v)])
            mk = mk or _merge_key(current)
            if mk is not None and all(isinstance(v, dict) and mk in v for v in value):
                merged = [dict(i) for i in current]
                index = {i.get(mk): n for n, i in enumerate(merged)}
                for item in value:
                    if item.get("$patch") == "delete":
                        merged = [m for m in merged if m.get(mk) != item.get(mk)]
                        index = {i.get(mk): n for n, i in enumerate(merged)}
                    elif item.get(mk) in index:
                        pos = index[item.get(mk)]
                        merged[pos] = strategic_merge_patch(merged[pos], item)
                    else:
                        index[item.get(mk)] = len(merged)
                        merged.append(strategic_merge_patch({}, item))
                result[key] = merged
                continue
            result[key] = copy.deepcopy(value)
        else:
            result[key] = strategic_merge_patch(current, value)
    return result


def apply_patch(obj: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Apply ``patch`` of the given media type; raises ``ApiStatusError`` on bad input."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json patch must be a list of operations")
        try:
            result = jsonpatch.apply_patch(obj, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise bad_request(
                f"the server rejected our request due to an error in our request: {exc}"
            ) from exc
    elif ctype in (MERGE, APPLY):
        result = merge_patch(obj, patch)
    elif ctype == STRATEGIC:
        result = strategic_merge_patch(obj, patch)
    else:
        raise unsupported_media(content_type)
    if not isinstance(result, dict):
        raise bad_request("patch did not produce an object")
    return result
