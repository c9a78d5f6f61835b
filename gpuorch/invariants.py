"""The safety invariants, checked from the event stream alone (plus the Jobs left on clusters).

1. At most one promoted attempt per workload.
2. No promotion by a stale epoch: an attempt promoted after its epoch was fenced is a violation.
3. Every submitted workload ends in a terminal state, or shows why it is waiting.
4. No orphaned Jobs after cancellation (or completion): no Job of a finished workload remains.
7. Preemption only of checkpoint-safe work ("preempted-only-interruptible"): every
   `preemption-requested` names an attempt whose workload declares `spec.preemptible` with a
   checkpoint (`spec.checkpoint.path`), for a workload of strictly higher priority; and every
   attempt fenced as preempted had such a request.
8. The store agrees ("manifest-agrees", `check_manifests`): each workload has at most one result
   manifest across the stores; a manifest exists only for a promoted workload and names the
   promoted attempt at its epoch (never a fenced attempt's, never one of a cancelled or failed
   workload); a promoted workload has its manifest.
6. Never two current attempts, and `strict` means confirmed ("replacement-after-fence"): an
   attempt is created only once the attempt before it is fenced, and, when that one was
   fenced under `strict` while its pods might still run (not `stopped`), only after its
   `cancel-confirmed` (deleted, gone, or its lease ran out).
9. Admission within limits ("within-limits", `check_limits`, given the admission policy): at no
   point of the log does released work that has not finished (`released`, until `completed`,
   `workload-failed`, `cancelled` or a rejection) exceed the organisation's or a queue's
   `max_running` workloads or `max_gpus` GPUs.
5. Every wait has an end or a reason that is true now (`check_waits`, "wait-reason-current"):
   a non-terminal workload either makes progress or its latest waiting decision names reasons
   that inventory has not contradicted for longer than a tolerance.

Pure: it takes events in stream order (and, for 5, the snapshots inventory published) and
returns violations with explanations.

Invariant 5, precisely. A workload *awaits the router* when it is not terminal, no cancel was
requested, admission does not hold it (`held`: 9 and 3 cover it), and its current attempt number
(the highest `route-requested`, else 1) has no `routed` decision. Anything else is progress (an
attempt is routed, running, being fenced or replaced: the dispatcher's and fencer's business,
covered by 1-4). A workload awaiting the router for longer than `tolerance` since the request
(the `submitted`, or its `released` if admission held it, or the `route-requested`)
must have an `unroutable` decision for that attempt, and every reason it names as a blocker
(an ineligible cluster whose failed checks are all capacity-only) that inventory can disprove
must not have been disproved for longer than `tolerance`:

* `CLUSTER_UNREACHABLE` is disproved by a snapshot of that cluster that is reachable and was
  fresh when published (`published_at - observed_at <= max_snapshot_age`); it counts from the
  first snapshot of the trailing run of such snapshots (a cluster that went away again is
  unreachable again);
* a capacity-only `CLUSTER_NOT_ALLOWED` (the caller's exclusion after a lost attempt) is
  disproved once a snapshot of that cluster observed after the `route-requested` was published,
  or `max_snapshot_age` after the request (the router's exclusion rule, docs/routing.md);
* other capacity-only reasons (nodes NotReady, ...) depend on the workload's shape and are not
  re-derived here.

The relevant inventory change is thus the snapshot that made a named reason false; the router
must publish a decision (routed, or waiting for the reasons true now) within `tolerance` of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuorch.projection import Projection
from gpuorch_proto import ClusterSnapshot, Event, RoutingDecision
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_proto.storage import Manifest
from gpuorch_proto.workload import interruptible

WAIT_TOLERANCE = 10.0  # seconds the router has to re-publish after a reason became false
MAX_SNAPSHOT_AGE = 120.0  # seconds; the router's default


@dataclass(frozen=True)
class Violation:
    invariant: str
    workload_id: str
    detail: str


def check(
    events: Iterable[tuple[int, Event]],
    *,
    jobs: Mapping[str, Iterable[tuple[str, str]]] | None = None,
    require_terminal: bool = True,
    snapshots: Mapping[str, Sequence[ClusterSnapshot]] | None = None,
    now: float | None = None,
    wait_tolerance: float = WAIT_TOLERANCE,
) -> list[Violation]:
    """`events`: (stream seq, event) in order; `jobs`: cluster -> (workload id, job name) still present.

    With `snapshots` (each cluster's, in publish order) and `now`, invariant 5 is checked too.
    """
    events = list(events)
    out: list[Violation] = []
    promoted: dict[str, set[str]] = {}
    fenced: dict[str, set[str]] = {}  # workload -> attempts whose epoch went stale
    epoch: dict[str, int] = {}
    p = Projection()
    for seq, e in events:
        p.apply(e, seq)
        wid = e.workload_id
        if isinstance(e, ev.Fenced):
            fenced.setdefault(wid, set()).add(e.attempt_id)
            epoch[wid] = max(epoch.get(wid, 1), e.new_epoch)
        elif isinstance(e, ev.Promoted):
            s = promoted.setdefault(wid, set())
            s.add(e.attempt_id)
            if len(s) > 1:
                out.append(Violation("one-promotion", wid, f"attempts {sorted(s)} were all promoted"))
            if e.attempt_id in fenced.get(wid, set()) or e.epoch < epoch.get(wid, 1):
                out.append(Violation("no-stale-promotion", wid, f"{e.attempt_id} promoted at epoch {e.epoch} after the epoch moved to {epoch.get(wid, 1)}"))
    out += _replacements(events)
    out += _preemptions(events)
    for wid, v in p.workloads.items():
        if v.workload is None and v.status != "rejected":
            continue  # events of a workload whose submit we did not see (another prefix)
        if require_terminal and not v.terminal:
            waiting_with_reason = v.status == "waiting" and bool(v.reason)
            if not waiting_with_reason:
                out.append(Violation("terminal-or-waiting", wid, f"status {v.status!r}: {v.reason or 'no reason given'}"))
    for cluster, present in (jobs or {}).items():
        for wid, job in present:
            owner = p.get(wid)
            if owner is None:
                out.append(Violation("no-orphans", wid, f"job {job} on {cluster} belongs to no known workload"))
            elif owner.terminal:
                out.append(Violation("no-orphans", wid, f"job {job} still on {cluster} after the workload {owner.status}"))
    if snapshots is not None and now is not None:
        out += check_waits(events, snapshots, now, tolerance=wait_tolerance)
    return out


def check_manifests(events: Iterable[tuple[int, Event]], manifests: Mapping[str, Mapping[str, Manifest]]) -> list[Violation]:
    """Invariant 8, over what the stores hold: `manifests` is workload -> store -> its manifest
    there (read once everything settled; workloads with none may be absent)."""
    events = list(events)
    p = Projection()
    promoted: dict[str, list[ev.Promoted]] = {}
    fenced: dict[str, set[str]] = {}
    for seq, e in events:
        p.apply(e, seq)
        if isinstance(e, ev.Promoted):
            promoted.setdefault(e.workload_id, []).append(e)
        elif isinstance(e, ev.Fenced):
            fenced.setdefault(e.workload_id, set()).add(e.attempt_id)
    out: list[Violation] = []
    for wid, v in p.workloads.items():
        found = dict(manifests.get(wid, {}))
        proms = promoted.get(wid, [])
        if len(found) > 1:
            out.append(Violation("manifest-agrees", wid, f"manifests in {sorted(found)}: a result is published once"))
        for store, m in sorted(found.items()):
            where = f"the manifest in {store}"
            if m.workload_id != wid:
                out.append(Violation("manifest-agrees", wid, f"{where} is {m.workload_id}'s"))
            elif m.attempt_id in fenced.get(wid, set()) and not any(pr.attempt_id == m.attempt_id and pr.epoch == m.epoch for pr in proms):
                out.append(Violation("manifest-agrees", wid, f"{where} names {m.attempt_id}, whose epoch was fenced"))
            elif not proms:
                out.append(Violation("manifest-agrees", wid, f"{where} names {m.attempt_id} at epoch {m.epoch}, but the workload ({v.status}) was never promoted"))
            elif not any(pr.attempt_id == m.attempt_id and pr.epoch == m.epoch for pr in proms):
                out.append(Violation("manifest-agrees", wid, f"{where} names {m.attempt_id} at epoch {m.epoch}, the promotion {proms[0].attempt_id} at epoch {proms[0].epoch}"))
        if proms and not found:
            out.append(Violation("manifest-agrees", wid, f"{proms[0].attempt_id} was promoted, but no store holds its manifest"))
    return out


def check_limits(events: Iterable[tuple[int, Event]], policy: AdmissionPolicy) -> list[Violation]:
    """Invariant 9, from the log and the policy the router admits by: each `released` counts
    against the organisation's and its queue's limits until the workload finishes; a release that
    takes a scope past its `max_running` or `max_gpus` is a violation. Re-derived from the
    events, not from the router's gate (an oracle, not a copy of the rule)."""
    running: dict[str, tuple[str, float]] = {}  # released, unfinished workload -> (queue, GPUs)
    finished: set[str] = set()
    out: list[Violation] = []
    for _, e in events:
        wid = e.workload_id
        if isinstance(e, ev.Released):
            if wid in finished or wid in running:
                continue
            running[wid] = (e.queue, e.gpus)
            q = policy.queue(e.queue)
            scopes = [("organisation", policy.organisation, list(running.values()))]
            if q is not None:
                scopes.append((f"queue {q.name}", q.limits, [r for r in running.values() if r[0] == q.name]))
            for label, limits, held in scopes:
                gpus = sum(g for _, g in held)
                if limits.max_running is not None and len(held) > limits.max_running:
                    out.append(Violation("within-limits", wid, f"released while {len(held) - 1} workloads of {label} run (max_running {limits.max_running})"))
                if limits.max_gpus is not None and gpus > limits.max_gpus + 1e-9:
                    out.append(Violation("within-limits", wid, f"released to {gpus:g} GPUs running in {label} (max_gpus {limits.max_gpus:g})"))
        elif isinstance(e, ev.Completed | ev.WorkloadFailed | ev.Cancelled) or (isinstance(e, ev.Rejected) and e.decision is not None):
            finished.add(wid)
            running.pop(wid, None)
    return out


def _preemptions(events: Sequence[tuple[int, Event]]) -> list[Violation]:
    """Invariant 7: only interruptible work (declared preemptible, with a checkpoint) of lower
    priority is ever preempted, and nothing is fenced as preempted without the router's request."""
    out: list[Violation] = []
    p = Projection()
    requested: set[str] = set()
    for seq, e in events:
        p.apply(e, seq)
        if isinstance(e, ev.PreemptionRequested):
            requested.add(e.attempt_id)
            victim, by = p.get(e.workload_id), p.get(e.preemptor)
            wl = victim.workload if victim is not None else None
            if wl is None or not interruptible(wl):
                out.append(Violation("preempted-only-interruptible", e.workload_id, f"{e.attempt_id} preempted for {e.preemptor}, but its workload is not interruptible"))
            elif by is None or by.workload is None or by.workload.spec.priority <= wl.spec.priority:
                theirs = by.workload.spec.priority if by is not None and by.workload is not None else "unknown"
                out.append(Violation("preempted-only-interruptible", e.workload_id, f"{e.attempt_id} (priority {wl.spec.priority}) preempted for {e.preemptor} of priority {theirs}"))
        elif isinstance(e, ev.FenceRequested) and e.reason.startswith("preempted by ") and e.attempt_id not in requested:
            out.append(Violation("preempted-only-interruptible", e.workload_id, f"{e.attempt_id} fenced as preempted without a preemption-requested"))
    return out


def _replacements(events: Sequence[tuple[int, Event]]) -> list[Violation]:
    """Invariant 6, from the log alone: when each attempt was created, what the one before it was."""
    out: list[Violation] = []
    latest: dict[str, str] = {}  # workload -> its latest attempt
    fence: dict[str, ev.FenceRequested] = {}  # attempt -> its first fence request
    fenced: set[str] = set()
    confirmed: set[str] = set()
    for _, e in events:
        if isinstance(e, ev.FenceRequested):
            fence.setdefault(e.attempt_id, e)
        elif isinstance(e, ev.Fenced):
            fenced.add(e.attempt_id)
        elif isinstance(e, ev.CancelConfirmed):
            confirmed.add(e.attempt_id)
        elif isinstance(e, ev.AttemptCreated):
            before = latest.get(e.workload_id)
            if before == e.attempt_id:
                continue  # a redelivered record of the same attempt
            latest[e.workload_id] = e.attempt_id
            if before is None:
                continue
            req = fence.get(before)
            if before not in fenced:
                out.append(Violation("replacement-after-fence", e.workload_id, f"{e.attempt_id} created while {before} was not fenced: two current attempts"))
            elif req is not None and req.policy == "strict" and not req.stopped and before not in confirmed:
                out.append(Violation("replacement-after-fence", e.workload_id, f"strict: {e.attempt_id} created before {before} was confirmed gone"))
    return out


def _since(snaps: Sequence[ClusterSnapshot], disproves: Callable[[ClusterSnapshot], bool]) -> float | None:
    """When the trailing run of snapshots that satisfy `disproves` began (None: the latest does not)."""
    since: float | None = None
    for snap in reversed(snaps):
        if not disproves(snap):
            break
        since = snap.published_at
    return since


def _disproved(
    decision: RoutingDecision,
    request: ev.RouteRequested | None,
    snapshots: Mapping[str, Sequence[ClusterSnapshot]],
    max_snapshot_age: float,
) -> list[tuple[float, str]]:
    """(since when, what) for every blocker reason of `decision` that inventory disproves now."""
    out: list[tuple[float, str]] = []
    for v in decision.verdicts:
        failed = [c for c in v.checks if not c.ok]
        if v.eligible or not failed or not all(c.capacity_only for c in failed):
            continue  # not a blocker: eligible, or never eligible as specified
        snaps = snapshots.get(v.cluster, ())
        for c in failed:
            if c.code == "CLUSTER_UNREACHABLE":
                since = _since(snaps, lambda s: s.reachable and s.published_at - s.observed_at <= max_snapshot_age)
                if since is not None:
                    out.append((since, f"{v.cluster} {c.code} ({c.message}), but inventory has published it reachable and fresh since {since:.1f}"))
            elif c.code == "CLUSTER_NOT_ALLOWED" and request is not None and v.cluster in request.exclude:
                rr = request
                seen = [s.published_at for s in snaps if s.observed_at > rr.at]
                since = min([*seen, rr.at + max_snapshot_age])
                why = f"observed again after the request (published {min(seen):.1f})" if seen else f"{max_snapshot_age:g}s after the request"
                out.append((since, f"{v.cluster} excluded after the lost attempt, but the exclusion ended: {why}"))
    return out


def check_waits(
    events: Iterable[tuple[int, Event]],
    snapshots: Mapping[str, Sequence[ClusterSnapshot]],
    now: float,
    *,
    tolerance: float = WAIT_TOLERANCE,
    max_snapshot_age: float = MAX_SNAPSHOT_AGE,
) -> list[Violation]:
    """Invariant 5 (see the module doc) at `now`: `snapshots` are each cluster's snapshots in the
    order inventory published them, up to `now` (a cluster's latest alone is enough to see a
    reason disproved, not since when: pass the history to judge the tolerance)."""
    p = Projection()
    asked: dict[tuple[str, int], float] = {}  # (workload, attempt number) -> when a decision was asked for
    requests: dict[tuple[str, int], ev.RouteRequested] = {}
    waiting: dict[tuple[str, int], ev.Unroutable] = {}  # the latest waiting decision per attempt
    for seq, e in events:
        p.apply(e, seq)
        wid = e.workload_id
        if isinstance(e, ev.Submitted):
            asked.setdefault((wid, 1), e.at)
        elif isinstance(e, ev.Released):
            asked[(wid, 1)] = e.at  # admission held it until now: the router is asked from here
        elif isinstance(e, ev.RouteRequested):
            asked.setdefault((wid, e.attempt_number), e.at)
            requests[(wid, e.attempt_number)] = e
        elif isinstance(e, ev.Unroutable):
            waiting[(wid, e.attempt_number)] = e
    out: list[Violation] = []
    for wid, v in p.workloads.items():
        if v.workload is None or v.terminal or v.cancel_requested or v.status == "held":
            continue  # held: waiting for admission, not the router (its holds: `check_limits`)
        n = max(v.route_requested | {1})
        if n in v.routed_attempts:
            continue  # progress: routed; the attempt is the dispatcher's
        t_req = asked.get((wid, n), now)
        if now - t_req <= tolerance:
            continue
        u = waiting.get((wid, n))
        if u is None:
            out.append(Violation("wait-reason-current", wid, f"attempt {n} has had no routing decision for {now - t_req:.1f}s (status {v.status!r})"))
            continue
        for since, what in _disproved(u.decision, requests.get((wid, n)), snapshots, max_snapshot_age):
            if now - since > tolerance:
                out.append(Violation("wait-reason-current", wid, f"still waiting on the decision of {u.at:.1f} ({u.event_id}): {what}, {now - since:.1f}s ago (tolerance {tolerance:g}s)"))
    return out
