"""Change triggers and projections: which part of an object a resource watches and publishes.

``triggerPaths`` (or ``generationOnly``, its shorthand for
``metadata.generation``) narrow what counts as a change: the fingerprint covers
only those paths, so a modification elsewhere hashes the same and publishes
nothing. ``fields`` narrow what is published: ``data.object`` (and ``old``,
``patch``) carry only those paths plus the object's identity; without
triggers the fingerprint covers the same projection, so a change nobody would
see in the event is not published either.

Putting the choice into the fingerprint, rather than into a filter after it,
keeps one definition of "changed" for the live watch, the slim cache, the
checkpoint digests and the restart diff: all of them compare fingerprints.

Paths are the dotted paths of ``ignoreFields`` (bridge/delivery/changes.py): a key
segment on a list applies to every element, ``name[N]`` picks one element.
They are compiled once, when the resource is configured.
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from bridge.delivery.changes import (
    Fingerprinter,
    PathNode,
    _parse,
    compile_paths,
    strip_paths,
    top_keys,
)
from bridge.errors import ConfigError
from bridge.kube.objects import RawObject
from bridge.logging import get_logger

log = get_logger(__name__)

GENERATION = "metadata.generation"
# What a projected object always keeps: enough to name it, order it and key it.
IDENTITY = (
    "apiVersion",
    "kind",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "metadata.resourceVersion",
)

_NOTHING: Any = object()


def check_paths(paths: list[str]) -> list[str]:
    """Raise ValueError naming the first path that does not parse (config validation)."""
    for path in paths:
        try:
            _parse(path)
        except ConfigError as e:
            # _parse speaks of ignore paths; the caller names the key.
            raise ValueError(f"has a bad {str(e).removeprefix('ignore ')}") from None
    return paths


def _merge(a: Any, b: Any) -> Any:
    """Union of two selections of the same value (a key path and an index path into one list)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_merge(x, y) for x, y in zip(a, b, strict=True)]
    return b


def select_paths(value: Any, node: PathNode) -> Any:
    """``value`` with only the trie's paths kept: the counterpart of removing them.

    A leaf keeps its whole value. A dict keeps the selected keys that exist
    (a dict with none left is dropped by its parent, so "absent" and "present
    but unselected" hash alike). On a list, key segments apply to every
    element and keep every position (an element with nothing selected becomes
    ``{}``, so positions still mean what they meant); a list reached by index
    segments only keeps the picked elements, in order. The input is never
    mutated; kept leaves are shared, not copied.
    """
    if node.leaf:
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for name, child in node.keys.items():
            if name in value:
                picked = select_paths(value[name], child)
                if picked is not _NOTHING:
                    out[name] = picked
        return out if out else _NOTHING
    if isinstance(value, list):
        n = len(value)
        items: list[Any] = []
        for i, element in enumerate(value):
            by_index = node.indexes.get(i) or node.indexes.get(i - n)
            if by_index is not None and by_index.leaf:
                items.append(element)
                continue
            kept: Any = _NOTHING
            if node.keys:
                # A dict element reads only the key children of ``node``.
                kept = select_paths(element, node) if isinstance(element, dict) else _NOTHING
                if kept is _NOTHING:
                    kept = {}
            if by_index is not None:
                more = select_paths(element, by_index)
                if more is not _NOTHING:
                    kept = more if kept is _NOTHING else _merge(kept, more)
            if kept is not _NOTHING:
                items.append(kept)
        return items if items or node.keys else _NOTHING
    return _NOTHING


def select(obj: RawObject, node: PathNode) -> RawObject:
    """``obj`` reduced to the trie's paths; ``{}`` when none of them is there."""
    picked = select_paths(obj, node)
    return {} if picked is _NOTHING else dict(picked)


class ViewFingerprinter(Fingerprinter):
    """Hashes only the selected paths of an object, without its ignored fields.

    Same output shape as ``Fingerprinter`` (32 lowercase hex digits), so slim
    cache records stay compact and checkpoint digests stay comparable.

    ``fallback``: an object that lacks ``metadata.generation`` (ConfigMaps,
    Secrets, ...) is hashed whole instead, so a ``generationOnly`` resource of
    such a kind still publishes its changes rather than none ever.
    """

    __slots__ = ("_fallback", "_label", "_select", "_warned")

    def __init__(
        self,
        select_paths: list[str],
        ignore_fields: list[str] | tuple[str, ...] = (),
        *,
        fallback_without_generation: bool = False,
        label: str = "",
    ) -> None:
        super().__init__(ignore_fields)
        self._select = compile_paths(select_paths)
        self._fallback = fallback_without_generation
        self._label = label
        self._warned = False

    def reads(self) -> frozenset[str] | None:
        ignored, selected = super().reads(), top_keys(self._select)
        return None if ignored is None or selected is None else ignored | selected

    def fingerprint(self, obj: RawObject) -> str:
        if obj is self._last:
            return self._last_fp
        if self._fallback and "generation" not in (obj.get("metadata") or {}):
            if not self._warned:
                self._warned = True
                log.warning(
                    "generationOnly: objects without metadata.generation are compared whole",
                    resource=self._label,
                )
            return super().fingerprint(obj)
        # Select first, then strip: ignoreFields still remove paths inside triggers.
        view = select(obj, self._select)
        stripped = strip_paths(view, self._trie)
        fp = xxhash.xxh3_128_hexdigest(orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS))
        self._last, self._last_fp = obj, fp
        return fp


def trigger_paths(trigger: list[str] | tuple[str, ...], generation_only: bool) -> list[str]:
    """The paths whose change is a change: ``generationOnly`` is ``[metadata.generation]``."""
    return [GENERATION] if generation_only else list(trigger)


def fingerprinter_for(
    *,
    ignore_fields: list[str] | tuple[str, ...] = (),
    trigger: list[str] | tuple[str, ...] = (),
    generation_only: bool = False,
    fields: list[str] | tuple[str, ...] = (),
    label: str = "",
) -> Fingerprinter:
    """The fingerprinter of one resource: triggers decide, else the projection, else all."""
    paths = trigger_paths(trigger, generation_only)
    if paths:
        return ViewFingerprinter(
            paths, ignore_fields, fallback_without_generation=generation_only, label=label
        )
    if fields:
        return ViewFingerprinter([*IDENTITY, *fields], ignore_fields, label=label)
    return Fingerprinter(ignore_fields)


def compile_projection(fields: list[str] | tuple[str, ...]) -> PathNode | None:
    """The projection trie of ``fields`` (identity always kept); None: publish whole objects."""
    return compile_paths([*IDENTITY, *fields]) if fields else None
