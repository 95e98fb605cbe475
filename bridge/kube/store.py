"""The informer's cache: client-go's ThreadSafeStore, without indexes.

Objects are kept by key (``namespace/name``, or ``name`` for cluster-scoped
objects). client-go's Indexers are not reproduced: the bridge asks its cache
only by key, and a namespace index would cost 31-38 B per object for no
reader.

One event loop owns the store, so no locks: every method runs to completion.

A slim informer's records (``PackedRecord``) are kept as their 41 packed
bytes in a ``PackedTable`` (bridge/kube/packedtable.py), many keys to a
``bytes`` object, and read back as a fresh view: ~95 B per object at 100k
instead of ~200 B as a dict entry of key string and bytes, and nothing for
the cyclic GC to visit. Whole objects, loose records and the rare key the
table cannot hold are kept in a dict.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Iterable, Iterator

from bridge.ground.records import PACKED_WIDTH, PackedColumns, PackedRecord
from bridge.kube.objects import CachedObject, DeletedFinalStateUnknown, namespace_key
from bridge.kube.packedtable import PackedTable, storable

__all__ = ["Indexer"]


class Indexer:
    """Objects by key (client-go's name for its store, kept though no index is)."""

    def __init__(self, *, key_func: Callable[[CachedObject], str] = namespace_key) -> None:
        self._key_func = key_func
        # A PackedRecord is kept as its ``packed`` bytes in the table, anything
        # else in the dict; a key is in one of them at most.
        self._packed = PackedTable(PACKED_WIDTH)
        self._items: dict[str, CachedObject] = {}

    # -- writes ---------------------------------------------------------------

    def add(self, obj: CachedObject) -> None:
        self._put(self._key_func(obj), obj)

    def update(self, obj: CachedObject) -> None:
        self._put(self._key_func(obj), obj)

    def delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self._key_func(obj)
        self.delete_by_key(key)

    def delete_by_key(self, key: str) -> None:
        if self._items.pop(key, None) is None and self._packed:
            self._packed.pop(key)

    def replace(
        self,
        items: Iterable[CachedObject],
        resource_version: str = "",
        *,
        expected: int = 0,
        packed: PackedColumns | None = None,
    ) -> None:
        """Swap the whole content. ``expected``: how many items to size the store for
        (by default their length, if known). ``packed``: many more records as columns
        (a restart's checkpoint), loaded first and emptied; ``items`` win over them."""
        self._items = {}
        self._packed.clear()
        if packed:
            self._load_columns(packed)
            for obj in items:
                self._put(self._key_func(obj), obj)
            return
        if self._key_func is not namespace_key:
            for obj in items:
                self._put(self._key_func(obj), obj)
            return
        # The loop a restart runs a million times, inlined.
        self._packed.load(self._loaded(items), expected or operator.length_hint(items))
        if self._items and self._packed:
            # A key given packed and then whole: the table was filled after the
            # dict, so drop what it holds of the dict's keys (the last item wins).
            for key in self._items:
                self._packed.pop(key)

    def _load_columns(self, packed: PackedColumns) -> None:
        """Load the columns and empty them: their million strings are freed as soon
        as the table holds their bytes, whoever still holds the columns."""
        keys, values = packed.keys, packed.packed
        # Whether the table takes every key, asked of all of them at once: a
        # Kubernetes key always qualifies, and the rare one that does not (a NUL,
        # a lone surrogate) sends the load key by key.
        joined = "".join(keys)
        if "\0" not in joined and (joined.isascii() or storable(joined)):
            self._packed.load_columns(keys, values)
        else:
            for key, value in zip(keys, values, strict=True):
                self._put(key, PackedRecord(key, value))
        keys.clear()
        values.clear()

    def _loaded(self, items: Iterable[CachedObject]) -> Iterator[tuple[str, bytes]]:
        """The table's pairs among ``items``; the rest goes to the dict."""
        stored = self._items
        for obj in items:
            if type(obj) is PackedRecord and storable(key := obj.key):
                if stored:
                    stored.pop(key, None)  # the last of a key's items wins
                yield key, obj.packed
            else:
                stored[namespace_key(obj)] = obj

    # -- reads ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items) + len(self._packed)

    def __contains__(self, key: object) -> bool:
        return key in self._items or key in self._packed

    def get(self, obj: CachedObject | DeletedFinalStateUnknown) -> CachedObject | None:
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self._key_func(obj)
        return self.get_by_key(key)

    def get_by_key(self, key: str) -> CachedObject | None:
        items = self._items
        if items:
            obj = items.get(key)
            if obj is not None:
                return obj
        packed = self._packed.get(key)
        return None if packed is None else PackedRecord(key, packed)

    def list(self) -> list[CachedObject]:
        out: list[CachedObject] = [PackedRecord(k, v) for k, v in self._packed.items()]
        out.extend(self._items.values())
        return out

    def list_keys(self) -> builtins.list[str]:
        keys = list(self._packed.keys())
        keys.extend(self._items)
        return keys

    # -- internals ------------------------------------------------------------

    def _put(self, key: str, obj: CachedObject) -> None:
        items = self._items
        if type(obj) is PackedRecord and self._packed.put(key, obj.packed):
            if items:
                items.pop(key, None)
        else:
            items[key] = obj
            if self._packed:
                self._packed.pop(key)
