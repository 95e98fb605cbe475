"""The informer's cache: client-go's ThreadSafeStore with Indexers.

Objects are kept by key (``namespace/name``, or ``name`` for cluster-scoped
objects). Each index maps an index value (a namespace, a label value, ...) to
the keys of the objects that produce it, and is kept in step on every write,
so ``by_index`` follows an object whose indexed value changes.

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

from bridge.errors import BridgeError
from bridge.kube.objects import CachedObject, DeletedFinalStateUnknown, meta, namespace_key
from bridge.kube.packedtable import PackedTable, storable
from bridge.kube.records import PACKED_WIDTH, PackedRecord

__all__ = [
    "NAMESPACE_INDEX",
    "IndexFunc",
    "Indexer",
    "IndexerError",
    "label_index",
    "namespace_index",
]

IndexFunc = Callable[[CachedObject], list[str]]

NAMESPACE_INDEX = "namespace"


class IndexerError(BridgeError):
    """An index was misused: unknown name, a conflicting name, or added too late."""


def namespace_index(obj: CachedObject) -> list[str]:
    """client-go's ``MetaNamespaceIndexFunc``: cluster-scoped objects index under ``""``."""
    if not isinstance(obj, dict):
        return [obj.key.rpartition("/")[0]]  # a slim record: the namespace is in its key
    return [str(meta(obj).get("namespace") or "")]


def label_index(label_key: str) -> IndexFunc:
    """Index objects by the value of one label; objects without it are not indexed."""

    def index(obj: CachedObject) -> list[str]:
        if not isinstance(obj, dict):
            return []  # a slim record keeps no labels: only whole objects are indexed
        labels = meta(obj).get("labels")
        if isinstance(labels, dict) and label_key in labels:
            return [str(labels[label_key])]
        return []

    index.__name__ = f"label_index[{label_key}]"
    return index


class Indexer:
    """Objects by key, plus named secondary indices."""

    def __init__(
        self,
        *,
        key_func: Callable[[CachedObject], str] = namespace_key,
        indexers: dict[str, IndexFunc] | None = None,
        by_namespace: bool = True,
    ) -> None:
        """``by_namespace``: keep client-go's namespace index (31-38 B per object);
        a store nobody asks by namespace goes without."""
        self._key_func = key_func
        # A PackedRecord is kept as its ``packed`` bytes in the table, anything
        # else in the dict; a key is in one of them at most.
        self._packed = PackedTable(PACKED_WIDTH)
        self._items: dict[str, CachedObject] = {}
        self._indexers: dict[str, IndexFunc] = (
            {NAMESPACE_INDEX: namespace_index} if by_namespace else {}
        )
        # index name -> index value -> keys (a dict used as an ordered set)
        self._indices: dict[str, dict[str, dict[str, None]]] = {name: {} for name in self._indexers}
        if indexers:
            self.add_indexers(indexers)

    # -- writes ---------------------------------------------------------------

    def add(self, obj: CachedObject) -> None:
        self._put(self._key_func(obj), obj)

    def update(self, obj: CachedObject) -> None:
        self._put(self._key_func(obj), obj)

    def delete(self, obj: CachedObject | DeletedFinalStateUnknown) -> None:
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self._key_func(obj)
        self.delete_by_key(key)

    def delete_by_key(self, key: str) -> None:
        old: CachedObject | None = self._items.pop(key, None)
        if old is None and self._packed:
            packed = self._packed.pop(key)
            old = None if packed is None else PackedRecord(key, packed)
        if old is not None and self._indexers:
            self._reindex(key, old, None)

    def replace(
        self, items: Iterable[CachedObject], resource_version: str = "", *, expected: int = 0
    ) -> None:
        """Swap the whole content; the indices are rebuilt from scratch. ``expected``:
        how many items to size the store for (by default their length, if known)."""
        self._items = {}
        self._packed.clear()
        self._indices = {name: {} for name in self._indexers}
        if not set(self._indexers) <= {NAMESPACE_INDEX} or self._key_func is not namespace_key:
            for obj in items:
                self._put(self._key_func(obj), obj)
            return
        # At most the namespace index, whose value is in the key: the loop a restart
        # runs a million times, inlined.
        self._packed.load(self._loaded(items), expected or operator.length_hint(items))
        if self._items and self._packed:
            # A key given packed and then whole: the table was filled after the
            # dict, so drop what it holds of the dict's keys (the last item wins).
            for key in self._items:
                self._packed.pop(key)

    def _loaded(self, items: Iterable[CachedObject]) -> Iterator[tuple[str, bytes]]:
        """The table's pairs among ``items``; the rest goes to the dict. Both indexed."""
        stored, namespaces = self._items, self._indices.get(NAMESPACE_INDEX)
        for obj in items:
            if type(obj) is PackedRecord and storable(key := obj.key):
                if stored:
                    stored.pop(key, None)  # the last of a key's items wins
                yield key, obj.packed
            else:
                key = namespace_key(obj)
                stored[key] = obj
            if namespaces is not None:
                ns = key.rpartition("/")[0]
                keys = namespaces.get(ns)
                if keys is None:
                    namespaces[ns] = keys = {}
                keys[key] = None

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Add indices; only while the store is empty, as in client-go."""
        if self._items:
            raise IndexerError("cannot add indexers to a store that already holds objects")
        conflict = sorted(set(indexers) & set(self._indexers))
        if conflict:
            raise IndexerError(f"indexer conflict: {', '.join(conflict)} already defined")
        for name, func in indexers.items():
            self._indexers[name] = func
            self._indices[name] = {}

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

    @property
    def indexers(self) -> dict[str, IndexFunc]:
        return dict(self._indexers)

    def index_keys(self, name: str, value: str) -> builtins.list[str]:
        """Keys of the objects whose index ``name`` yields ``value``, sorted."""
        return sorted(self._index(name).get(value, ()))

    def by_index(self, name: str, value: str) -> builtins.list[CachedObject]:
        """The objects whose index ``name`` yields ``value``, sorted by key."""
        found = (self.get_by_key(key) for key in self.index_keys(name, value))
        return [obj for obj in found if obj is not None]

    def list_index_func_values(self, name: str) -> builtins.list[str]:
        """Every value index ``name`` currently holds, sorted."""
        return sorted(self._index(name))

    # -- internals ------------------------------------------------------------

    def _index(self, name: str) -> dict[str, dict[str, None]]:
        try:
            return self._indices[name]
        except KeyError:
            raise IndexerError(f"index with name {name!r} does not exist") from None

    def _put(self, key: str, obj: CachedObject) -> None:
        indexers = self._indexers
        old = self.get_by_key(key) if indexers else None
        items = self._items
        if type(obj) is PackedRecord and self._packed.put(key, obj.packed):
            if items:
                items.pop(key, None)
        else:
            items[key] = obj
            if self._packed:
                self._packed.pop(key)
        # The namespace is part of the key: an update moves no namespace index entry.
        if indexers and (old is None or len(indexers) > 1 or NAMESPACE_INDEX not in indexers):
            self._reindex(key, old, obj)

    def _reindex(self, key: str, old: CachedObject | None, new: CachedObject | None) -> None:
        for name, func in self._indexers.items():
            if name == NAMESPACE_INDEX and old is not None and new is not None:
                continue
            old_values = func(old) if old is not None else []
            new_values = func(new) if new is not None else []
            if old_values == new_values:
                continue
            index = self._indices[name]
            for value in old_values:
                keys = index.get(value)
                if keys is not None:
                    keys.pop(key, None)
                    # Empty sets would pile up for every namespace ever seen.
                    if not keys:
                        del index[value]
            for value in new_values:
                index.setdefault(value, {})[key] = None
