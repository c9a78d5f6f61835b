"""The event log folded into per-workload state (pure: no I/O, no clock).

The event stream is the record: any workload's full history, and so its state,
is rebuilt by folding its events in stream order. Every service keeps one
`Projection` in memory (rebuilt at start-up by replaying the stream), the CLI
builds one to answer `get`/`list`, and the invariant checker reads the same fold.

`apply` is idempotent by stream sequence: replaying an event that was already
applied changes nothing, so a service may replay the log and then resume a
durable consumer that redelivers the tail.

Retirement (services only: `Projection(retire=True)`; the CLI, the web view and the invariant
checker keep every view whole). A finished workload is kept whole only until it is *settled*
(`settled`: terminal, and none of its attempts can still run or still has a pursuit of the fencer
ahead of it); then, in the fold of the event that settled it, its view becomes a compact
`Retired` record: status, reason, epoch, promoted attempt and result, the attempts without their
checkpoint paths, and of the document only what the services' decisions still read
(`RetiredDoc`: owner, store, lease, fencing, queue, demand, and a digest of the whole document
for the duplicate-submit check). The routing decision, the history, the rest of the document
are dropped. `get` (and `apply`, for a late event) gives the view back from the record
(`Retired.view`); a late event that unsettles it keeps the view whole again until it settles.
Retirement is a function of each workload's own events, so a full replay and a snapshot plus
the rest retire the same workloads (tests/snapshot).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, overload

import msgspec

from gpuorch_proto import ClusterVerdict, Estimate, Event, RoutingDecision, Workload, k8s
from gpuorch_proto import events as ev
from gpuorch_proto.workload import Metadata, OutputPolicy, Resources, RetryPolicy, WorkloadSpecBody

LIVE_ATTEMPT = frozenset({"created", "admitted", "running", "lost"})
TERMINAL = ev.TERMINAL_STATUSES


# --- packed containers of the compact views (docs/performance.md, *Memory per pending workload*) --

_DOUBLE = struct.Struct("=d")
_KIND_CODES: dict[str, int] = {}  # the kinds of times packed so far, each its one-byte code
_KIND_NAMES: list[str] = []
_BYTE = [bytes((c,)) for c in range(256)]


def _code(kind: str) -> int | None:
    """The kind's code (None once 256 kinds have one: a view with another keeps its times as a dict)."""
    c = _KIND_CODES.get(kind)
    if c is None:
        if len(_KIND_NAMES) > 255:
            return None
        kind = sys.intern(kind)
        c = _KIND_CODES[kind] = len(_KIND_NAMES)
        _KIND_NAMES.append(kind)
    return c


def _pack_times(items: Mapping[str, float]) -> bytes | dict[str, float]:
    """Times as a compact view holds them: one `bytes`, the kinds' codes in order then the times
    as doubles (exact: a float is a double); a dict when a kind has no code."""
    codes = [_code(k) for k in items]
    if None in codes:
        return dict(items)
    return bytes(codes) + struct.pack(f"={len(codes)}d", *items.values())  # type: ignore[arg-type]


class Times(MutableMapping[str, float]):
    """A compact view's `times` (when each kind of event was first seen) as its readers see it:
    a `dict[str, float]` in behaviour (insertion order, `==` with a dict of the same items,
    `setdefault`, `pop`), read from and written to the one `bytes` the view holds
    (`_pack_times`: about 60 bytes with three entries, where a dict and its floats take 256).
    Made on each read of the field (`_TimesField`), as small as a bound method."""

    __slots__ = ("_of", "_slot")

    def __init__(self, of: Any, slot: Any) -> None:
        self._of, self._slot = of, slot

    def _index(self, kind: object) -> int:
        """The entry's index, -1 when absent."""
        b: bytes = self._slot.__get__(self._of)
        c = _KIND_CODES.get(kind) if isinstance(kind, str) else None
        return -1 if c is None else b.find(c, 0, len(b) // 9)

    def _value(self, i: int) -> float:
        b: bytes = self._slot.__get__(self._of)
        at: float = _DOUBLE.unpack_from(b, len(b) // 9 + 8 * i)[0]
        return at

    def __getitem__(self, kind: str) -> float:
        i = self._index(kind)
        if i < 0:
            raise KeyError(kind)
        return self._value(i)

    @overload
    def get(self, kind: str, /) -> float | None: ...
    @overload
    def get(self, kind: str, /, default: float) -> float: ...
    @overload
    def get(self, kind: str, /, default: Any) -> Any: ...

    def get(self, kind: str, /, default: Any = None) -> Any:
        i = self._index(kind)
        return default if i < 0 else self._value(i)

    def __contains__(self, kind: object) -> bool:
        return self._index(kind) >= 0

    def __iter__(self) -> Iterator[str]:
        b: bytes = self._slot.__get__(self._of)
        return iter([_KIND_NAMES[c] for c in b[: len(b) // 9]])

    def __len__(self) -> int:
        return len(self._slot.__get__(self._of)) // 9

    def __setitem__(self, kind: str, at: float) -> None:
        i = self._index(kind)
        b: bytes = self._slot.__get__(self._of)
        if i >= 0:
            j = len(b) // 9 + 8 * i
            self._slot.__set__(self._of, b[:j] + _DOUBLE.pack(at) + b[j + 8 :])
        else:
            self._add(b, kind, at)

    def _add(self, b: bytes, kind: str, at: float) -> None:
        """A kind not in `b` (what the view holds) added, last."""
        c = _KIND_CODES.get(kind)
        if c is None and (c := _code(kind)) is None:
            self._slot.__set__(self._of, {**self, kind: at})  # (a kind without a code: a dict from now on)
            return
        n = len(b) // 9
        self._slot.__set__(self._of, b[:n] + _BYTE[c] + b[n:] + _DOUBLE.pack(at))

    def __delitem__(self, kind: str) -> None:
        i = self._index(kind)
        if i < 0:
            raise KeyError(kind)
        b: bytes = self._slot.__get__(self._of)
        n = len(b) // 9
        self._slot.__set__(self._of, b[:i] + b[i + 1 : n + 8 * i] + b[n + 8 * i + 8 :])

    def setdefault(self, kind: str, default: float) -> float:
        b: bytes = self._slot.__get__(self._of)
        c = _KIND_CODES.get(kind)
        if c is not None:
            n = len(b) // 9
            i = b.find(c, 0, n)
            if i >= 0:
                at: float = _DOUBLE.unpack_from(b, n + 8 * i)[0]
                return at
        self._add(b, kind, default)
        return default

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (list(self.items()),))  # a copy (`copy`, `asdict`, pickle) is a plain dict

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, float]:
        return dict(self)

    def packed(self) -> bytes | dict[str, float]:
        """What the view holds (its `bytes`; a copy of the items once it holds a dict)."""
        held: bytes | dict[str, float] = self._slot.__get__(self._of)
        return held if isinstance(held, bytes) else dict(held)

    def __repr__(self) -> str:
        return repr(dict(self))


class _TimesField:
    """A view's `times`: a dict (whole views), or packed (`_pack_times`: compact views), read as
    a `Times`. Setting a `Times` (`replace`, a copy) keeps its packed form."""

    __slots__ = ("slot",)

    def __init__(self, cls: type, name: str = "times") -> None:
        self.slot = cls.__dict__[name]
        setattr(cls, name, self)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        v = self.slot.__get__(obj, owner)
        return Times(obj, self.slot) if type(v) is bytes else v

    def __set__(self, obj: Any, value: Any) -> None:
        self.slot.__set__(obj, value.packed() if isinstance(value, Times) else value)

    def pack(self, obj: Any) -> None:
        """`obj`'s times in the packed form (a no-op when they are)."""
        v = self.slot.__get__(obj)
        if type(v) is not bytes:
            self.slot.__set__(obj, _pack_times(v))


class Attempts(MutableMapping[str, "AttemptView"]):
    """A workload's attempts by id, as a compact view keeps them: a `dict` in behaviour
    (insertion order, `==` with a dict of the same items); a lone attempt is held without a dict
    (its key is its `attempt_id`), more in one."""

    __slots__ = ("_held",)

    def __init__(self, items: Mapping[str, AttemptView] | None = None) -> None:
        self._held: AttemptView | dict[str, AttemptView] | None = None
        for k, a in (items or {}).items():
            self[k] = a

    def _dict(self) -> dict[str, AttemptView]:
        h = self._held
        return {} if h is None else {h.attempt_id: h} if isinstance(h, AttemptView) else h

    def __getitem__(self, attempt_id: str) -> AttemptView:
        h = self._held
        if isinstance(h, AttemptView):
            if h.attempt_id == attempt_id:
                return h
            raise KeyError(attempt_id)
        if h is None:
            raise KeyError(attempt_id)
        return h[attempt_id]

    def get(self, attempt_id: str, default: Any = None) -> Any:
        h = self._held
        if isinstance(h, AttemptView):
            return h if h.attempt_id == attempt_id else default
        return default if h is None else h.get(attempt_id, default)

    def __contains__(self, attempt_id: object) -> bool:
        h = self._held
        if isinstance(h, AttemptView):
            return h.attempt_id == attempt_id
        return h is not None and attempt_id in h

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        h = self._held
        return 0 if h is None else 1 if isinstance(h, AttemptView) else len(h)

    def values(self) -> Any:
        h = self._held
        return () if h is None else (h,) if isinstance(h, AttemptView) else h.values()

    def items(self) -> Any:
        h = self._held
        return () if h is None else ((h.attempt_id, h),) if isinstance(h, AttemptView) else h.items()

    def __setitem__(self, attempt_id: str, a: AttemptView) -> None:
        h = self._held
        if h is None and a.attempt_id == attempt_id:
            self._held = a
        elif isinstance(h, dict):
            h[attempt_id] = a
        else:
            d = self._dict()
            d[attempt_id] = a
            self._held = d

    def __delitem__(self, attempt_id: str) -> None:
        d = self._dict()
        del d[attempt_id]
        self._held = None
        for k, a in d.items():
            self[k] = a

    def __repr__(self) -> str:
        return repr(self._dict())


@dataclass(slots=True)
class AttemptView:
    attempt_id: str
    number: int
    epoch: int
    cluster: str
    job_name: str = ""
    namespace: str = k8s.NAMESPACE
    queue: str | None = None
    output_path: str = ""
    checkpoint_path: str = ""
    mode: str = "fresh"
    mode_reason: str = ""
    resume_from: str | None = None
    status: str = "created"  # created admitted running succeeded failed lost
    exit_code: int | None = None
    reason: str = ""
    fenced: bool = False  # its epoch is stale
    cancel_confirmed: str | None = None  # how ("deleted", "already-gone", "lease-expired")
    promoted: bool = False
    promotion_rejected: bool = False
    orphan_deleted: bool = False
    unschedulable: str = ""  # the scheduler's message while its pods cannot be placed ("" once placed)
    placement_failed: bool = False  # failed because the cluster could not place its pods
    times: MutableMapping[str, float] = field(default_factory=dict)  # a dict; compact: `Times`
    retryable: bool = True  # its `failed` said the workload may try again (`gpuorch_dispatcher.core.workload_failure`)

    @property
    def live(self) -> bool:
        """May still be running somewhere: not known to be stopped."""
        return self.status in LIVE_ATTEMPT and self.cancel_confirmed is None

    @property
    def gone(self) -> bool:
        return self.cancel_confirmed is not None or self.orphan_deleted


@dataclass(slots=True)
class WorkloadView:
    workload_id: str
    workload: Workload | None = None
    # submitted waiting routed dispatched admitted running promoting lost retrying
    # | completed cancelled failed rejected (terminal)
    status: str = "submitted"
    reason: str = ""
    decision: RoutingDecision | None = None
    routed_attempts: set[int] = field(default_factory=set)
    route_requested: set[int] = field(default_factory=set)
    attempts: MutableMapping[str, AttemptView] = field(default_factory=dict)  # a dict; compact: `Attempts`
    epoch: int = 1
    promoted_attempt: str | None = None
    result_path: str | None = None
    cancel_requested: bool = False
    idempotency_key: str | None = None
    times: MutableMapping[str, float] = field(default_factory=dict)  # a dict; compact: `Times`
    preemption: ev.PreemptionPlanned | None = None  # the latest: whose GPUs it waits for (explain)
    # pipelines (docs/pipelines.md): a child knows its pipeline, stage, parameters and inputs;
    # a pipeline its children (in declared order) and, once every child finished, its outcome
    pipeline: str | None = None
    stage: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    stage_inputs: list[ev.StageInput] = field(default_factory=list)
    children: list[ev.PipelineChild] = field(default_factory=list)
    held: ev.Held | None = None  # the latest `held` (explain shows its numbers)
    history: list[tuple[int, str, float]] = field(default_factory=list)  # (seq, type, at)
    last_seq: int = 0  # the stream sequence of the last event folded in
    # rebuilt from a `Retired` record: `workload` is a stand-in (`RetiredDoc.workload`), `digest`
    # the whole document's (`same_document`)
    retired: bool = False
    digest: bytes = b""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def live_attempts(self) -> list[AttemptView]:
        return [a for a in self.attempts.values() if a.live]

    @property
    def latest_attempt(self) -> AttemptView | None:
        if not self.attempts:
            return None
        return max(self.attempts.values(), key=lambda a: a.number)

    @property
    def next_attempt_number(self) -> int:
        return max([0, *self.routed_attempts, *(a.number for a in self.attempts.values())]) + 1


class _Packed:
    """A view's field that a compact view may hold packed (a marker in its slot, see
    `compact_attempt`, `_pack_reason`): read, it is the value the marker stands for
    (`unpack(view, marker)`), so every reader, `==`, `repr`, `replace` and the snapshot's
    encoder see the plain value. A plain `str` is held and read as it is."""

    __slots__ = ("slot", "unpack")

    def __init__(self, cls: type, name: str, unpack: Callable[[Any, Any], str]) -> None:
        self.slot = cls.__dict__[name]  # the dataclass's member descriptor of the slot
        self.unpack = unpack
        setattr(cls, name, self)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        v = self.slot.__get__(obj, owner)
        return v if type(v) is str else self.unpack(obj, v)

    def __set__(self, obj: Any, value: Any) -> None:
        self.slot.__set__(obj, value)


class _Root(str):
    """An attempt's output or checkpoint path held as its store's root: the rest is derived from
    the attempt id (`_attempt_dir`), as the dispatcher made it (`_attempt_paths`)."""

    __slots__ = ()


def _attempt_dir(aid: str, root: str) -> str:
    return f"{root}/{aid[: aid.rfind('-a')]}/attempts/{aid}"


def _job_reason(a: AttemptView) -> str:
    """A workload's reason once its attempt's Job is created (the fold's, and a compact view's derived one)."""
    return f"Job {a.job_name} created on {a.cluster}; waiting for the cluster to place its pods"


_ATTEMPT_TIMES, _VIEW_TIMES = _TimesField(AttemptView), _TimesField(WorkloadView)
_NO_TIMES: Any = b""  # a compact view's times when none is known yet (`_TimesField`)
_OUTPUT = _Packed(AttemptView, "output_path", lambda a, root: _attempt_dir(a.attempt_id, root))
_CHECKPOINT = _Packed(AttemptView, "checkpoint_path", lambda a, root: _attempt_dir(a.attempt_id, root) + "/checkpoints")
_REASON = _Packed(WorkloadView, "reason", lambda v, a: _job_reason(a))  # held: the attempt whose Job it names


@dataclass
class Projection:
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    last_seq: int = 0
    retire: bool = False  # keep settled finished workloads as `Retired` records (the services)
    retired: dict[str, Retired] = field(default_factory=dict)
    compact: bool = False  # live views in the services' compact form (see the module doc)

    @classmethod
    def of(cls, events: Iterable[tuple[int, Event]]) -> Projection:
        """The fold of `(stream sequence, event)` pairs."""
        p = cls()
        for seq, e in events:
            p.apply(e, seq)
        return p

    def get(self, workload_id: str) -> WorkloadView | None:
        """The workload's view (a retired one's rebuilt from its record: a copy, see the module doc)."""
        view = self.workloads.get(workload_id)
        if view is None and (r := self.retired.get(workload_id)) is not None:
            return r.view(workload_id)
        return view

    def __contains__(self, workload_id: str) -> bool:
        return workload_id in self.workloads or workload_id in self.retired

    def __len__(self) -> int:
        """Workloads known, retired included."""
        return len(self.workloads) + len(self.retired)

    def _view(self, workload_id: str) -> WorkloadView:
        """The live view to fold into: a retired one is taken back whole from its record."""
        view = self.workloads.get(workload_id)
        if view is None:
            r = self.retired.pop(workload_id, None)
            if r is not None:
                view = r.view(workload_id)
                if self.compact:
                    compact_view(view)
            elif self.compact:
                view = WorkloadView(  # its id: this event's string, set into the later events' (`_share_ids`)
                    workload_id, attempts=Attempts(), times=_NO_TIMES, routed_attempts=_numbers(set()), route_requested=_numbers(set()),
                    parameters=_NO_PARAMETERS, stage_inputs=_NO_INPUTS, children=_NO_CHILDREN, history=_NO_HISTORY,
                )  # fmt: skip
            else:
                view = WorkloadView(workload_id)
            self.workloads[view.workload_id] = view
        return view

    def apply(self, evt: Event, seq: int) -> WorkloadView | None:
        """Fold one event; returns the workload's view (None for events about no workload).

        Idempotent by stream sequence *per workload*: an event at or below the last sequence
        applied to its workload changes nothing. A workload's events are in stream order, so a
        consumer may apply different workloads' events concurrently (out of global order).

        With `retire`, the view returned for the event that settles a workload is its whole view
        (what the caller decides on), though the projection keeps its `Retired` record from then on.
        """
        if seq:
            self.last_seq = max(self.last_seq, seq)
        if not evt.workload_id or isinstance(evt, ev.AdmissionTerm):  # (the admission leader's marker)
            return None
        wid = evt.workload_id
        if seq and (r := self.retired.get(wid)) is not None and seq <= r.last_seq:
            return r.view(wid)
        view = self.workloads.get(wid)
        if view is None:
            view = self._view(wid)
        elif seq and seq <= view.last_seq:
            return view
        if seq:
            view.last_seq = seq
        if isinstance(evt, ev.PipelineExpanded):
            for c in evt.children:  # each child knows where it came from (the router's own record)
                child = self._view(c.workload_id)
                child.pipeline, child.stage, child.parameters = evt.workload_id, c.stage, dict(c.parameters)
                if child.status == "submitted":
                    child.reason = "waiting for its dependencies" if c.depends_on else "waiting for the pipeline's admission"
                self._maybe_retire(child)
        if self.compact:
            _share_ids(view, evt)
        _fold(view, evt)
        if self.compact:
            _compact_after(view, evt)
        else:
            view.history.append((seq, ev.type_tag(evt), evt.at))
        self._maybe_retire(view)
        return view

    def compact_all(self) -> None:
        """Every live view in the compact form (a projection restored from a snapshot, whose
        views were decoded whole); sets `compact`."""
        self.compact = True
        for wid, v in self.workloads.items():
            v.workload_id = wid  # (the key's string, which the services' tables take from the events)
            compact_view(v)

    def _maybe_retire(self, view: WorkloadView) -> None:
        if self.retire and settled(view):
            del self.workloads[view.workload_id]
            self.retired[view.workload_id] = retired_record(view)

    def retire_settled(self) -> int:
        """Retire every settled view now (a projection folded without `retire`, or restored
        from an older snapshot); returns how many."""
        done = [v for v in self.workloads.values() if settled(v)]
        for v in done:
            del self.workloads[v.workload_id]
            self.retired[v.workload_id] = retired_record(v)
        return len(done)


# --- the services' compact views (`Projection(compact=True)`) ------------------------------------
#
# The same `WorkloadView`s, with what they hold shared or dropped (docs/performance.md, *Memory per
# pending workload*): the document's parts shared with equal parts of other documents and its
# low-cardinality strings interned (`compact_workload`: a document equal to the one submitted);
# the routing decision without the checks that passed and with only the estimate terms a service
# reads (`compact_decision`); ids as one string per id (the event's own `workload_id` and
# `attempt_id` are set to the projection's: equal strings, so every table a service keys by them
# shares it); empty collections shared (the fold assigns, never mutates them); no `history`.

_NO_PARAMETERS: dict[str, Any] = {}  # shared, never mutated (the fold assigns a new dict)
_NO_INPUTS: list[ev.StageInput] = []
_NO_CHILDREN: list[ev.PipelineChild] = []
_NO_HISTORY: list[tuple[int, str, float]] = []
_SHARE_MAX = 65536  # distinct parts shared at once (beyond it each document keeps its own)
_SHARED: dict[tuple[type, bytes], Any] = {}
_PART_ENCODER = msgspec.msgpack.Encoder()


def _shared(x: Any) -> Any:
    """`x`, or an equal object already held (frozen structs, and lists or dicts never mutated)."""
    if x is None or (isinstance(x, list | dict) and not x):
        return _EMPTY_LIST if isinstance(x, list) else _EMPTY_DICT if isinstance(x, dict) else None
    return _keep(_SHARED, (type(x), _PART_ENCODER.encode(x)), x, _SHARE_MAX)


def _keep(table: dict[Any, Any], key: Any, value: Any, most: int) -> Any:
    """The value `table` holds under `key`, else `value` (kept there while it holds fewer than `most`)."""
    got = table.get(key)
    if got is None:
        if len(table) >= most:
            return value
        got = table[key] = value
    return got


_EMPTY_LIST: list[Any] = []
_EMPTY_DICT: dict[str, Any] = {}


_NUMBER_SETS: dict[frozenset[int], frozenset[int]] = {}


def _numbers(n: set[int]) -> set[int]:
    """An attempt-number set as a shared frozenset (the fold assigns a new set, never adds)."""
    f = frozenset(n)
    got = _NUMBER_SETS.get(f)
    if got is None:
        if len(_NUMBER_SETS) >= _SHARE_MAX:
            return f  # type: ignore[return-value]
        got = _NUMBER_SETS[f] = f
    return got  # type: ignore[return-value]


def _interned(s: str | None) -> str | None:
    return sys.intern(s) if s is not None else None


def _arg(x: str) -> str:
    """An argument, an option's name (``--seed``: what runs of one program share) interned."""
    return sys.intern(x) if x.startswith("-") and len(x) <= 64 else x


def _args(args: list[str]) -> list[str]:
    if not args:
        return _EMPTY_LIST
    out = list(args)  # (exactly its size: a comprehension's list may be larger)
    for i, x in enumerate(out):
        out[i] = _arg(x)
    return out


def compact_workload(wl: Workload) -> Workload:
    """A document equal to `wl` (`==`, and the same digest) whose parts are shared with equal
    parts of documents already held: resources, requirements, policies, the command, inputs, env,
    labels; its repeated strings interned. Documents are frozen and never mutated in place."""
    m, s = wl.metadata, wl.spec
    rep = msgspec.structs.replace
    meta = rep(m, owner=sys.intern(m.owner), labels=_shared(m.labels), workload_class=_interned(m.workload_class))
    spec = rep(
        s, image=sys.intern(s.image), command=_shared(s.command), args=_args(s.args),
        env=_shared(s.env), inputs=_shared(s.inputs), resources=_shared(s.resources),
        requirements=_shared(s.requirements), preferences=_shared(s.preferences), stages=_shared(s.stages),
        queue=_interned(s.queue), timeout=_interned(s.timeout), expected_runtime=_interned(s.expected_runtime),
        reference_accelerator=_interned(s.reference_accelerator), retry=_shared(s.retry),
        checkpoint=_shared(s.checkpoint), output=_shared(s.output), fencing=sys.intern(s.fencing),
        lease=sys.intern(s.lease), sweep=_shared(s.sweep), limits=_shared(s.limits),
        policy_queue=_interned(s.policy_queue),
    )  # fmt: skip
    return rep(wl, api_version=sys.intern(wl.api_version), metadata=meta, spec=spec)


def _zero(x: float) -> float:
    return 0.0 if x == 0.0 else x  # (the one 0.0 object, not a float per decoded field)


def compact_decision(d: RoutingDecision, workload_id: str, at: float | None = None) -> RoutingDecision:
    """What the services read of a decision: its outcome, target, queue and placement; per
    cluster its verdict with the checks that failed (`preempt.capacity_clusters`, the
    invariants' blockers) and of its estimate the terms read: queue wait (the dispatcher's
    requeue limit, for the chosen cluster) and staging (what the router learns from a promoted
    attempt). Passing checks, the other estimate terms, snapshot ages and the summary (the
    view's `reason` has it while it is the reason) are dropped. The list of verdicts is shared
    with equal decisions' when none is this decision's own (a queue wait); `decided_at` is the
    float `at` (its event's, which the router's tables hold too) when equal."""
    verdicts = []
    shared = True
    for v in d.verdicts:
        failed = [c for c in v.checks if not c.ok]
        est = v.estimate
        unique = est is not None and v.cluster == d.cluster and est.queue_wait != 0.0
        if est is not None:
            est = Estimate(queue_wait=est.queue_wait if unique else 0.0, image_staging=_zero(est.image_staging), data_staging=_zero(est.data_staging))
            est = est if unique else _shared(est)
        kept = ClusterVerdict(cluster=sys.intern(v.cluster), eligible=v.eligible, checks=failed or _EMPTY_LIST, estimate=est)
        verdicts.append(kept if unique else _shared(kept))
        shared = shared and not unique
    return RoutingDecision(
        schema_version=d.schema_version, workload_id=workload_id, decided_at=at if at is not None and at == d.decided_at else d.decided_at,
        outcome=d.outcome, cluster=_interned(d.cluster), queue=_interned(d.queue), summary="",
        verdicts=_shared(verdicts) if shared else verdicts,
        placement=_shared(d.placement),
    )  # fmt: skip


def compact_attempt(a: AttemptView) -> None:
    """`a` in the compact form: its low-cardinality strings interned, its job name the id's string
    when equal, its times packed (`Times`), its paths held as their roots when they are the
    dispatcher's (`_Root`)."""
    a.cluster, a.namespace, a.queue, a.mode = sys.intern(a.cluster), sys.intern(a.namespace), _interned(a.queue), sys.intern(a.mode)
    a.mode_reason = sys.intern(a.mode_reason)
    if a.job_name == a.attempt_id:
        a.job_name = a.attempt_id
    _ATTEMPT_TIMES.pack(a)
    aid = a.attempt_id
    cut = aid.rfind("-a")
    if cut > 0:
        tail = f"/{aid[:cut]}/attempts/{aid}"
        out, ckpt = _OUTPUT.slot.__get__(a), _CHECKPOINT.slot.__get__(a)
        if type(out) is str and out.endswith(tail):
            _OUTPUT.slot.__set__(a, _root(out[: len(out) - len(tail)]))
        if type(ckpt) is str and ckpt.endswith(tail + "/checkpoints"):
            _CHECKPOINT.slot.__set__(a, _root(ckpt[: len(ckpt) - len(tail) - len("/checkpoints")]))


_ROOTS: dict[str, _Root] = {}


def _root(path: str) -> _Root | str:
    """A store root as its one shared `_Root` (the path itself once the table is full)."""
    got = _ROOTS.get(path)
    if got is None:
        if len(_ROOTS) >= _SHARE_MAX:
            return path  # (a plain str: held whole)
        got = _ROOTS[path] = _Root(path)
    return got


def compact_view(v: WorkloadView) -> None:
    """`v` (decoded whole, or rebuilt from a retired record) in the compact form."""
    if v.workload is not None:
        v.workload = compact_workload(v.workload)
    if v.decision is not None:
        v.decision = compact_decision(v.decision, v.workload_id)
    v.routed_attempts, v.route_requested = _numbers(v.routed_attempts), _numbers(v.route_requested)
    v.idempotency_key = None
    v.parameters = v.parameters or _NO_PARAMETERS
    v.stage_inputs = v.stage_inputs or _NO_INPUTS
    v.children = v.children or _NO_CHILDREN
    v.history = _NO_HISTORY
    _VIEW_TIMES.pack(v)
    if not isinstance(v.attempts, Attempts):
        for k, a in v.attempts.items():
            a.attempt_id = k
        v.attempts = Attempts(v.attempts)
    for a in v.attempts.values():
        compact_attempt(a)
    _pack_reason(v)


def _pack_reason(v: WorkloadView) -> None:
    """The reason held as the attempt it is derived from (`_job_reason`), when it is that one."""
    reason = v.reason
    if reason.startswith("Job "):
        for a in v.attempts.values():
            if reason == _job_reason(a):
                _REASON.slot.__set__(v, a)
                return


def _share_ids(view: WorkloadView, e: Event) -> None:
    """The event's ids as the projection's own strings (equal: nothing a reader sees changes)."""
    if e.workload_id is not view.workload_id:
        msgspec.structs.force_setattr(e, "workload_id", view.workload_id)
    if isinstance(e, ev.AttemptEvent):
        a = view.attempts.get(e.attempt_id)
        aid = a.attempt_id if a is not None else e.attempt_id
        if e.attempt_id is not aid:
            msgspec.structs.force_setattr(e, "attempt_id", aid)


def _compact_after(view: WorkloadView, e: Event) -> None:
    """What the fold just stored, in the compact form."""
    if isinstance(e, ev.Submitted):
        view.idempotency_key = None  # (no service reads it: the router deduplicates by the log)
        if view.workload is e.workload:
            view.workload = compact_workload(e.workload)
            msgspec.structs.force_setattr(e, "workload", view.workload)  # who folds it next shares it
    elif isinstance(e, ev.Routed | ev.Unroutable | ev.Rejected):
        if e.decision is not None and view.decision is e.decision:
            view.decision = compact_decision(e.decision, view.workload_id, e.at)
        if isinstance(e, ev.Routed):
            view.routed_attempts = _numbers(view.routed_attempts)
    elif isinstance(e, ev.RouteRequested):
        view.route_requested = _numbers(view.route_requested)
    elif isinstance(e, ev.AttemptCreated):
        a = view.attempts.get(e.attempt_id)
        if a is not None:
            compact_attempt(a)
            _pack_reason(view)


def settled(view: WorkloadView) -> bool:
    """Finished, and nothing of it can still act: no attempt may still run (live, lost and not
    confirmed gone), and none that was fenced or refused promotion waits for the fencer to see it
    gone (the fencer resumes those pursuits from the projection after a restart)."""
    if not view.terminal:
        return False
    for a in view.attempts.values():
        if a.live or (not a.gone and (a.fenced or a.promotion_rejected)):
            return False
    return True


class RetiredDoc(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What the services still read of a finished workload's document: who owns it (who may
    cancel it), the store its result is in (the fencer refuses a late promote by its records),
    lease and fencing policy (a late attempt is still fenced), its queue, demand and expected
    run time (fair share counts finished work over its window), and a digest of the whole
    document (a re-sent submit is a duplicate only if it is the same document). Equal ones are
    shared (`_intern`): a sweep's trials, a template's runs."""

    owner: str
    store: str
    lease: str
    fencing: str
    policy_queue: str | None
    gpus: float
    workers: int
    cpu: str
    memory: str
    expected_runtime: str | None
    priority: int

    def workload(self) -> Workload:
        """A stand-in document with these facts (and nothing else: no image, no inputs)."""
        return Workload(
            metadata=Metadata(name="", owner=self.owner),
            spec=WorkloadSpecBody(
                image="", resources=Resources(gpus=self.gpus, workers=self.workers, cpu=self.cpu, memory=self.memory),
                output=OutputPolicy(store=self.store), lease=self.lease, fencing=self.fencing,  # type: ignore[arg-type]
                policy_queue=self.policy_queue, expected_runtime=self.expected_runtime, priority=self.priority,
                retry=RetryPolicy(),
            ),
        )  # fmt: skip


class RetiredAttempt(msgspec.Struct, array_like=True, gc=False):
    attempt_id: str
    number: int
    epoch: int
    cluster: str
    job_name: str
    namespace: str
    queue: str | None
    output_path: str
    mode: str
    status: str
    exit_code: int | None
    reason: str
    fenced: bool
    cancel_confirmed: str | None
    promoted: bool
    promotion_rejected: bool
    orphan_deleted: bool
    placement_failed: bool
    times: dict[str, float]


class Retired(msgspec.Struct, array_like=True, gc=False):
    """A settled finished workload as a service keeps it (see the module doc)."""

    status: str
    reason: str
    epoch: int
    promoted_attempt: str | None
    result_path: str | None
    cancel_requested: bool
    doc: RetiredDoc | None
    digest: bytes
    routed_attempts: list[int]
    route_requested: list[int]
    pipeline: str | None
    stage: str | None
    last_seq: int
    attempts: list[RetiredAttempt]
    decided: bool = False  # it had a routing decision (a verdict binds a record without a submit)

    def view(self, workload_id: str) -> WorkloadView:
        """The view back: what was kept, the stand-in document (`RetiredDoc.workload`), no decision,
        no history, no attempt's checkpoint path."""
        v = WorkloadView(
            workload_id, workload=self.doc.workload() if self.doc is not None else None, status=self.status,
            reason=self.reason, routed_attempts=set(self.routed_attempts), route_requested=set(self.route_requested),
            epoch=self.epoch, promoted_attempt=self.promoted_attempt, result_path=self.result_path,
            cancel_requested=self.cancel_requested, pipeline=self.pipeline, stage=self.stage, last_seq=self.last_seq,
            retired=True, digest=self.digest,
        )  # fmt: skip
        if self.decided and self.doc is None:  # what `rejection_binds` and a later submit read of it
            v.decision = RoutingDecision(workload_id=workload_id, decided_at=0.0, outcome="rejected", summary=self.reason)
        for a in self.attempts:
            v.attempts[a.attempt_id] = AttemptView(
                a.attempt_id, a.number, a.epoch, a.cluster, job_name=a.job_name, namespace=a.namespace, queue=a.queue,
                output_path=a.output_path, mode=a.mode, status=a.status, exit_code=a.exit_code, reason=a.reason,
                fenced=a.fenced, cancel_confirmed=a.cancel_confirmed, promoted=a.promoted,
                promotion_rejected=a.promotion_rejected, orphan_deleted=a.orphan_deleted,
                placement_failed=a.placement_failed, times=dict(a.times),
            )  # fmt: skip
        return v


_DOC_ENCODER = msgspec.msgpack.Encoder()
_INTERNED: dict[RetiredDoc, RetiredDoc] = {}
_INTERN_MAX = 65536  # distinct stand-ins shared at once (beyond it each record keeps its own)


def _intern(doc: RetiredDoc) -> RetiredDoc:
    kept: RetiredDoc = _keep(_INTERNED, doc, doc, _INTERN_MAX)
    return kept


_DOC_DECODER = msgspec.msgpack.Decoder(Workload)


def document_digest(wl: Workload) -> bytes:
    """16 bytes that tell two documents apart: blake2b of its msgpack once through the decoder
    (canonical: a `gpus: 1` built in Python and the `1.0` decoded from the log are one document)."""
    canonical = _DOC_ENCODER.encode(_DOC_DECODER.decode(_DOC_ENCODER.encode(wl)))
    return hashlib.blake2b(canonical, digest_size=16).digest()


def same_document(view: WorkloadView, wl: Workload) -> bool:
    """Is `wl` the document this workload was accepted with (a retired view compares digests)?"""
    if view.retired:
        return view.digest == document_digest(wl)
    return view.workload == wl


def retired_doc(wl: Workload) -> RetiredDoc:
    s, r = wl.spec, wl.spec.resources
    return _intern(RetiredDoc(
        wl.metadata.owner, s.output.store, s.lease, s.fencing, s.policy_queue, r.gpus, r.workers, r.cpu, r.memory,
        s.expected_runtime, s.priority,
    ))  # fmt: skip


def retired_record(view: WorkloadView) -> Retired:
    """The compact record of a (settled) view."""
    wl = view.workload
    if view.retired:
        doc, digest = (retired_doc(wl) if wl is not None else None), view.digest
    else:
        doc, digest = (retired_doc(wl), document_digest(wl)) if wl is not None else (None, b"")
    return Retired(
        view.status, view.reason, view.epoch, view.promoted_attempt, view.result_path, view.cancel_requested, doc, digest,
        sorted(view.routed_attempts), sorted(view.route_requested), view.pipeline, view.stage, view.last_seq,
        [RetiredAttempt(
            a.attempt_id, a.number, a.epoch, a.cluster, a.job_name, a.namespace, a.queue, a.output_path, a.mode, a.status,
            a.exit_code, a.reason, a.fenced, a.cancel_confirmed, a.promoted, a.promotion_rejected, a.orphan_deleted,
            a.placement_failed, dict(a.times),
        ) for a in view.attempts.values()],
        view.decision is not None,
    )  # fmt: skip


def _plain(obj: Any) -> Any:
    """A compact view's containers as the dicts they stand for (the snapshot's format is the whole views')."""
    if isinstance(obj, Times | Attempts):
        return dict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_PROJECTION_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain)
_PROJECTION_DECODER = msgspec.msgpack.Decoder(Projection)


def dump_projection(p: Projection) -> bytes:
    """The projection as bytes (msgpack of every field), for a state snapshot
    (`gpuorch.runtime.snapshot`). `load_projection(dump_projection(p)) == p`."""
    return _PROJECTION_ENCODER.encode(p)


def load_projection(data: bytes) -> Projection:
    """A projection back from `dump_projection` (fields a newer release added take their defaults,
    unknown ones are skipped; raises `msgspec.DecodeError` / `ValidationError` on bad bytes).
    Equal retired documents are shared again, as the fold shares them."""
    p = _PROJECTION_DECODER.decode(data)
    for r in p.retired.values():
        if r.doc is not None:
            r.doc = _intern(r.doc)
    return p


def _current(view: WorkloadView, a: AttemptView) -> bool:
    """Is `a` the attempt the workload's status follows (its latest, while the workload goes on)?"""
    return not view.terminal and not view.cancel_requested and view.latest_attempt is a


def _attempt(view: WorkloadView, e: ev.AttemptEvent) -> AttemptView:
    a = view.attempts.get(e.attempt_id)
    if a is None:
        parsed = k8s.parse_attempt_id(e.attempt_id)
        number = parsed[1] if parsed is not None else 0
        a = AttemptView(e.attempt_id, number, e.epoch, e.cluster)
        if isinstance(view.attempts, Attempts):  # a compact view's
            a.times = _NO_TIMES
        view.attempts[e.attempt_id] = a
    return a


def rejection_binds(view: WorkloadView, e: ev.Rejected) -> bool:
    """Does this `rejected` event decide the state of the workload it is filed under?

    Terminal for an accepted workload only when it is the router's verdict on that workload's
    own submit (`decision` set: no cluster could ever run it). Any other rejection is about a
    message, not a workload: the shell files those under the message (`msg-<stream>-<seq>`), but
    one that names an accepted workload (an older release's record of a bad message, a dead
    letter) never changes that workload. A rejection under an id that has no accepted submit is
    that id's whole record (status `rejected`), until a submit is accepted under it.
    """
    return e.decision is not None or view.workload is None


def _fold(view: WorkloadView, e: Event) -> None:
    kind = ev.type_tag(e)
    if isinstance(e, ev.Rejected) and not rejection_binds(view, e):
        return  # stays in the history (Projection.apply), changes nothing of the workload
    view.times.setdefault(kind, e.at)
    match e:
        case ev.Submitted():
            if view.workload is None and view.status == "rejected" and view.decision is None:
                # the id's earlier record was a refused message (e.g. a cancel that came first),
                # not a verdict on this workload: the accepted submit starts its life
                view.status = "submitted"
                view.times.pop("rejected", None)
            view.workload = e.workload
            view.retired, view.digest = False, b""  # the whole document again, not a stand-in
            view.idempotency_key = e.idempotency_key
            if view.status == "submitted" and view.pipeline is None:
                view.reason = "submitted; waiting for a routing decision"
        case ev.Rejected():
            view.status = "rejected"
            view.reason = e.reason + (
                ": " + "; ".join(f"{x.path}: {x.message}" for x in e.errors) if e.errors else ""
            )
            if e.decision is not None:
                view.decision = e.decision
        case ev.Routed():
            view.decision = e.decision
            view.routed_attempts = {*view.routed_attempts, e.attempt_number}
            if not view.terminal and not view.cancel_requested:
                view.status = "routed"
                view.reason = e.decision.summary
        case ev.Unroutable():
            view.decision = e.decision
            if not view.terminal and not view.cancel_requested:
                view.status = "waiting"
                view.reason = e.decision.summary
        case ev.RouteRequested():
            view.route_requested = {*view.route_requested, e.attempt_number}
        case ev.AttemptCreated():
            a = _attempt(view, e)
            a.number, a.epoch, a.cluster = e.attempt_number, e.epoch, e.cluster
            a.job_name, a.namespace, a.queue = e.job_name, e.namespace, e.queue
            a.output_path, a.checkpoint_path = e.output_path, e.checkpoint_path
            a.mode, a.mode_reason, a.resume_from = e.mode, e.mode_reason, e.resume_from
            a.times["created"] = e.at
            if not view.terminal and not view.cancel_requested:
                # the Job exists; nothing runs until the cluster admits it and places its pods
                view.status = "dispatched"
                view.reason = _job_reason(a)
        case ev.Unschedulable():
            a = _attempt(view, e)
            a.unschedulable = e.message
            a.times.setdefault("unschedulable" if e.permanent else "pending", e.at)
            if _current(view, a) and a.status == "created":
                what = "cannot be placed" if e.permanent else "queued"
                view.reason = f"attempt {a.attempt_id} {what} on {a.cluster}: {e.message}"
        case ev.Admitted():
            a = _attempt(view, e)
            a.times.setdefault("admitted", e.at)
            a.unschedulable = ""
            if a.status == "created":
                a.status = "admitted"
            if _current(view, a) and not a.fenced and view.status in ("dispatched", "lost"):
                view.status = "admitted"
                view.reason = f"attempt {a.attempt_id} admitted on {a.cluster}: every pod placed, starting"
        case ev.Running():
            a = _attempt(view, e)
            a.times.setdefault("running", e.at)
            a.unschedulable = ""
            if a.status in ("created", "admitted", "lost"):
                a.status = "running"
            if _current(view, a) and not a.fenced and view.status in ("dispatched", "admitted", "lost"):
                view.status = "running"
                view.reason = f"attempt {a.attempt_id} running on {a.cluster}"
        case ev.Succeeded():
            a = _attempt(view, e)
            a.status, a.output_path = "succeeded", e.output_path
            if _current(view, a) and not a.fenced:
                view.status = "promoting"
                view.reason = f"attempt {a.attempt_id} succeeded on {a.cluster}; promoting its outputs"
            a.times.setdefault("finished", e.at)
        case ev.Failed():
            a = _attempt(view, e)
            a.status, a.exit_code, a.reason = "failed", e.exit_code, e.reason
            a.placement_failed, a.retryable = e.placement, e.retryable
            if _current(view, a):
                view.status = "retrying"
                view.reason = f"attempt {a.attempt_id} failed on {a.cluster}: {e.reason}"
            a.times.setdefault("finished", e.at)
        case ev.Lost():
            a = _attempt(view, e)
            if a.status in LIVE_ATTEMPT:
                a.status = "lost"
                a.reason = e.reason
                a.times.setdefault("lost", e.at)
                if not view.terminal:
                    view.status = "lost"
                    view.reason = f"attempt {a.attempt_id} lost on {a.cluster}: {e.reason}"
        case ev.FenceRequested():
            _attempt(view, e).times.setdefault("fence-requested", e.at)
        case ev.Fenced():
            a = _attempt(view, e)
            a.fenced = True
            a.times.setdefault("fenced", e.at)
            view.epoch = max(view.epoch, e.new_epoch)
        case ev.ReplacementAllowed():
            _attempt(view, e).times.setdefault("replacement-allowed", e.at)
        case ev.ComputeStarted():
            # the program's own clock at its first step (the event's `at` is when it was seen)
            _attempt(view, e).times.setdefault("compute-started", e.started_at or e.at)
        case ev.CancelConfirmed():
            a = _attempt(view, e)
            a.cancel_confirmed = e.how
            a.times.setdefault("cancel-confirmed", e.at)
        case ev.PromoteRequested():
            _attempt(view, e).times.setdefault("promote-requested", e.at)
        case ev.Promoted():
            a = _attempt(view, e)
            a.promoted = True
            a.times.setdefault("promoted", e.at)
            view.promoted_attempt = e.attempt_id
            view.result_path = e.result_path
        case ev.PromotionRejected():
            a = _attempt(view, e)
            a.promotion_rejected = True
            a.times.setdefault("promotion-rejected", e.at)
        case ev.OrphanDeleted():
            a = _attempt(view, e)
            a.orphan_deleted = True
            a.times.setdefault("orphan-deleted", e.at)
        case ev.Completed():
            view.status = "completed"
            view.result_path = e.result_path
            view.reason = f"attempt {e.attempt_id} promoted to {e.result_path}"
        case ev.CancelRequested():
            view.cancel_requested = True
            if not view.terminal:
                view.reason = f"cancelling: {e.reason}"
        case ev.Cancelled():
            view.status = "cancelled"
            view.reason = e.reason
        case ev.WorkloadFailed():
            view.status = "failed"
            view.reason = e.reason
        case ev.PipelineExpanded():
            view.children = list(e.children)
            if not view.terminal:
                view.status = "running"
                view.reason = f"pipeline of {len(e.children)} stages"
        case ev.StageReady():
            view.stage_inputs = list(e.inputs)
            view.pipeline, view.stage = view.pipeline or e.pipeline, view.stage or e.stage
            if view.status == "submitted":
                view.status, view.reason = "ready", e.reason
        case ev.Held():
            view.held = e
            if view.status in ("submitted", "ready", "held"):
                view.status, view.reason = "held", e.reason
        case ev.Released():
            if view.status in ("submitted", "ready", "held"):
                view.status, view.reason = "released", e.reason
        case ev.StageBlocked():
            if not view.terminal:
                view.status, view.reason = "blocked", e.reason
        case ev.PipelineFinished():
            if not view.terminal:
                view.status = e.outcome if e.outcome != "completed" else "completed"
            view.reason = e.reason
        case ev.PreemptionPlanned():
            view.preemption = e
        case _:
            pass
