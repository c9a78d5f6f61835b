"""The router's functional core around the policy: exclusions and re-published waiting decisions.

Pure: no I/O, no clock, no logging. The shell (`service.py`) folds every event of the log into a
`RouterState` (`RouterState.apply`, idempotent by stream sequence per workload, so a restarted router that
replays the log rebuilds the same state), and asks:

* `exclusions(request, attempt_number, snapshots, now)`: the clusters the caller's
  `route-requested` still rules out *now*. An exclusion is not forever: it holds only until the
  excluded cluster has been observed since the request (its latest snapshot's `observed_at` is
  later than the request's `at`: inventory heard from it after the loss was acted on), and at
  most `max_snapshot_age` seconds after the request. By then any snapshot observed before the
  request is stale, so the policy's own freshness check keeps an unobserved cluster out
  (the bound changes which reason is shown, never the outcome);
* `decide(state, workload, wid, attempt_number, snapshots, now)`: the policy's decision with
  those exclusions;
* `reevaluation(state, wid, attempt_number, decision, now)`: what a re-evaluation of waiting
  work publishes. Routed or rejected: the event that ends the wait. Still waiting: a new
  `unroutable` (a new event id per distinct decision, so JetStream's de-duplication keeps it)
  only when its verdicts or reasons differ from the last one in the log (`signature`), and at
  most once per `REPUBLISH_MIN_INTERVAL` per workload. So `explain` shows the reason true now,
  and an unchanged world publishes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import msgspec

from gpuorch.projection import Projection, WorkloadView
from gpuorch_proto import ClusterSnapshot, Event, RoutingDecision, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_proto.resume import CheckpointRef

from . import preempt
from .demand import parse_demand
from .estimate import declared_seconds, relative_speed
from .fairshare import Usage
from .history import (
    RUN_QUANTILE,
    ClusterSample,
    MeasuredTimeline,
    RoutingHistory,
    RunSample,
    history_from,
    history_parts,
    update_history,
)
from .pipeline import Gate, GateRound, with_stage_inputs
from .policy import RoutingMemo, SnapshotIndex, route

MAX_SNAPSHOT_AGE = 120.0  # seconds: the policy's default; an exclusion never outlives it
REPUBLISH_MIN_INTERVAL = 1.0  # seconds between two re-published waiting decisions of one workload

#: A decision's verdicts and reasons, without snapshot ages (they change every second).
Signature = tuple[object, ...]


class Observed(Protocol):
    @property
    def observed_at(self) -> float: ...


@dataclass(frozen=True)
class RouteRequest:
    """The latest `route-requested` of a workload, as the log has it."""

    attempt_number: int
    exclude: tuple[str, ...]
    at: float
    checkpoint: CheckpointRef | None = None  # the latest valid checkpoint, for a resume


@dataclass(frozen=True, slots=True)
class Published:
    """The latest routing decision of a workload in the log (or just published by this router)."""

    attempt_number: int
    signature: Signature
    at: float


@dataclass
class RouterState:
    requests: dict[str, RouteRequest] = field(default_factory=dict)
    published: dict[str, Published] = field(default_factory=dict)  # the latest decision in the log
    sent: dict[str, Published] = field(default_factory=dict)  # published by this router, maybe not echoed yet
    unroutable: dict[str, int] = field(default_factory=dict)  # unroutable events in the log per workload
    unroutable_sent: dict[str, int] = field(default_factory=dict)  # ... counting those sent, not yet echoed
    last_seq: int = 0  # the highest sequence folded in
    seqs: dict[str, int] = field(default_factory=dict)  # the last sequence folded in, per workload
    # preemption (gpuorch_router.preempt): victim workload -> (preemptor, when); attempt -> preemptor;
    # `preemption-planned` in the log per workload (their ids count); workloads that finished
    preempted: dict[str, tuple[str, float]] = field(default_factory=dict)
    preempting: dict[str, str] = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    placed: dict[str, float] = field(default_factory=dict)  # workload -> its latest admitted / running
    plans: dict[str, tuple[object, ...]] = field(default_factory=dict)  # the latest plan's signature in the log
    stage_inputs: dict[str, list[ev.StageInput]] = field(default_factory=dict)  # a stage's `stage-ready` inputs
    # equal signatures as one tuple (one is kept per workload; most routed decisions have one of a
    # few): a cache, not folded state (not in a snapshot, not compared)
    signatures: dict[Signature, Signature] = field(default_factory=dict, compare=False, repr=False)

    def shared(self, d: RoutingDecision) -> Signature:
        sig = signature(d)
        got = self.signatures.get(sig)
        if got is None:
            if len(self.signatures) >= SIGNATURES_SHARED:
                return sig
            got = self.signatures[sig] = sig
        return got

    def apply(self, e: Event, seq: int) -> None:
        """Fold one event of the log (a sequence already applied changes nothing).

        Idempotent by sequence *per workload*, as `Projection.apply` is: a consumer that handles
        workloads concurrently folds different workloads' events out of global order, one
        workload's in order.
        """
        wid = e.workload_id
        if seq:
            if seq <= self.seqs.get(wid, 0):
                return
            self.seqs[wid] = seq
            self.last_seq = max(self.last_seq, seq)
        if isinstance(e, ev.RouteRequested):
            old = self.requests.get(wid)
            if old is None or e.attempt_number >= old.attempt_number:
                self.requests[wid] = RouteRequest(e.attempt_number, tuple(e.exclude), e.at, e.checkpoint)
        elif isinstance(e, ev.Routed | ev.Unroutable):
            p = self.published[wid] = Published(e.attempt_number, self.shared(e.decision), e.at)
            if isinstance(e, ev.Unroutable):
                self.unroutable[wid] = self.unroutable.get(wid, 0) + 1
            # what this router sent is in the log now: `last` and `unroutable_count` read the log's
            if (s := self.sent.get(wid)) is not None and s.at <= p.at:
                del self.sent[wid]
            if (n := self.unroutable_sent.get(wid)) is not None and n <= self.unroutable.get(wid, 0):
                del self.unroutable_sent[wid]
        elif isinstance(e, ev.PreemptionRequested):
            self.preempted[wid] = (e.preemptor, e.at)
            self.preempting[e.attempt_id] = e.preemptor
        elif isinstance(e, ev.PreemptionPlanned):
            self.planned[wid] = self.planned.get(wid, 0) + 1
            self.plans[wid] = preempt.planned_signature(e)
        elif isinstance(e, ev.Completed | ev.Cancelled | ev.WorkloadFailed) or (isinstance(e, ev.Rejected) and e.decision is not None):
            self.done.add(wid)
            self._forget(wid)
        elif isinstance(e, ev.Admitted | ev.Running):
            self.placed[wid] = max(self.placed.get(wid, 0.0), e.at)
        elif isinstance(e, ev.StageReady) and e.inputs:
            self.stage_inputs[wid] = list(e.inputs)

    def _forget(self, wid: str) -> None:
        """A finished workload is never routed, re-published or preempted again: of it the router
        keeps that it is done (a preemptor's end lets its victims go) and its sequence only."""
        for table in (self.stage_inputs, self.requests, self.published, self.unroutable, self.placed, self.plans, self.planned, self.preempted):
            table.pop(wid, None)

    def note_published(self, events: list[ev.Base]) -> None:
        """Remember decisions this router is publishing before the log echoes them back."""
        for e in events:
            if isinstance(e, ev.Routed | ev.Unroutable):
                self.sent[e.workload_id] = Published(e.attempt_number, self.shared(e.decision), e.at)
            if isinstance(e, ev.Unroutable):
                self.unroutable_sent[e.workload_id] = self.unroutable_count(e.workload_id) + 1

    def unroutable_count(self, wid: str) -> int:
        """How many `unroutable` of `wid` exist: in the log, or sent since (ids never repeat)."""
        return max(self.unroutable.get(wid, 0), self.unroutable_sent.get(wid, 0))

    def last(self, wid: str) -> Published | None:
        """The newest decision of `wid`: in the log, or sent by this router since."""
        p, s = self.published.get(wid), self.sent.get(wid)
        if p is None or (s is not None and s.at > p.at):
            return s
        return p


_NOT_FOLDED = ("sent", "unroutable_sent", "signatures")  # sent, not yet echoed (a full replay has none); a cache


def dump_state(state: RouterState) -> bytes:
    """Every field `RouterState` folds from the log, for a state snapshot (a field added later is
    included by itself): `load_state(dump_state(s))` equals the state a full replay of the same
    events builds (tests/snapshot)."""
    empty: dict[str, Any] = {name: {} for name in _NOT_FOLDED}
    return msgspec.msgpack.encode(replace(state, **empty))


def _tupled(x: object) -> object:
    return tuple(_tupled(v) for v in x) if isinstance(x, list | tuple) else x


def load_state(data: bytes) -> RouterState:
    """`RouterState` back from `dump_state`. msgpack has no tuples: values typed `tuple[object, ...]`
    (signatures, plans) come back as lists and are made tuples again, as the fold makes them."""
    s = msgspec.msgpack.decode(data, type=RouterState)
    s.published = {w: Published(p.attempt_number, tuple(_tupled(v) for v in p.signature), p.at) for w, p in s.published.items()}
    for f in fields(RouterState):
        value = getattr(s, f.name)
        if "tuple[object" in str(f.type) and isinstance(value, dict):
            setattr(s, f.name, {k: _tupled(v) for k, v in value.items()})
    return s


_GATE_NOT_FOLDED = ("unconfirmed", "releasing")  # noted by this router, not yet echoed: a full replay has none


def dump_gate(gate: Gate) -> bytes:
    """Every field the gate folds from the log (`Gate`), for a state snapshot."""
    empty: dict[str, Any] = {name: {} for name in _GATE_NOT_FOLDED}
    return msgspec.msgpack.encode(replace(gate, **empty))


def load_gate(data: bytes) -> Gate:
    """`Gate` back from `dump_gate`, marked dirty: the next round looks at everything again."""
    g = msgspec.msgpack.decode(data, type=Gate)
    g.dirty, g.dirty_pipelines = True, set(g.pipelines)
    return g


class _History(msgspec.Struct, frozen=True):
    """`RoutingHistory`'s samples (`history.history_parts`); the summaries are recomputed on load.
    (A snapshot from before issue 30 held moving averages without samples: it loads as empty.)"""

    runs: dict[str, dict[str, list[tuple[float, int, float, float]]]] = {}
    clusters: dict[str, list[tuple[float, int, float | None, float | None]]] = {}
    default_overlap: float = 0.0
    quantile: float = RUN_QUANTILE


def dump_history(h: RoutingHistory | None) -> bytes:
    """What the router learnt from measured timelines (`history.RoutingHistory`), for its snapshot:
    a restarted router starts from it instead of learning again from every completed workload."""
    if h is None:
        return b""
    runs, clusters = history_parts(h)  # in a canonical order: equal histories, equal bytes
    return msgspec.msgpack.encode(_History(
        {k: {m: [tuple(s) for s in runs[k][m]] for m in sorted(runs[k])} for k in sorted(runs)},  # type: ignore[misc]
        {c: [tuple(s) for s in clusters[c]] for c in sorted(clusters)}, h.default_overlap, h.quantile,  # type: ignore[misc]
    ))  # fmt: skip


def load_history(data: bytes) -> RoutingHistory | None:
    if not data:
        return None
    h = msgspec.msgpack.decode(data, type=_History)
    return history_from(
        {k: {m: [RunSample(*s) for s in w] for m, w in ms.items()} for k, ms in h.runs.items()},
        {c: [ClusterSample(*s) for s in w] for c, w in h.clusters.items()},
        default_overlap=h.default_overlap, quantile=h.quantile,
    )  # fmt: skip


def measured_timeline(view: WorkloadView, time_scale: float = 1.0) -> MeasuredTimeline | None:
    """What the router learns from a completed workload: its promoted attempt's timeline, read
    from the log alone (the attempt's stamps, and the GPU model and staging its routing decision
    estimated for that cluster), so a restarted router and a replica learn the same. The run is
    from the program's first step (`compute-started`), else from running, to finished; it is not
    learnt where the cluster had GPUs of several suitable models (which one ran it is not in the
    log). Times are in simulated seconds (`time_scale`: the registry's). None: nothing was promoted."""
    if view.workload is None or view.promoted_attempt is None:
        return None
    a = view.attempts.get(view.promoted_attempt)
    if a is None:
        return None
    verdicts = view.decision.verdicts if view.decision is not None else []
    est = next((v.estimate for v in verdicts if v.cluster == a.cluster and v.estimate is not None), None)
    staged = est is not None and (est.data_staging > 0 or est.image_staging > 0)
    model = (est.gpu_model or None) if est is not None else None

    def sim(key: str, times: Mapping[str, float]) -> float | None:
        t = times.get(key)
        return t * time_scale if t is not None else None

    d = parse_demand(view.workload, None, None)
    learn_run = model is not None or d.per_worker == 0  # (GPUs of several models there: which ran it is not known)
    return MeasuredTimeline(
        cluster=a.cluster,
        workload_key=d.key,
        gpu_product=model,
        routed_at=sim("routed", view.times),
        admitted_at=sim("admitted", a.times),
        staging_started_at=sim("admitted", a.times) if staged else None,
        staging_finished_at=sim("running", a.times) if staged else None,
        compute_started_at=sim("compute-started" if "compute-started" in a.times else "running", a.times) if learn_run else None,
        finished_at=sim("finished", a.times),
        promoted_at=sim("promoted", a.times),
        workload_id=view.workload_id,
        declared_seconds=declared_seconds(d, relative_speed(model)),
    )


def same_history(a: RoutingHistory | None, b: RoutingHistory | None) -> bool:
    """Equal learnt values (histories compare by identity: `history.RoutingHistory`)."""
    return dump_history(a) == dump_history(b)


class _RouterParts(msgspec.Struct, frozen=True):
    state: bytes
    gate: bytes = b""
    history: bytes = b""


def dump_router(state: RouterState, gate: Gate, history: RoutingHistory | None = None) -> bytes:
    """The router core's folded state (`RouterState`, the pipeline `Gate`, the learnt routing
    history) for its snapshot."""
    return msgspec.msgpack.encode(_RouterParts(dump_state(state), dump_gate(gate), dump_history(history)))


def load_router(data: bytes) -> tuple[RouterState, Gate, RoutingHistory | None]:
    parts = msgspec.msgpack.decode(data, type=_RouterParts)
    return load_state(parts.state), load_gate(parts.gate) if parts.gate else Gate(), load_history(parts.history)


def exclusions(
    request: RouteRequest | None,
    attempt_number: int,
    snapshots: Mapping[str, Observed],
    now: float,
    max_snapshot_age: float = MAX_SNAPSHOT_AGE,
) -> tuple[str, ...]:
    """The clusters `request` still excludes for `attempt_number` at `now` (see the module doc)."""
    if request is None or request.attempt_number != attempt_number or not request.exclude:
        return ()
    if now - request.at >= max_snapshot_age:
        return ()
    out = []
    for c in request.exclude:
        snap = snapshots.get(c)
        if snap is not None and snap.observed_at > request.at:
            continue  # observed since the loss: the exclusion is lifted
        out.append(c)
    return tuple(out)


def decide(
    state: RouterState,
    workload: Workload,
    wid: str,
    attempt_number: int,
    snapshots: Mapping[str, SnapshotIndex],
    now: float,
    *,
    history: RoutingHistory | None = None,
    max_snapshot_age: float = MAX_SNAPSHOT_AGE,
    memo: RoutingMemo | None = None,
) -> RoutingDecision:
    """The policy's decision (through `memo`, the caller's fast path, when given: the same record)
    with the exclusions of the workload's route request, and the checkpoint it names to resume.
    A pipeline stage is routed with its dependencies' promoted results among its inputs
    (`pipeline.with_stage_inputs`), for every attempt: here and nowhere else."""
    workload = with_stage_inputs(workload, state.stage_inputs.get(wid, ()))
    req = state.requests.get(wid)
    ex = exclusions(req, attempt_number, snapshots, now, max_snapshot_age)
    resume = req.checkpoint if req is not None and req.attempt_number == attempt_number else None
    decide_with = memo.route if memo is not None else route
    d = decide_with(workload, wid, snapshots, now, history=history, exclude=ex, max_snapshot_age=max_snapshot_age, resume=resume)
    return yielding(state, wid, attempt_number, d, now)


def yielding(state: RouterState, wid: str, attempt_number: int, decision: RoutingDecision, now: float) -> RoutingDecision:
    """A preempted workload's replacement waits while its preemptor is not placed yet
    (`preempt.yields_to`): the GPUs it gave up go to the preemptor first."""
    got = state.preempted.get(wid)
    if got is None or attempt_number <= 1 or decision.outcome != "routed":
        return decision
    preemptor, at = got
    placed = state.placed.get(preemptor, -1.0) >= at  # placed since it preempted (not an earlier attempt)
    why = preempt.yields_to(preemptor, at, placed, preemptor in state.done, now)
    if why is None:
        return decision
    return msgspec.structs.replace(decision, outcome="waiting", cluster=None, queue=None, placement=None, summary=why)


def _reason(code: str, message: str) -> str:
    if code == "CLUSTER_UNREACHABLE":  # its message shows the age: keep "unreachable" / "snapshot is stale"
        return message.split(":", 1)[0].split(" (", 1)[0]
    return message


SIGNATURES_SHARED = 65536  # distinct signatures a `RouterState` shares at once (`RouterState.shared`)


def signature(d: RoutingDecision) -> Signature:
    """What `explain` shows of a decision, less snapshot ages: outcome, target, every failed check."""
    return (
        d.outcome,
        d.cluster,
        d.queue,
        tuple(
            (v.cluster, v.eligible, tuple((c.code, c.capacity_only, _reason(c.code, c.message)) for c in v.checks if not c.ok))
            for v in d.verdicts
        ),
    )


def decision_events(wid: str, decision: RoutingDecision, attempt_number: int, now: float, republish: int = 0) -> list[ev.Base]:
    """The events of a decision; `republish` > 0 numbers a re-published waiting decision."""
    if decision.outcome == "routed":
        return [ev.Routed(event_id=event_id(wid, "routed", attempt_number), workload_id=wid, at=now, decision=decision, attempt_number=attempt_number)]
    if decision.outcome == "waiting":
        disc = f"{attempt_number}.r{republish}" if republish else attempt_number
        return [ev.Unroutable(event_id=event_id(wid, "unroutable", disc), workload_id=wid, at=now, decision=decision, attempt_number=attempt_number)]
    return [ev.Rejected(event_id=event_id(wid, "rejected", f"route{attempt_number}"), workload_id=wid, at=now, reason=f"no cluster can ever run this workload: {decision.summary}", decision=decision)]


def reevaluation(
    state: RouterState,
    wid: str,
    attempt_number: int,
    decision: RoutingDecision,
    now: float,
    min_interval: float = REPUBLISH_MIN_INTERVAL,
) -> list[ev.Base]:
    """What re-evaluating waiting work publishes (nothing when its decision is unchanged)."""
    if decision.outcome != "waiting":
        return decision_events(wid, decision, attempt_number, now)
    last = state.last(wid)
    if last is not None and last.attempt_number == attempt_number:
        if last.signature == signature(decision):
            return []
        if now - last.at < min_interval:
            return []  # changed, but re-published a moment ago: the next round publishes it
    return decision_events(wid, decision, attempt_number, now, republish=state.unroutable_count(wid) + 1)


def learnt(history: RoutingHistory | None, view: WorkloadView, time_scale: float) -> RoutingHistory | None:
    """The routing history after a completed workload: its promoted attempt's measured timeline
    (`measured_timeline`, from the log alone) folded in (`history.update_history`). Unchanged
    when nothing was promoted."""
    measured = measured_timeline(view, time_scale)
    return history if measured is None else update_history(history, measured)


def fold(
    projection: Projection,
    state: RouterState,
    history: RoutingHistory | None,
    e: Event,
    seq: int,
    time_scale: float,
) -> tuple[WorkloadView | None, RoutingHistory | None]:
    """One event of the log into what routing reads: the projection, `RouterState`, and the
    routing history (learnt from a workload completed by an event not folded before). Returns
    the workload's view and the history. The router's replay folds with this (`Router.fold`),
    and so does `replay`."""
    if isinstance(e, ev.AdmissionTerm):  # about no workload: which router leads (`lease`)
        return None, history
    fresh = not seq or seq > state.seqs.get(e.workload_id, 0)
    view = projection.apply(e, seq)
    state.apply(e, seq)
    if isinstance(e, ev.Completed) and fresh and view is not None:
        history = learnt(history, view, time_scale)
    return view, history


@dataclass
class Replayed:
    """What routing reads, folded from the log (`replay`)."""

    projection: Projection
    state: RouterState = field(default_factory=RouterState)
    history: RoutingHistory | None = None


def replay(
    events: Iterable[tuple[int, Event]],
    projection: Projection,
    time_scale: float = 1.0,
) -> Replayed:
    """The log folded as the router folds it (`Router.fold`: every event through `fold`) into
    `projection` (empty, built as the router builds its own: `Follower.of(tuning)`), learning
    from completed workloads as the router does (from the log alone)."""
    out = Replayed(projection)
    for seq, e in events:
        _, out.history = fold(out.projection, out.state, out.history, e, seq, time_scale)
    return out


def pending_attempt(view: WorkloadView | None) -> int | None:
    """The attempt number this workload waits a routing decision for (None: none).

    The latest requested attempt without a `routed` decision; attempt 1 only once the workload
    is released (`released`: the gate, `gate_round`, let it through) and while it is waiting, or
    released but never decided (the router died between `released` and its decision). Work that
    was accepted but never released is the gate's: its next round releases (or holds) it.
    """
    if view is None or view.workload is None or view.terminal or view.cancel_requested:
        return None
    wanted = max(view.route_requested | {1})
    if wanted in view.routed_attempts:
        return None
    if wanted == 1:
        return 1 if view.status in ("waiting", "released") else None
    return wanted


def gate_round(
    gate: Gate,
    policy: AdmissionPolicy,
    state: RouterState,
    decide: Callable[[Workload, str], RoutingDecision],
    now: float,
    *,
    force: bool = False,
    usage: Usage | None = None,
    time_scale: float = 1.0,
) -> GateRound:
    """One round of the gate (`pipeline.Gate.step`: stages ready or blocked, pipelines finished,
    releases, holds, refusals), and the routing decision of every workload it released, in the
    same batch (`released` first). The service and the deterministic simulation both call this.
    `time_scale`: the registry's simulated seconds per second (budgets count simulated GPU-hours)."""
    r = gate.step(policy, now, force=force, usage=usage, time_scale=time_scale)
    for e in r.events:
        if isinstance(e, ev.StageReady):  # decided this round: `decide` reads the stage's inputs
            state.apply(e, 0)
    for wid in r.released:
        wl = gate.workloads.get(wid)
        if wl is None:
            continue
        out = decision_events(wid, decide(wl, wid), 1, now)
        state.note_published(out)
        r.events += out  # type: ignore[arg-type]
    return r


def preemptions(
    state: RouterState,
    views: Iterable[WorkloadView],
    snapshots: Iterable[ClusterSnapshot],
    now: float,
    candidates: Iterable[WorkloadView] | None = None,
) -> list[ev.Base]:
    """Level-triggered, every round: `preempt.plan` for each workload with a priority that waits
    for capacity (in the router: its waiting decision's capacity-only clusters; or queued at its
    destination: that cluster). `preemption-planned` (whose GPUs it waits for, who is preempted)
    and a `preemption-requested` per victim, each only when its plan differs from the latest one
    in the log (`RouterState.plans`, folded by `apply`). `candidates`: the
    views among `views` that may be such a workload (every one with a priority above 0; default:
    all of `views`), so that a round need not look at every workload when few have a priority.

    Pure: `state` is only read. A plan is on record once its `preemption-planned` is folded back
    (the k-th of a workload has id `<wid>.preemption-planned.<k>`), so a publish that failed is
    decided again by the next round, and one published but not folded back yet is decided again
    with the same ids (JetStream's de-duplication drops the second)."""
    views = list(views) if candidates is None else views
    waiting: list[tuple[WorkloadView, Workload, list[str]]] = []
    for v in views if candidates is None else candidates:
        wl = v.workload
        if wl is None or wl.spec.priority <= 0 or v.terminal or v.cancel_requested:
            continue
        queued = preempt.queued_on(v)
        where = [queued] if queued else preempt.capacity_clusters(v.decision) if v.status == "waiting" and v.decision else []
        if where:
            waiting.append((v, wl, where))
    if not waiting:
        return []  # (who holds GPUs is looked up only when someone waits for them)
    holders = preempt.holders_of(list(views), state.preempting)
    free = preempt.free_gpus(snapshots)
    out: list[ev.Base] = []
    for v, wl, where in waiting:
        wid = v.workload_id
        in_flight = [x for x, (p, at) in state.preempted.items() if p == wid and now - at < preempt.YIELD_FOR and x not in state.done]
        p = preempt.plan(wid, wl, where, holders, free, in_flight)
        if not p.waits or state.plans.get(wid) == p.signature:
            continue
        out += p.events(now, state.planned.get(wid, 0) + 1)
    return out
