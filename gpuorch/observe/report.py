"""The per-destination report (pure: timelines in, figures out; no I/O, no clock).

For each destination cluster, from the attempts that ran there (see `timeline` for the marks):

| figure | definition |
|---|---|
| `queue_delay` | ready -> admitted of each attempt (policy delay + dispatch + admission): p50/p90/p99 |
| `policy_delay`, `admission` | the two parts of it that differ most between destinations: p50/p90/p99 |
| `staging` | admitted -> running (inputs staged, containers started): p50/p90/p99 |
| `completion` | workload submitted -> its result promoted, for results promoted here: p50/p90/p99 |
| `gpu_hours` | GPUs x (pods placed -> Job ended, or -> confirmed gone for lost and fenced attempts), every attempt here |
| `gpu_hours_per_result` | every attempt's GPU-hours here (failed and lost ones included) / results promoted here |
| `failed`, `lost` | attempts that failed / were lost here |
| `retry_overhead` | for each failed or lost attempt here: its ready -> the next attempt's ready (the time the failure cost), and its GPU-hours |
| `cleanup` | orphans removed here (`orphan-deleted`), attempts confirmed gone, and time to confirm (fenced -> confirmed gone): p50/max |

Durations are multiplied by `time_scale` (simulated seconds per real second: the embedded
clusters run faster than real time), so the figures are in the destination's own time.
Percentiles interpolate linearly between the closest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .timeline import AttemptTimeline, WorkloadTimeline

QUANTILES = (0.5, 0.9, 0.99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        **{f"p{round(q * 100)}": percentile(values, q) for q in QUANTILES},
        "max": max(values) if values else None,
    }


@dataclass
class Destination:
    cluster: str
    attempts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    queue_delay: list[float] = field(default_factory=list)
    policy_delay: list[float] = field(default_factory=list)
    admission: list[float] = field(default_factory=list)
    staging: list[float] = field(default_factory=list)
    completion: list[float] = field(default_factory=list)
    gpu_hours: float = 0.0
    results: int = 0
    failed: int = 0
    lost: int = 0
    retry_overhead: list[float] = field(default_factory=list)
    retry_gpu_hours: float = 0.0
    orphans_removed: int = 0
    confirmed_gone: int = 0
    time_to_confirm: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "attempts": self.attempts,
            "outcomes": dict(sorted(self.outcomes.items())),
            "queue_delay_s": summary(self.queue_delay),
            "policy_delay_s": summary(self.policy_delay),
            "admission_s": summary(self.admission),
            "staging_s": summary(self.staging),
            "completion_s": summary(self.completion),
            "results": self.results,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_per_result": self.gpu_hours / self.results if self.results else None,
            "failed_attempts": self.failed,
            "lost_attempts": self.lost,
            "retry_overhead_s": sum(self.retry_overhead),
            "retry_overhead_gpu_hours": self.retry_gpu_hours,
            "cleanup": {
                "orphans_removed": self.orphans_removed,
                "confirmed_gone": self.confirmed_gone,
                "time_to_confirm_s": summary(self.time_to_confirm),
            },
        }


def _gap(a: AttemptTimeline, start: str, end: str) -> float | None:
    s, e = a.marks.get(start), a.marks.get(end)
    return e - s if s is not None and e is not None and e >= s else None


def build_report(
    workloads: Iterable[WorkloadTimeline],
    *,
    since: float | None = None,
    cluster: str | None = None,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """The report over `workloads` (their timelines) submitted at or after `since`, for every
    destination or only `cluster`. Orphans of workloads the log never saw (`orphan-<hash>`) are
    counted where they were removed."""
    k = time_scale
    dests: dict[str, Destination] = {}
    chosen: list[WorkloadTimeline] = []

    def dest(name: str) -> Destination:
        return dests.setdefault(name, Destination(name))

    for w in workloads:
        if w.submitted is None:
            # no accepted submit: the record of a refused message, or of orphans of a workload the
            # log never saw (`orphan-<hash>`): only its orphan deletions count
            for a in w.attempts:
                if a.orphaned and (since is None or (a.gone_at or 0.0) >= since):
                    dest(a.cluster).orphans_removed += 1
            continue
        if since is not None and w.submitted < since:
            continue
        chosen.append(w)
        ordered = sorted(w.attempts, key=lambda a: a.number)
        for i, a in enumerate(ordered):
            d = dest(a.cluster)
            d.attempts += 1
            d.outcomes[a.outcome] = d.outcomes.get(a.outcome, 0) + 1
            for values, (s, e) in (
                (d.queue_delay, ("ready", "admitted")), (d.policy_delay, ("ready", "routed")),
                (d.admission, ("created", "admitted")), (d.staging, ("admitted", "running")),
            ):  # fmt: skip
                g = _gap(a, s, e)
                if g is not None:
                    values.append(g * k)
            hours = a.gpu_seconds() * k / 3600.0
            d.gpu_hours += hours
            if a.outcome == "promoted":
                d.results += 1
                if w.submitted is not None and "promoted" in a.marks:
                    d.completion.append((a.marks["promoted"] - w.submitted) * k)
            failed = a.outcome == "failed"
            lost = a.lost_at is not None
            d.failed += failed
            d.lost += lost
            if failed or lost:
                d.retry_gpu_hours += hours
                nxt = ordered[i + 1] if i + 1 < len(ordered) else None
                if nxt is not None and "ready" in a.marks and "ready" in nxt.marks:
                    d.retry_overhead.append((nxt.marks["ready"] - a.marks["ready"]) * k)
            if a.gone_at is not None:
                d.confirmed_gone += 1
                if a.fenced_at is not None and a.gone_at >= a.fenced_at:
                    d.time_to_confirm.append((a.gone_at - a.fenced_at) * k)
            if a.orphaned:
                d.orphans_removed += 1
    rows = [d for name, d in sorted(dests.items()) if cluster is None or name == cluster]
    total_hours = sum(d.gpu_hours for d in rows)
    results = sum(d.results for d in rows)
    return {
        "time_scale": time_scale,
        "since": since,
        "cluster": cluster,
        "workloads": len(chosen),
        "destinations": [d.as_dict() for d in rows],
        "fleet": {
            "attempts": sum(d.attempts for d in rows),
            "results": results,
            "gpu_hours": total_hours,
            "gpu_hours_per_result": total_hours / results if results else None,
            "failed_attempts": sum(d.failed for d in rows),
            "lost_attempts": sum(d.lost for d in rows),
            "retry_overhead_s": sum(sum(d.retry_overhead) for d in rows),
            "orphans_removed": sum(d.orphans_removed for d in rows),
        },
    }


def render(report: dict[str, Any]) -> str:
    """The report as a table a person reads (`gpuorch report`)."""
    from gpuorch_proto.units import format_duration

    def d(v: float | None) -> str:
        return format_duration(v) if v is not None else "-"

    def q(s: dict[str, Any]) -> str:
        return "-" if not s["n"] else f"{d(s['p50'])}/{d(s['p90'])}/{d(s['p99'])}"

    lines = [f"{report['workloads']} workloads; durations p50/p90/p99 in simulated time (x{report['time_scale']:g})", ""]
    head = ["CLUSTER", "ATTEMPTS", "RESULTS", "QUEUE DELAY", "POLICY", "ADMISSION", "STAGING", "COMPLETION",
            "GPU-H", "GPU-H/RESULT", "FAILED", "LOST", "RETRY COST", "ORPHANS", "CONFIRM p50"]  # fmt: skip
    rows = []
    for x in report["destinations"]:
        per = x["gpu_hours_per_result"]
        rows.append([
            x["cluster"], str(x["attempts"]), str(x["results"]), q(x["queue_delay_s"]), q(x["policy_delay_s"]),
            q(x["admission_s"]), q(x["staging_s"]), q(x["completion_s"]), f"{x['gpu_hours']:.2f}",
            f"{per:.2f}" if per is not None else "-", str(x["failed_attempts"]), str(x["lost_attempts"]),
            d(x["retry_overhead_s"]), str(x["cleanup"]["orphans_removed"]), d(x["cleanup"]["time_to_confirm_s"]["p50"]),
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(widths[i]) for i, h in enumerate(head)))
    lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in rows]
    f = report["fleet"]
    per = f["gpu_hours_per_result"]
    lines += ["", f"fleet: {f['results']} results from {f['attempts']} attempts, {f['gpu_hours']:.2f} GPU-hours"
              f" ({per:.2f} per result)" if per is not None else f"fleet: no results from {f['attempts']} attempts"]  # fmt: skip
    return "\n".join(lines)
