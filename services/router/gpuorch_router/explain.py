"""Human explanation of a routing decision, in the spirit of ``condor_q -better-analyze`` (pure).

``render_explain(decision)`` answers, from the decision record alone:

* routed: why here (the winner's estimate terms, and where its run time came from: learnt runs
  of its class, the declared value, or a default) and, for every other cluster, why not there
  (each failed check, or how its estimate terms compare with the winner's);
* every eligible cluster's queue wait: which shape's wait inventory published it is (or which
  other basis);
* waiting: why still waiting (which capacity-only checks block each cluster, and what would
  unblock them), and which clusters can never run it;
* rejected: every cluster's permanent reasons and what would have to change.

An estimate-terms table is printed for every eligible cluster, best first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from gpuorch_proto.events import PreemptionPlanned
from gpuorch_proto.routing import Check, ClusterVerdict, Estimate, ReasonCode, RoutingDecision
from gpuorch_proto.units import format_duration

#: What would make a failed check pass: (capacity-only hint, permanent hint).
HINTS: Final[Mapping[ReasonCode, tuple[str, str]]] = {
    "CLUSTER_UNREACHABLE": (
        "unblocks when inventory observes the cluster again and publishes a fresh snapshot",
        "unblocks when inventory observes the cluster again",
    ),
    "CLUSTER_NOT_ALLOWED": (
        "unblocks when inventory observes the cluster again after the attempt there was lost "
        "(at the latest once a snapshot from before the loss would be stale)",
        "add the cluster to requirements.clusters",
    ),
    "GPU_MEMORY": ("", "lower resources.gpu_memory_gib, or add nodes with more GPU memory"),
    "GPU_MODEL": ("", "widen resources.accelerators"),
    "GPU_SHAPE": ("", "fewer GPUs per worker, or drop same_node, or larger nodes"),
    "GPU_CAPACITY": (
        "unblocks when enough suitable nodes are Ready again",
        "see the failed node checks above",
    ),
    "CPU_MEMORY": (
        "unblocks when nodes free CPU/memory",
        "lower resources.cpu / resources.memory, or larger nodes",
    ),
    "POOL": ("", "widen requirements.pools"),
    "NODE_SELECTOR": ("", "relax requirements.node_selector"),
    "TAINTS": ("", "add a matching requirements.tolerations entry"),
    "CONNECTIONS": ("", "configure the connection for this cluster in the registry"),
    "CREDENTIALS": ("", "provision the credential on this cluster (registry credentials)"),
    "ARTIFACT_STORE": ("", "choose an output store this cluster reaches (spec.output.store)"),
    "INPUT_DATA": ("", "replicate that dataset version to a location this cluster reaches, or cache it"),
    "CHECKPOINT": ("", "keep checkpoints in a store this cluster can read"),
    "QUEUE_ACCESS": ("", "use a queue open to the owner (spec.queue), or ask for access"),
    "SHARING": ("", "request whole GPUs, or use a cluster that offers the sharing mechanism"),
    "PINNED_ELSEWHERE": ("", "remove spec.queue to let the router choose"),
    "GANG_SPLIT": ("", "fewer workers: a gang never spans clusters"),
    "GPU_SHARED": (
        "",
        "name the sharing mechanism in resources.sharing (time-slicing, mps, or mig with its profile) "
        "to accept a share of a GPU, or use a cluster with whole GPUs",
    ),
}

_TERMS: tuple[tuple[str, str], ...] = (
    ("queue_wait", "queue"),
    ("image_staging", "image"),
    ("data_staging", "data"),
    ("staging_overlap", "hidden"),
    ("startup", "startup"),
    ("run", "run"),
    ("output_transfer", "output"),
    ("resume_saved", "resumed"),
    ("total", "total"),
)


def _d(seconds: float) -> str:
    if seconds <= 0:
        return "0s"
    return format_duration(seconds)


def _signed(seconds: float) -> str:
    return ("+" if seconds > 0 else "-") + _d(abs(seconds))


def _tag(check: Check) -> str:
    return "capacity " if check.capacity_only else "permanent"


def _hint(check: Check) -> str:
    capacity, permanent = HINTS.get(check.code, ("", ""))
    return capacity if check.capacity_only else permanent


def _failed(v: ClusterVerdict) -> list[Check]:
    return [c for c in v.checks if not c.ok]


def _table(eligible: Sequence[ClusterVerdict]) -> list[str]:
    header = ["cluster", *(label for _, label in _TERMS), "cost", "score"]
    rows = [header]
    for v in eligible:
        est = v.estimate
        assert est is not None
        rows.append(
            [v.cluster, *(_d(getattr(est, f)) for f, _ in _TERMS), f"{est.cost:.2f}", f"{est.score:.3f}"]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _compare(est: Estimate, best: Estimate) -> str:
    diffs = []
    for f, label in _TERMS[:-1]:
        delta = getattr(est, f) - getattr(best, f)
        if f == "staging_overlap":
            delta = -delta  # more hidden staging is better
            label = "hidden staging (inverted)"
        elif f == "resume_saved":
            delta = -delta  # more run saved by resuming is better
            label = "work lost by not resuming"
        if abs(delta) >= 1.0:
            diffs.append((abs(delta), f"{label} {_signed(delta)}"))
    diffs.sort(key=lambda x: -x[0])
    parts = ", ".join(text for _, text in diffs) or "same time terms"
    cost = est.cost - best.cost
    if abs(cost) >= 0.005:
        parts += f"; cost {'+' if cost > 0 else '-'}{abs(cost):.2f}"
    return parts


def _checks_lines(v: ClusterVerdict, only_permanent: bool = False) -> list[str]:
    out = []
    for c in _failed(v):
        if only_permanent and c.capacity_only:
            continue
        hint = _hint(c)
        out.append(f"      [{_tag(c)}] {c.code}: {c.message}" + (f"\n          -> {hint}" if hint else ""))
    return out


def render_explain(decision: RoutingDecision) -> str:
    """A multi-line report: why here, why not there, why still waiting / rejected."""
    d = decision
    lines: list[str] = []
    where = f" to {d.cluster}" + (f" (queue {d.queue})" if d.queue else "") if d.cluster else ""
    lines.append(f"Workload {d.workload_id}: {d.outcome.upper()}{where}, decided at {d.decided_at:.0f}")
    lines.append(f"  {d.summary}")
    eligible = sorted(
        (v for v in d.verdicts if v.eligible and v.estimate is not None),
        key=lambda v: (v.estimate.score if v.estimate else 0.0, v.cluster),
    )
    ineligible = [v for v in d.verdicts if not v.eligible]
    lines.append("")
    lines.append(
        f"{len(d.verdicts)} clusters considered: {len(eligible)} eligible, {len(ineligible)} ineligible"
    )

    if eligible:
        lines.append("")
        lines.append(
            "Estimated time to result, eligible clusters, best first (hidden = staging behind the queue):"
        )
        lines.extend(_table(eligible))

    if d.outcome == "routed":
        winner = next((v for v in d.verdicts if v.cluster == d.cluster), None)
        lines.append("")
        lines.append(f"Why {d.cluster}:")
        if winner is not None and winner.estimate is not None:
            est = winner.estimate
            passed = sum(1 for c in winner.checks if c.ok)
            lines.append(f"  passes all {passed} eligibility checks; lowest score {est.score:.3f}")
            lines.append(
                f"  {_d(est.total)} to result = queue {_d(est.queue_wait)} + staging "
                f"{_d(est.image_staging + est.data_staging)} (of which {_d(est.staging_overlap)} hidden) "
                f"+ startup {_d(est.startup)} + run {_d(est.run)} + output {_d(est.output_transfer)}; "
                f"cost {est.cost:.2f}"
            )
            if est.run_source:  # where the run term came from (learnt runs, declared, default)
                on = f" on {est.gpu_model}" if est.gpu_model else ""
                lines.append(f"  run {_d(est.run)}{on}: {est.run_source}")
            for c in winner.checks:
                if c.code in ("INPUT_DATA", "QUEUE_ACCESS", "GPU_CAPACITY") and c.ok:
                    lines.append(f"  {c.code}: {c.message}")
        others = [v for v in d.verdicts if v.cluster != d.cluster]
        if others:
            lines.append("")
            lines.append("Why not there:")
            best = winner.estimate if winner is not None else None
            for v in others:
                if v.eligible and v.estimate is not None and best is not None:
                    lines.append(
                        f"  {v.cluster}: eligible but slower or dearer: {_d(v.estimate.total)} vs "
                        f"{_d(best.total)}, score {v.estimate.score:.3f} vs {best.score:.3f} "
                        f"({_compare(v.estimate, best)})"
                    )
                else:
                    lines.append(f"  {v.cluster}: ineligible")
                    lines.extend(_checks_lines(v))
    elif d.outcome == "waiting":
        blocked = [v for v in ineligible if all(c.ok or c.capacity_only for c in v.checks)]
        never = [v for v in ineligible if v not in blocked]
        lines.append("")
        lines.append(
            "Why still waiting (nothing eligible now; these clusters fail only capacity-only checks):"
        )
        for v in blocked:
            lines.append(f"  {v.cluster}:")
            lines.extend(_checks_lines(v))
        lines.append(
            "  The router re-evaluates when inventory publishes new snapshots, and publishes a new"
            " decision when these reasons change."
        )
        if never:
            lines.append("")
            lines.append("Never eligible as specified:")
            for v in never:
                lines.append(f"  {v.cluster}:")
                lines.extend(_checks_lines(v, only_permanent=True))
    else:
        lines.append("")
        lines.append("Why rejected (every cluster fails a permanent check; waiting would not help):")
        for v in ineligible:
            lines.append(f"  {v.cluster}:")
            lines.extend(_checks_lines(v))
    based = [(v.cluster, v.estimate.queue_basis) for v in eligible if v.estimate is not None and v.estimate.queue_basis]
    if based:
        lines.append("")
        lines.append("Queue waits used (inventory's estimates; for the gang's shape where published):")
        lines.extend(f"  {cluster}: {basis}" for cluster, basis in based)
    return "\n".join(lines) + "\n"


def render_waits(planned: PreemptionPlanned | None) -> list[str]:
    """Who a waiting workload waits for (its latest `preemption-planned`): one line per attempt
    holding the GPUs it could use, saying whether it is preempted for it and why (not)."""
    if planned is None or not planned.waits:
        return []
    return ["Who it waits for:", *(f"  {w.message}" for w in planned.waits), f"  {planned.reason}"]
