"""The routing decision (DESIGN §5.3): verdicts of every cluster, the outcome, the record (reference).

:func:`route` is the plain reference implementation of the whole policy: parse the demand once,
then for every cluster (in name order) its checks (:func:`eligibility`), freshness at ``now``, an
estimate when eligible, and its verdict; then :func:`decide`. No memoisation anywhere. The fast
path (:mod:`gpuorch_router.fastpath`) re-implements none of it: it calls :func:`eligibility` with
cached :class:`Parts`, :func:`evaluate`, :func:`standing`, :func:`ineligible_verdict` and
:func:`decide`, and caches their results; property tests say its records equal these.

Outcome: ``routed`` to the lowest (score, name); else ``waiting`` when some candidate fails only
capacity-only checks; else ``rejected`` with every candidate's permanent reasons. A pinned target
(``spec.queue = "<cluster>/<queue>"``) is the only candidate: never a silent fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.placement import placement_for
from gpuorch_proto.resume import CheckpointRef, ResumeVerdict
from gpuorch_proto.routing import Check, ClusterVerdict, Estimate, RoutingDecision
from gpuorch_proto.workload import Workload

from .checks import (
    EXCLUDED,
    NodeParts,
    Staging,
    cluster_allowed,
    data_staging,
    dur,
    fail,
    freshness,
    node_checks,
    registry_checks,
    resume_verdict,
)
from .demand import Demand, parse_demand
from .estimate import Elig, build_terms, estimate, placement_terms
from .history import RoutingHistory
from .index import NodeClass, SnapshotIndex

__all__ = [
    "PARTS",
    "Evaluation",
    "Parts",
    "Snapshots",
    "best_two",
    "decide",
    "eligibility",
    "evaluate",
    "ineligible_verdict",
    "is_stale",
    "pin_verdicts",
    "reasons",
    "route",
    "shown_age",
    "standing",
]

Snapshots = Mapping[str, ClusterSnapshot | SnapshotIndex]

#: Registry part: data staging, the resume verdict, the registry checks, the owner's queues.
RegistryPart = tuple[Staging, ResumeVerdict | None, tuple[Check, ...], tuple[str, ...]]
#: Placement part: queue wait, queue, GPU model assumed, pools of the suitable nodes, is that model
#: the only suitable one, what the wait is (`estimate.placement_terms`).
PlacementPart = tuple[float, str, str | None, frozenset[str], bool, str]


@dataclass(slots=True, eq=False)
class Evaluation:
    """One cluster for one demand: its checks and, when they pass, its estimate."""

    elig: Elig
    estimate: Estimate | None = None
    score: float = 0.0  # estimate.score
    queue: str | None = None


Candidate = tuple[float, str, Evaluation]  # (score, cluster, evaluation) of an eligible cluster


class Parts(NodeParts):
    """Every part of a cluster's eligibility that reads only some demand fields, computed here.

    :func:`eligibility` composes them: the one composition of the checks. The fast path
    (``fastpath._Cached``) overrides each part to look it up by the fields it reads, so a
    memoised cluster's checks are this composition's by construction.
    """

    __slots__ = ()

    def registry(self, idx: SnapshotIndex, d: Demand) -> RegistryPart:
        """Data staging, the resume verdict, then the registry checks (which read both)."""
        staging = data_staging(idx, d)
        resume = resume_verdict(idx, d)
        reg_list, queues = registry_checks(idx, d, staging, resume)
        return staging, resume, tuple(reg_list), tuple(queues)

    def placed(
        self, idx: SnapshotIndex, d: Demand, suitable: Sequence[NodeClass], queues: tuple[str, ...]
    ) -> PlacementPart:
        """Where an eligible cluster would place it (`estimate.placement_terms`)."""
        return placement_terms(idx, d, suitable, queues)


#: The parts computed afresh (the reference).
PARTS: Final = Parts()


def eligibility(idx: SnapshotIndex, d: Demand, parts: Parts = PARTS, make: type[Elig] = Elig) -> Elig:
    """Every check but freshness, in the verdict's order, with what the estimate needs.

    `parts` gives the parts (the fast path passes its cached ones), `make` the record type (the
    fast path's keeps the verdicts built from it)."""
    checks: list[Check] = [cluster_allowed(idx, d)]
    node_list, suitable = node_checks(idx, d, parts)
    checks.extend(node_list)
    staging, resume, reg_list, queues = parts.registry(idx, d)
    checks.extend(reg_list)
    elig = make(checks=checks, ok=all(c.ok for c in checks), staging=staging, resume=resume)
    if elig.ok:
        (elig.queue_wait, elig.queue, elig.product, elig.pools, elig.only_model, elig.queue_basis) = parts.placed(
            idx, d, suitable, queues
        )
        # what the checks accepted, as the Job's constraints: the products are this cluster's own
        elig.placement = placement_for(d.resources, d.requirements, (c.product for c in idx.classes))
    return elig


def evaluate(
    idx: SnapshotIndex,
    d: Demand,
    elig: Elig | None = None,
    speed: float | None = None,
    make: type[Evaluation] = Evaluation,
) -> Evaluation:
    """The cluster's checks (`elig`, or :func:`eligibility`) and, when they pass, its estimate
    (`speed`: the GPU model's relative speed, when the caller has it)."""
    elig = eligibility(idx, d) if elig is None else elig
    ev = make(elig=elig)
    if elig.ok:
        ev.estimate = estimate(idx, d, elig, speed)
        ev.score = ev.estimate.score
        ev.queue = elig.queue or None
    return ev


def shown_age(now: float, observed_at: float) -> float:
    """The age a verdict shows: whole seconds, rounded up (a shown age within the limit is fresh)."""
    age = now - observed_at
    return float(math.ceil(age)) if age > 0 else 0.0


def standing(ok: bool, reachable: bool, age: float, excluded: bool, max_age: float) -> tuple[bool, bool]:
    """(stale, eligible) of a cluster whose checks gave `ok`, its snapshot `age` seconds old.

    Stale: its cluster unreachable, or observed more than `max_age` seconds ago (CLUSTER_UNREACHABLE
    fails, capacity-only; :func:`checks.freshness` words it). Eligible: its checks pass, it is not
    stale and the caller does not exclude it for now. The rule of every verdict (the reference's
    and the fast path's), here only."""
    stale = not reachable or age > max_age
    return stale, ok and not stale and not excluded


def is_stale(reachable: bool, age: float, max_age: float) -> bool:
    """Whether a snapshot `age` seconds old is stale (:func:`standing`)."""
    return standing(True, reachable, age, False, max_age)[0]


def ineligible_verdict(
    name: str, shown: float, fresh: Check, checks: Sequence[Check], excluded: bool
) -> ClusterVerdict:
    """The verdict of a cluster that may not run it now: failed checks, a stale or unreachable
    snapshot (`fresh`, listed first), or excluded for now (its CLUSTER_NOT_ALLOWED, right after
    freshness, then says so). No estimate: shared by every workload with these checks."""
    listed = [fresh, *checks]
    if excluded:
        listed[1] = EXCLUDED
    return ClusterVerdict(cluster=name, eligible=False, checks=listed, snapshot_age=shown)


def verdict(
    name: str, idx: SnapshotIndex, ev: Evaluation, now: float, excluded: bool, max_age: float
) -> tuple[ClusterVerdict, bool]:
    """The cluster's verdict at `now`, and whether it is eligible."""
    shown = shown_age(now, idx.observed_at)
    stale, eligible = standing(ev.elig.ok, idx.reachable, now - idx.observed_at, excluded, max_age)
    fresh = freshness(idx, shown, stale, max_age)
    if eligible:
        v = ClusterVerdict(
            cluster=name, eligible=True, checks=[fresh, *ev.elig.checks], estimate=ev.estimate, snapshot_age=shown
        )
        return v, True
    return ineligible_verdict(name, shown, fresh, ev.elig.checks, excluded), False


def pin_verdicts(d: Demand, names: Collection[str], known: Collection[str]) -> dict[str, ClusterVerdict]:
    """Verdicts of a pinned workload's other clusters, and of a pinned cluster never published."""
    assert d.pin is not None
    pinned = d.pin[0]
    out: dict[str, ClusterVerdict] = {}
    pin_check = fail("PINNED_ELSEWHERE", f"spec.queue pins {d.pin[0]}/{d.pin[1]}")
    for name in names:
        if name != pinned:
            out[name] = ClusterVerdict(cluster=name, eligible=False, checks=[pin_check])
    if pinned not in names:
        clusters = ", ".join(sorted(known)) or "none"
        out[pinned] = ClusterVerdict(
            cluster=pinned,
            eligible=False,
            checks=[
                fail(
                    "CLUSTER_UNREACHABLE",
                    f"no snapshot of pinned cluster {pinned!r} (clusters known: {clusters})",
                    capacity_only=True,
                )
            ],
        )
    return out


def route(
    workload: Workload,
    workload_id: str,
    snapshots: Snapshots,
    now: float,
    *,
    history: RoutingHistory | None = None,
    exclude: Collection[str] = (),
    max_snapshot_age: float = 120.0,
    resume: CheckpointRef | None = None,
) -> RoutingDecision:
    """Decide where `workload` runs, from each cluster's latest snapshot (or its index), at `now`.

    `exclude` names clusters the caller rules out for now (e.g. where an attempt was just lost);
    that is capacity-only. `resume` is the workload's latest valid checkpoint (a replacement's
    ``route-requested`` carries it): a cluster that can resume it is preferred. Expects a workload
    that passed ``validate_workload``.
    """
    d = parse_demand(workload, history, resume)
    indexes = {n: s if isinstance(s, SnapshotIndex) else SnapshotIndex(s) for n, s in snapshots.items()}
    ex = frozenset(exclude)
    names = sorted(indexes)
    pinned = pin_verdicts(d, names, indexes) if d.pin is not None else {}
    verdicts: list[ClusterVerdict] = []
    eligible: list[Candidate] = []
    for name in sorted({*names, *pinned}):
        if name in pinned:
            verdicts.append(pinned[name])
            continue
        idx = indexes[name]
        ev = evaluate(idx, d)
        v, is_eligible = verdict(name, idx, ev, now, name in ex, max_snapshot_age)
        verdicts.append(v)
        if is_eligible:
            eligible.append((ev.score, name, ev))
    return decide(d, workload_id, now, verdicts, eligible)


def best_two(eligible: list[Candidate]) -> tuple[Candidate, Candidate | None]:
    """The smallest and second smallest (score, name) entries; names are unique."""
    scores = [e[0] for e in eligible]
    total = sum(scores)
    if total != total:  # a NaN score: compare exactly as tuples do
        first = min(eligible, key=lambda e: (e[0], e[1]))
        rest = [e for e in eligible if e is not first]
        return first, (min(rest, key=lambda e: (e[0], e[1])) if rest else None)
    low = min(scores)
    if scores.count(low) > 1:  # rare: equal scores, the name breaks the tie
        tied = sorted((e for e in eligible if e[0] == low), key=lambda e: e[1])
        return tied[0], tied[1]
    i = scores.index(low)
    first = eligible[i]
    if len(eligible) == 1:
        return first, None
    scores[i] = math.inf
    low2 = min(scores)
    if scores.count(low2) > 1:
        return first, min((e for e in eligible if e[0] == low2 and e is not first), key=lambda e: e[1])
    return first, eligible[scores.index(low2)]


def reasons(v: ClusterVerdict, *, permanent_only: bool = False) -> str:
    """Failed checks as one line, leaving out GPU_CAPACITY when it only echoes an earlier failure."""
    failed = [c for c in v.checks if not c.ok and not (permanent_only and c.capacity_only)]
    if len(failed) > 1:
        failed = [c for c in failed if not (c.code == "GPU_CAPACITY" and not c.capacity_only)] or failed
    return ", ".join(f"{c.code}: {c.message}" for c in failed)


def _terms(ev: Evaluation, d: Demand) -> str:
    assert ev.estimate is not None
    return build_terms(ev.estimate, ev.elig, d)


def decide(
    d: Demand,
    workload_id: str,
    now: float,
    verdicts: list[ClusterVerdict],
    eligible: list[Candidate],
    terms: Callable[[Evaluation, Demand], str] = _terms,
) -> RoutingDecision:
    """The outcome from the verdicts (in name order) and the eligible candidates; `terms` words
    an estimate for the summary (the fast path passes one that remembers it)."""
    if eligible:
        first, runner_up = best_two(eligible)  # by (score, name): ties break by name
        _, best, ev = first
        assert ev.estimate is not None
        summary = f"{best}: {dur(ev.estimate.total)} to result ({terms(ev, d)})"
        if d.pin is not None:
            summary = f"pinned to {d.pin[0]}/{d.pin[1]}; {summary}"
        if runner_up is not None:
            _, second, ev2 = runner_up
            assert ev2.estimate is not None
            summary += f" vs {second} {dur(ev2.estimate.total)} ({terms(ev2, d)})"
            if len(eligible) > 2:
                summary += f" and {len(eligible) - 2} more"
        ineligible = len(verdicts) - len(eligible)
        if ineligible:
            summary += f"; {ineligible} ineligible"
        return RoutingDecision(
            workload_id=workload_id,
            decided_at=now,
            outcome="routed",
            cluster=best,
            queue=ev.queue,
            summary=summary,
            verdicts=verdicts,
            placement=ev.elig.placement,
        )
    candidates = [v for v in verdicts if not any(c.code == "PINNED_ELSEWHERE" for c in v.checks)]
    waiting = [v for v in candidates if all(c.ok or c.capacity_only for c in v.checks)]
    if waiting:
        permanent = len(candidates) - len(waiting)
        pin = f"pinned to {d.pin[0]}/{d.pin[1]}; " if d.pin is not None else ""
        summary = f"waiting: {pin}" + "; ".join(f"{v.cluster}: {reasons(v)}" for v in waiting)
        if permanent:
            summary += f"; {permanent} more permanently ineligible"
        return RoutingDecision(
            workload_id=workload_id, decided_at=now, outcome="waiting", summary=summary, verdicts=verdicts
        )
    if d.pin is not None:
        head = f"rejected: pinned target {d.pin[0]}/{d.pin[1]} is ineligible: "
    elif candidates:
        head = "rejected: no cluster can run this: "
    else:
        head = "rejected: no clusters known"
    return RoutingDecision(
        workload_id=workload_id,
        decided_at=now,
        outcome="rejected",
        summary=head + "; ".join(f"{v.cluster}: {reasons(v, permanent_only=True)}" for v in candidates),
        verdicts=verdicts,
    )
