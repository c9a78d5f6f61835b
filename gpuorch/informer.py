"""Following a cluster the way client-go informers do: list once, then watch.

An :class:`Informer` keeps a local cache of one resource of one cluster (for example the Jobs
with gpuorch's labels in the workload namespace). Its thread (the official client is
synchronous) does what client-go's reflector does:

1. **list** once (``_preload_content=False``: the raw JSON, no model objects) and replace the
   cache with the answer; remember the list's ``resourceVersion``;
2. **watch** from that resourceVersion (``kubernetes.watch.Watch().stream`` with
   ``resource_version``, ``allow_watch_bookmarks`` and ``timeout_seconds``), applying ADDED,
   MODIFIED and DELETED to the cache and moving the resourceVersion with every event and
   bookmark; when the server ends the watch at ``timeout_seconds``, watch again from where it
   stopped (no list);
3. on **410 Gone** (an ``ApiException`` with status 410, which the client raises for an ``ERROR``
   event with code 410 as well): the history the watch needed was compacted, so list again
   (step 1). Every change is in the new list, so nothing is missed;
4. on any other failure (no answer, or an API error), wait with exponential backoff and try
   again from the last resourceVersion.

Both the list and the watch events are decoded once, by msgspec, into plain dicts (no model
objects, no ``sanitize_for_serialization``, no re-encoding: the official ``Watch`` turns every
event into a model through a ``json.dumps``/``json.loads`` round trip unless told there is no
model type, which :class:`RawWatch` does).

Readers (the services' asyncio loops) read the cache without any API call: :meth:`items`,
:meth:`get`, :meth:`covers`. The cost against the cluster is one list at start (and after a
410) plus one watch per ``timeout_seconds``, whatever the number of objects or live attempts.

Reachability is reported as facts with times, not decided here: every call's outcome goes to
``on_contact(answered, at, error)``. A watch reports an answer when the server accepts it (its
response headers), with every event, and when it ends cleanly at ``timeout_seconds``; its read
timeout is ``timeout_seconds + READ_MARGIN``, so a connection that hangs (a real network
partition) is a failed call after at most that long. A refused or reset connection (the local
clusters' ``partition``) fails at once. Retries back off from ``BACKOFF_MIN`` but never past
the group's probe interval, so a healed cluster is watched again within one interval.

A :class:`ClusterInformers` group also runs a **liveness probe** (a ``/version`` call with a
short timeout) on its own timer: at once and then every ``probe_interval`` while the cluster is
suspected (its latest call failed), and, for the dispatcher (``heartbeat``), whenever nothing
answered for ``probe_interval`` (a quiet watch says nothing until it ends). Its outcome is a fact like any other: any answer from
the cluster, watch or probe, is contact. So "silent" is decided on evidence of silence *now*,
not on a retry that is not due yet (issue 27). The dispatcher folds these facts with
``core.contact``/``silence`` (its rule for "lost"); inventory marks a cluster unreachable while
its latest call failed.

Readers that act on what changed, as client-go's event handlers feed a controller's work queue,
ask :meth:`changes_since` (the objects changed since the cache generation they last read, or
None when the log no longer reaches back that far: after a re-list, or when they fell more than
``CHANGES_KEPT`` changes behind; then they look at everything). An ``index`` label (client-go's
indexers) keeps the objects by that label's value: :meth:`by_index`.

resourceVersions are compared as integers (:meth:`covers`): etcd revisions and the local
clusters' counter are; Kubernetes calls them opaque, so :meth:`covers` is used only to wait for
the cache to hold an object this process has just created.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpuorch.kube import CONNECT_TIMEOUT, TIMEOUT

#: Seconds a watch stays open before the server ends it (and it is opened again from its
#: resourceVersion): also the longest a quiet cluster goes without a reported answer.
WATCH_SECONDS = 4
#: A watch's read timeout is WATCH_SECONDS plus this: a hung connection fails after that long.
READ_MARGIN = 2.0
BACKOFF_MIN = 0.2
BACKOFF_MAX = 5.0
#: Seconds between liveness probes of a suspected or quiet cluster (GPUORCH_PROBE_INTERVAL), and
#: the longest an informer waits before it tries a failing cluster again.
PROBE_INTERVAL = 0.5

#: Changes an informer remembers for `changes_since` (a reader further behind looks at everything).
CHANGES_KEPT = 50_000

ContactFn = Callable[[bool, float, str], None]
ProbeFn = Callable[[float], None]  # one cheap call with this timeout (s); raises if unanswered
Key = tuple[str, str]  # (namespace, name)


class Change(NamedTuple):
    """One object changed (added, modified or deleted): its key and its labels at the time."""

    key: Key
    labels: dict[str, str]


def object_key(obj: dict[str, Any]) -> Key:
    """The cache's key of an object: (namespace, name)."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _rv(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


_decode = msgspec.json.Decoder()  # JSON as plain dicts, lists, str, int, float, bool, None


class RawWatch(watch.Watch):
    """``kubernetes.watch.Watch`` that yields each event as the server sent it, decoded once.

    With no return type the official ``unmarshal_event`` already skips the model
    (``json.dumps`` of the object and a deserialization into a model, then thrown away by us);
    here the one ``json.loads`` is msgspec's too. ``ERROR`` events keep ``raw_object``, which
    ``Watch.stream`` reads to raise ``ApiException(410)``.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def get_return_type(self, func: Any) -> None:
        return None

    def unmarshal_event(self, data: str, return_type: Any) -> dict[str, Any] | None:
        if not data or data.isspace():
            return None
        try:
            js = _decode.decode(data)
        except msgspec.DecodeError:
            return None
        if not isinstance(js, dict):
            return None
        js["raw_object"] = js.get("object")
        return js


def describe(exc: BaseException) -> str:
    """A short text for a failed call (no object addresses)."""
    if isinstance(exc, ApiException):
        return f"api error: {exc.status} {exc.reason}".strip()
    reason = getattr(exc, "reason", None)  # urllib3 MaxRetryError wraps the cause
    cause = reason if isinstance(reason, BaseException) else exc
    text = str(cause).split(": ", 1)[-1] if ">: " in str(cause) else str(cause)
    return f"unreachable: {type(cause).__name__}: {text}"[:300]


def next_backoff(delay: float, cap: float) -> float:
    """The wait before the retry after this one: doubled, never past `cap` (the probe interval,
    a fraction of LOST_AFTER, so a healed cluster is watched again soon)."""
    return min(delay * 2, cap)


def probe_wait(failing: bool, last_answer: float | None, last_probe: float | None, now: float, interval: float) -> float:
    """Seconds until the liveness probe is due (0: now).

    Suspected (the latest call failed, or nothing ever answered): one probe every `interval`,
    the first at once. Healthy: only when nothing answered for `interval` (a quiet watch reports
    nothing until it ends), so a busy cluster costs no probes.
    """
    if failing or last_answer is None:
        return 0.0 if last_probe is None else max(0.0, last_probe + interval - now)
    return max(0.0, max(last_answer, last_probe or last_answer) + interval - now)


class Informer:
    """A cache of one resource of one cluster, kept by list-then-watch in its own thread.

    `list_fn` is the official client's list method (``BatchV1Api.list_namespaced_job``,
    ``CoreV1Api.list_pod_for_all_namespaces``, ...); `namespace` is passed first when given.
    """

    def __init__(
        self,
        cluster: str,
        list_fn: Callable[..., Any],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        watch_seconds: int = WATCH_SECONDS,
        on_contact: ContactFn | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.time,
        index: str | None = None,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.cluster = cluster
        self.backoff_max = backoff_max
        self.list_fn = list_fn
        self.namespace = namespace
        self.label_selector = label_selector
        self.watch_seconds = watch_seconds
        self.on_contact = on_contact
        self.on_event = on_event  # each ADDED/MODIFIED/DELETED as it is applied (its own thread)
        self.clock = clock
        self.synced = threading.Event()  # set after the first successful list
        self.lists = 0  # lists made (1 at start, +1 per 410 Gone)
        self.watches = 0  # watch calls opened
        self.gone = 0  # 410 Gone answers
        self.generation = 0  # moves with every change of the cache
        self.last_error = ""
        #: wall time at which the cache last held everything the server had (a list's start, a
        #: watch's clean end, a bookmark): an object created before it and absent is really absent
        self.complete_at: float | None = None
        self._rv: int | None = None  # None: list before watching
        self._due = 0.0  # when the call in flight had to answer (`_expect`)
        self._cache: dict[Key, dict[str, Any]] = {}
        self.index = index  # a label: objects by its value (`by_index`)
        self._index: dict[str, set[Key]] = {}
        # (generation, change) of each change, newest last; `_floor`: generations up to it are gone
        self._changes: collections.deque[tuple[int, Change]] = collections.deque()
        self._floor = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None

    # --- reading (any thread) -----------------------------------------------------------------
    @property
    def resource_version(self) -> int | None:
        """The resourceVersion the cache reflects (None before the first list)."""
        return self._rv

    def items(self) -> list[dict[str, Any]]:
        """The cached objects (plain dicts as the API serves them; do not mutate them)."""
        with self._lock:
            return list(self._cache.values())

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            return self._cache.get((namespace if namespace is not None else self.namespace or "", name))

    def by_index(self, value: str) -> list[dict[str, Any]]:
        """The cached objects whose `index` label has `value`."""
        with self._lock:
            return [self._cache[k] for k in self._index.get(value, ()) if k in self._cache]

    def changes_since(self, generation: int) -> tuple[int, list[Change] | None]:
        """(the generation now, the objects changed after `generation`, oldest first), or None
        in place of the list when the changes are no longer all known (a re-list replaced the
        cache, or more than CHANGES_KEPT came since)."""
        with self._lock:
            now = self.generation
            if generation < self._floor:
                return now, None
            out: list[Change] = []
            for gen, change in reversed(self._changes):
                if gen <= generation:
                    break
                out.append(change)
            out.reverse()
            return now, out

    def _label(self, obj: dict[str, Any]) -> str | None:
        assert self.index is not None
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(self.index)
        return value if isinstance(value, str) else None

    def _reindex(self, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """(under the lock) move `key` in the label index from `old`'s value to `new`'s."""
        if self.index is None:
            return
        was, now = (self._label(old) if old else None), (self._label(new) if new else None)
        if was == now:
            return
        if was is not None and (keys := self._index.get(was)) is not None:
            keys.discard(key)
            if not keys:
                del self._index[was]
        if now is not None:
            self._index.setdefault(now, set()).add(key)

    def _changed(self, key: Key, obj: dict[str, Any]) -> None:
        """(under the lock) one more change, logged for `changes_since`."""
        self.generation += 1
        labels = (obj.get("metadata") or {}).get("labels") or {}
        self._changes.append((self.generation, Change(key, labels if isinstance(labels, dict) else {})))
        if len(self._changes) > CHANGES_KEPT:
            self._floor = self._changes.popleft()[0]

    def covers(self, resource_version: int) -> bool:
        """Has the cache seen everything up to `resource_version` (e.g. an object just created)?"""
        rv = self._rv
        return rv is not None and rv >= resource_version

    # --- life ---------------------------------------------------------------------------------
    def start(self) -> Informer:
        """Start (or, after `stop`, resume from the cache's resourceVersion, as a reflector does
        after a long disconnection: a 410 then means a fresh list)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            name = f"informer-{self.cluster}-{getattr(self.list_fn, '__name__', 'list')}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()  # type: ignore[no-untyped-call]
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the reflector loop (its own thread) --------------------------------------------------
    def _args(self) -> tuple[Any, ...]:
        return (self.namespace,) if self.namespace is not None else ()

    def _selector(self) -> dict[str, Any]:
        return {"label_selector": self.label_selector} if self.label_selector else {}

    def _contact(self, answered: bool, error: str = "") -> None:
        """Report one call's outcome. A failure is dated when the missing answer was due (a
        call's start; an open watch's end, which the server promised at `watch_seconds`), not
        when the read timeout noticed it: a watch that hung through a short cut must not count
        as silence after the heal."""
        self.last_error = error
        now = self.clock()
        if self.on_contact is not None:
            self.on_contact(answered, now if answered else min(now, self._due), error)

    def _expect(self, due: float) -> None:
        """The call being made must answer by `due` (or it is evidence of silence then)."""
        self._due = due

    def _run(self) -> None:
        delay = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if self._rv is None:
                    self._list()
                self._watch_once()
                delay = BACKOFF_MIN
            except ApiException as exc:
                if exc.status == 410:  # the history we needed was compacted: list again, at once
                    self.gone += 1
                    self._rv = None
                    self._contact(True)
                    continue
                self._contact(False, describe(exc))
            except Exception as exc:  # no answer (connection refused, reset, timed out)
                self._contact(False, describe(exc))
            else:
                continue
            if self._stop.wait(delay):
                return
            delay = next_backoff(delay, self.backoff_max)

    def _list(self) -> None:
        began = self.clock()
        self._expect(began)
        resp = self.list_fn(*self._args(), **self._selector(), _preload_content=False, _request_timeout=TIMEOUT)
        try:
            doc = _decode.decode(resp.data)
        finally:
            resp.release_conn()
        items = {object_key(o): o for o in doc.get("items") or []}
        rv = _rv((doc.get("metadata") or {}).get("resourceVersion"))
        with self._lock:
            self._cache = items
            self.generation += 1
            self._changes.clear()
            self._floor = self.generation  # what changed before this list is not known one by one
            if self.index is not None:
                self._index = {}
                for key, obj in items.items():
                    self._reindex(key, None, obj)
        self._rv = rv if rv is not None else 0
        self.complete_at = began
        self.lists += 1
        self.synced.set()
        self._contact(True)

    def _opened(self) -> Callable[..., Any]:
        """`list_fn` that reports an answer as soon as the server accepted the watch (its
        response headers came): a watch reopened after a heal is contact at once, not when it
        ends. (functools.wraps keeps the signature and doc the official Watch inspects.)"""

        @functools.wraps(self.list_fn)
        def opened(*args: Any, **kw: Any) -> Any:
            self._expect(self.clock())
            resp = self.list_fn(*args, **kw)
            self._contact(True)
            self._expect(self.clock() + self.watch_seconds)  # the server ends it by then
            return resp

        return opened

    def _watch_once(self) -> None:
        w = self._watch = RawWatch()  # raw dicts, no models
        self.watches += 1
        try:
            stream = w.stream(  # type: ignore[no-untyped-call]
                self._opened(), *self._args(), **self._selector(),
                resource_version=str(self._rv), allow_watch_bookmarks=True, timeout_seconds=self.watch_seconds,
                _request_timeout=(CONNECT_TIMEOUT, self.watch_seconds + READ_MARGIN),
            )  # fmt: skip
            for event in stream:
                self._apply(event)
                if self._stop.is_set():
                    w.stop()  # type: ignore[no-untyped-call]
        finally:
            self._watch = None
        self.complete_at = self.clock()
        self._contact(True)  # the server ended the watch at timeout_seconds: reachable, maybe quiet

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("raw_object") or event.get("object")
        if not isinstance(obj, dict):
            return
        rv = _rv((obj.get("metadata") or {}).get("resourceVersion"))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            key = object_key(obj)
            with self._lock:
                old = self._cache.pop(key, None) if kind == "DELETED" else self._cache.get(key)
                if kind != "DELETED":
                    self._cache[key] = obj
                self._reindex(key, old, None if kind == "DELETED" else obj)
                self._changed(key, obj)
            if self.on_event is not None:
                self.on_event(str(kind), obj)
        if rv is not None:  # BOOKMARK too: only the resourceVersion moves
            self._rv = rv
        if kind == "BOOKMARK":
            self.complete_at = self.clock()
        self._contact(True)


class ClusterInformers:
    """The informers of one cluster, sharing one stream of contact facts, and its liveness probe.

    `contacts()` returns (and forgets) the facts reported since the last call, in order:
    ``(answered, at, error)``; the reader folds them with its own rule (the dispatcher's
    `core.contact`). `failing`, `last_ok` and `error` are the latest facts, for inventory.
    `probe` (one cheap call with a timeout: ``ClusterClient.probe``) runs in its own thread on
    the schedule of :func:`probe_wait`; `on_failure` (any thread) is told of every failed call,
    so a reader can look at once instead of at its next tick.
    """

    def __init__(
        self,
        cluster: str,
        keep: int = 1000,
        *,
        probe: ProbeFn | None = None,
        probe_interval: float = PROBE_INTERVAL,
        heartbeat: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.informers: dict[str, Informer] = {}
        self._facts: list[tuple[bool, float, str]] = []
        self._keep = keep
        self._lock = threading.Lock()
        self.failing = False  # the latest call failed
        self.last_ok: float | None = None  # when the cluster last answered
        self.error = ""  # why the latest call failed
        self.probe = probe
        self.probe_interval = probe_interval
        #: also probe a healthy cluster that was quiet for an interval (the dispatcher, whose loss
        #: rule needs it); without, only a suspected one (inventory, the fencer)
        self.heartbeat = heartbeat
        self.probes = 0  # probes made
        self.clock = clock
        self.on_failure: Callable[[], None] | None = None
        self._probe_stop = threading.Event()
        self._probe_thread: threading.Thread | None = None

    def report(self, answered: bool, at: float, error: str) -> None:
        """One call's outcome. Repeats are folded (a run of answers keeps only the latest, a
        run of failures its first and its latest): nothing the contact rule reads is lost."""
        with self._lock:
            facts = self._facts
            if answered and facts and facts[-1][0]:
                facts[-1] = (answered, at, error)
            elif not answered and len(facts) >= 2 and not facts[-1][0] and not facts[-2][0]:
                facts[-1] = (answered, at, error)
            else:
                facts.append((answered, at, error))
                if len(facts) > self._keep:
                    del facts[: len(facts) - self._keep]
            self.failing, self.error = not answered, error
            if answered:
                self.last_ok = at if self.last_ok is None else max(self.last_ok, at)
        if not answered and self.on_failure is not None:
            try:
                self.on_failure()
            except RuntimeError:  # the reader's event loop is closed (stopping): nothing to wake
                pass

    def probe_once(self) -> bool:
        """One liveness probe, reported as a fact (a failure at the time the call was made: the
        cluster did not answer a call made then). True when it answered."""
        assert self.probe is not None
        began = self.clock()
        self.probes += 1
        try:
            self.probe(self.probe_interval)
        except Exception as exc:  # no answer (refused, reset, timed out) or an API error
            if isinstance(exc, ApiException) and exc.status is not None and exc.status < 500:
                self.report(True, self.clock(), "")  # it answered, if only to refuse
                return True
            self.report(False, began, describe(exc))
            return False
        self.report(True, self.clock(), "")
        return True

    def _probe_run(self) -> None:
        last_probe: float | None = None
        while not self._probe_stop.is_set():
            if not self.heartbeat and not self.failing and self.last_ok is not None:
                if self._probe_stop.wait(self.probe_interval):
                    return
                continue
            wait = probe_wait(self.failing, self.last_ok, last_probe, self.clock(), self.probe_interval)
            if wait > 0:
                if self._probe_stop.wait(wait):
                    return
                continue
            last_probe = self.clock()
            self.probe_once()

    def contacts(self) -> list[tuple[bool, float, str]]:
        with self._lock:
            out, self._facts = self._facts, []
            return out

    def add(self, name: str, list_fn: Callable[..., Any], **kw: Any) -> Informer:
        kw.setdefault("backoff_max", self.probe_interval)
        inf = Informer(self.cluster, list_fn, on_contact=self.report, **kw)
        self.informers[name] = inf
        return inf

    def __getitem__(self, name: str) -> Informer:
        return self.informers[name]

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    def start(self) -> ClusterInformers:
        for i in self.informers.values():
            i.start()
        if self.probe is not None and (self._probe_thread is None or not self._probe_thread.is_alive()):
            self._probe_stop.clear()
            self._probe_thread = threading.Thread(target=self._probe_run, name=f"probe-{self.cluster}", daemon=True)
            self._probe_thread.start()
        return self

    def stop(self) -> None:
        self._probe_stop.set()
        for i in self.informers.values():
            i._stop.set()
        for i in self.informers.values():
            i.stop()
        if self._probe_thread is not None:
            self._probe_thread.join(5.0)
