"""core/v1 Events: what the scheduler, the kubelet and the Job controller did, for people.

Recorded like client-go's event recorder: one Event object per (object, type, reason, message,
source), its `count` and `lastTimestamp` bumped when the same thing happens again (at most once a
second, as the recorder's spam filter does), the oldest removed beyond `MAX_EVENTS` (an API server
drops them after an hour). Writing an Event wakes no controller.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .util import new_uid, rfc3339

if TYPE_CHECKING:
    from .store import Store

__all__ = ["MAX_EVENTS", "EventRecorder"]

MAX_EVENTS = 2000
_REPEAT_SECONDS = 1.0


class EventRecorder:
    def __init__(self, store: Store, max_events: int = MAX_EVENTS):
        self.store = store
        self.max_events = max_events
        self._by_key: OrderedDict[tuple[str, ...], tuple[str, str, float]] = OrderedDict()  # -> (ns, name, last)

    def record(
        self, obj: dict[str, Any], type_: str, reason: str, message: str, component: str, host: str | None = None,
    ) -> None:
        """Call with the store lock held or not (it takes it)."""
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        key = (meta.get("uid", ""), type_, reason, message, component)
        now = time.time()
        with self.store.lock:
            known = self._by_key.get(key)
            if known is not None and self.store.get("events", known[0], known[1]) is not None:
                if now - known[2] < _REPEAT_SECONDS:
                    return

                def bump(e: dict[str, Any]) -> None:
                    e["count"] = int(e.get("count") or 1) + 1
                    e["lastTimestamp"] = rfc3339(now)

                self.store.update("events", known[0], known[1], bump)
                self._by_key[key] = (known[0], known[1], now)
                self._by_key.move_to_end(key)
                return
            ts = rfc3339(now)
            name = f"{meta.get('name', 'unknown')}.{int(now * 1e9) & 0xFFFFFFFFFFFFFF:x}"
            source: dict[str, str] = {"component": component}
            if host:
                source["host"] = host
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": ns, "uid": new_uid(), "creationTimestamp": ts},
                "involvedObject": {
                    "kind": obj.get("kind", ""),
                    "apiVersion": obj.get("apiVersion", "v1"),
                    **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
                    "name": meta.get("name", ""),
                    "uid": meta.get("uid", ""),
                    "resourceVersion": meta.get("resourceVersion", ""),
                },
                "reason": reason,
                "message": message,
                "source": source,
                "firstTimestamp": ts,
                "lastTimestamp": ts,
                "count": 1,
                "type": type_,
                "eventTime": None,
                "reportingComponent": component,
                "reportingInstance": host or "",
            }
            self.store.create("events", event)
            self._by_key[key] = (ns, name, now)
            while len(self._by_key) > self.max_events:
                _, (ons, oname, _t) = self._by_key.popitem(last=False)
                self.store.delete("events", ons, oname)
