"""The object store of one cluster: one resourceVersion counter, a bounded event history, watches.

Stored objects are JSON-shaped dicts and are never mutated after they are committed: every change
replaces the object with a modified deep copy. History entries and list snapshots can therefore
share them without copying.

Every commit is handed to the listeners as an `Event` (the controllers' work queues are fed from
them, as client-go's informers feed a workqueue), and two pod indexes are kept up to date with it:
pods by controlling owner uid and pods by node, so no controller scans every pod to find a Job's
pods or a node's pods. Commit hooks (the API server's watch fan-out) are called for every commit,
core/v1 Events included.

Each version of an object is serialised to JSON once for its commit's answer and its watchers
(`Event.data`): the bytes are kept on the version's `Event` until the watch fan-out has sent them
(`Event.sent`), and lists reuse them when they are still there (`encoded`). Keeping them longer
would cost a copy of every object's JSON in memory.
"""

from __future__ import annotations

import builtins
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from .errors import RESOURCES, ApiError
from .util import json_copy

__all__ = ["Event", "Store"]

Obj = dict[str, Any]
Key = tuple[str, str]


_encode = msgspec.json.Encoder().encode


class Event:
    """One commit: the new version of an object (`obj`; for DELETED the last one) and the previous."""

    __slots__ = ("_data", "obj", "prev", "resource", "rv", "type")

    def __init__(self, rv: int, resource: str, type: str, obj: Obj, prev: Obj | None):
        self.rv = rv
        self.resource = resource
        self.type = type  # ADDED, MODIFIED, DELETED
        self.obj = obj
        self.prev = prev
        self._data: bytes | None = None

    def data(self) -> bytes:
        """`obj` as JSON, encoded once until `sent` (committed objects are never mutated)."""
        d = self._data
        if d is None:
            d = self._data = _encode(self.obj)
        return d

    def sent(self) -> None:
        """Every open watch has this event: drop its bytes (a later reader encodes again)."""
        self._data = None

    def __repr__(self) -> str:
        return f"Event({self.rv}, {self.resource}, {self.type}, {self.obj['metadata'].get('name')!r})"


class Store:
    def __init__(self, history_size: int = 5000):
        self.lock = threading.RLock()
        self._rv = 0
        self._objs: dict[str, dict[Key, Obj]] = {"pods": {}, "jobs": {}, "nodes": {}, "events": {}, "secrets": {}}
        self._history: deque[Event] = deque()
        self._history_size = max(1, history_size)
        self._compacted = 0  # events with rv <= this are no longer in the history
        self._created_seq: dict[str, int] = {}
        self._listeners: list[Callable[[Event], None]] = []
        self._hooks: list[Callable[[], None]] = []
        self._latest: dict[tuple[str, Key], Event] = {}  # (resource, key) -> the event of its current version
        self._by_owner: dict[str, set[Key]] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._uids: dict[str, dict[str, Key]] = {}  # resource -> uid -> key
        self._labels: dict[str, dict[tuple[str, str], set[Key]]] = {}  # resource -> (label, value) -> keys
        self.closed = False

    # -- reading ---------------------------------------------------------------------------------

    @property
    def rv(self) -> int:
        return self._rv

    @property
    def compacted_rv(self) -> int:
        return self._compacted

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self._objs[resource].get((namespace, name))

    def list(self, resource: str, namespace: str | None = None) -> list[Obj]:
        with self.lock:
            items = self._objs[resource]
            keys = sorted(k for k in items if namespace is None or k[0] == namespace)
            return [items[k] for k in keys]

    def values(self, resource: str) -> Iterable[Obj]:
        """Unsorted view for controllers (call with the lock held)."""
        return list(self._objs[resource].values())

    def creation_seq(self, obj: Obj) -> int:
        """Order of creation (finer than the one-second creationTimestamp)."""
        return self._created_seq.get(obj["metadata"].get("uid", ""), 0)

    def keys_with_labels(self, resource: str, pairs: Iterable[tuple[str, str]]) -> builtins.list[Key] | None:
        """Sorted keys of the objects that carry every (label, value) pair; None: no pair given."""
        index = self._labels.get(resource, {})
        found: set[Key] | None = None
        for pair in pairs:
            keys = index.get(pair, set())
            found = set(keys) if found is None else found & keys
            if not found:
                return []
        return None if found is None else sorted(found)

    def encoded(self, resource: str, obj: Obj, keep: bool = False) -> bytes:
        """JSON of `obj`: its version's bytes when they are still kept, else encoded now (and kept
        for the watchers with `keep`: the answer to the request that committed it)."""
        meta = obj["metadata"]
        ev = self._latest.get((resource, (meta.get("namespace", ""), meta["name"])))
        if ev is not None and ev.obj is obj:
            d = ev._data
            if d is not None:
                return d
            if keep:
                return ev.data()
        return _encode(obj)

    def by_uid(self, resource: str, uid: str) -> Obj | None:
        key = self._uids.get(resource, {}).get(uid)
        return None if key is None else self._objs[resource].get(key)

    def pods_of_owner(self, uid: str) -> builtins.list[Obj]:
        """Pods whose controller ownerReference is `uid` (call with the lock held)."""
        pods = self._objs["pods"]
        return [pods[k] for k in sorted(self._by_owner.get(uid, ()))]

    def pods_on_node(self, node: str) -> builtins.list[Obj]:
        """Pods bound to `node` (call with the lock held)."""
        pods = self._objs["pods"]
        return [pods[k] for k in sorted(self._by_node.get(node, ()))]

    def namespaces(self) -> set[str]:
        with self.lock:
            return {k[0] for r in ("pods", "jobs") for k in self._objs[r]}

    # -- writing ---------------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[Event], None]) -> None:
        """`fn(event)` after every commit but those of core/v1 Events, with the lock held."""
        self._listeners.append(fn)

    def add_hook(self, fn: Callable[[], None]) -> None:
        """`fn()` after every commit, core/v1 Events included, with the lock held: it must be quick."""
        self._hooks.append(fn)

    def _index(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        for index, field in ((self._by_owner, _owner_uid), (self._by_node, _node_name)):
            before, after = field(old), field(new)
            if before == after:
                continue
            if before is not None:
                keys = index.get(before)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[before]
            if after is not None:
                index.setdefault(after, set()).add(key)

    def _commit(self, resource: str, etype: str, obj: Obj, prev: Obj | None) -> None:
        event = Event(self._rv, resource, etype, obj, prev)
        self._history.append(event)
        while len(self._history) > self._history_size:
            self._compacted = self._history.popleft().rv
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        before = self._latest.pop((resource, key), None) if etype == "DELETED" else self._latest.get((resource, key))
        if etype != "DELETED":
            self._latest[(resource, key)] = event
        if before is not None:
            before._data = None  # a version no longer current keeps no bytes (a watcher behind encodes again)
        if resource == "pods":
            self._index(key, prev, None if etype == "DELETED" else obj)
        old_labels = (prev or {}).get("metadata", {}).get("labels") or {}
        new_labels = {} if etype == "DELETED" else meta.get("labels") or {}
        if old_labels is not new_labels and old_labels != new_labels:
            index = self._labels.setdefault(resource, {})
            for pair in old_labels.items():
                if new_labels.get(pair[0]) != pair[1]:
                    keys = index.get(pair)
                    if keys is not None:
                        keys.discard(key)
                        if not keys:
                            del index[pair]
            for pair in new_labels.items():
                if old_labels.get(pair[0]) != pair[1]:
                    index.setdefault(pair, set()).add(key)
        for hook in self._hooks:
            hook()
        if resource == "events":
            return  # Events are records for people: no controller reacts to them
        for fn in self._listeners:
            fn(event)

    def create(self, resource: str, obj: Obj) -> Obj:
        with self.lock:
            meta = obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if key in self._objs[resource]:
                raise ApiError.already_exists(RESOURCES[resource], meta["name"])
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._created_seq[meta["uid"]] = self._rv
            self._uids.setdefault(resource, {})[meta["uid"]] = key
            self._objs[resource][key] = obj
            self._commit(resource, "ADDED", obj, None)
            return obj

    def update(
        self, resource: str, namespace: str, name: str, fn: Callable[[Obj], Any], fields: tuple[str, ...] | None = None,
    ) -> Obj | None:
        """Apply fn to a copy of the object and commit it if it changed.

        The copy is deep, or, with `fields`, deep only in those top-level fields (fn promises to
        change nothing else): the other fields are shared with the previous version, which is
        safe because committed objects are never mutated. Returns the stored object (new or
        unchanged), or None if it does not exist.
        """
        with self.lock:
            cur = self._objs[resource].get((namespace, name))
            if cur is None:
                return None
            if fields is None:
                new = dict(json_copy(cur))
            else:
                new = dict(cur)
                new["metadata"] = dict(cur["metadata"])
                for f in fields:
                    if f in cur:
                        new[f] = json_copy(cur[f])
            fn(new)
            new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            if new == cur:
                return cur
            self._rv += 1
            new["metadata"]["resourceVersion"] = str(self._rv)
            self._objs[resource][(namespace, name)] = new
            self._commit(resource, "MODIFIED", new, cur)
            return new

    def replace(self, resource: str, obj: Obj) -> Obj:
        """Store obj as the new version of an existing object (caller checked preconditions)."""
        with self.lock:
            meta = obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            cur = self._objs[resource].get(key)
            if cur is None:
                raise KeyError(key)
            meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
            if obj == cur:
                return cur
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._objs[resource][key] = obj
            self._commit(resource, "MODIFIED", obj, cur)
            return obj

    def delete(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            cur = self._objs[resource].pop((namespace, name), None)
            if cur is None:
                return None
            self._rv += 1
            final = dict(cur)
            final["metadata"] = dict(cur["metadata"], resourceVersion=str(self._rv))
            self._created_seq.pop(cur["metadata"].get("uid", ""), None)
            self._uids.get(resource, {}).pop(cur["metadata"].get("uid", ""), None)
            self._commit(resource, "DELETED", final, cur)
            return final

    # -- watching --------------------------------------------------------------------------------

    def events_after(self, rv: int) -> builtins.list[Event]:
        """Events with resourceVersion > rv; raises 410 if some of them were compacted away."""
        if rv < self._compacted:
            raise ApiError.gone(f"too old resource version: {rv} ({self._compacted + 1})")
        if not self._history or self._history[-1].rv <= rv:
            return []
        # history is ordered by rv: scan from the end
        out: builtins.list[Event] = []
        for ev in reversed(self._history):
            if ev.rv <= rv:
                break
            out.append(ev)
        out.reverse()
        return out


def _owner_uid(obj: Obj | None) -> str | None:
    if obj is None:
        return None
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _node_name(obj: Obj | None) -> str | None:
    if obj is None:
        return None
    node = (obj.get("spec") or {}).get("nodeName")
    return str(node) if node else None
