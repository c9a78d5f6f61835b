"""The report's charts as PNG (matplotlib, Agg backend: no display needed).

- `queue-delay.png`: the distribution of queue delay (ready -> admitted) per destination;
- `gantt.png`: every workload's attempts on one time axis, each split into its phases;
- `gpu-hours.png`: GPU-hours per promoted result by destination, split into the attempts that
  produced a result and the failed or lost ones that did not;
- `activity.png` (when the report has its `activity` part, docs/activity.md): allocated vs active
  GPU-hours per destination, owner and pipeline stage, each bar labelled with its activity and
  its useful throughput.

`render_all(report, timelines, out_dir)` writes the files and returns their paths;
`render_png(name, ...)` returns one chart's bytes (the web view serves them).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .timeline import GAPS, WorkloadTimeline

CHARTS = ("queue-delay", "gantt", "gpu-hours")
PHASE_COLORS = {
    "policy delay": "#9e9e9e", "dispatch": "#bdbdbd", "admission": "#ffb74d", "staging": "#4fc3f7",
    "startup": "#ba68c8", "run": "#66bb6a", "output": "#1e88e5",
}  # fmt: skip
OUTCOME_EDGE = {"failed": "#d32f2f", "lost": "#6d4c41", "promotion-rejected": "#d32f2f"}


def _minutes(seconds: float, scale: float) -> float:
    return seconds * scale / 60.0


def queue_delay(report: dict[str, Any], timelines: Sequence[WorkloadTimeline]) -> Figure:
    scale = float(report.get("time_scale") or 1.0)
    wanted = {d["cluster"] for d in report["destinations"]}
    per: dict[str, list[float]] = {c: [] for c in sorted(wanted)}
    for w in timelines:
        for a in w.attempts:
            r, ad = a.marks.get("ready"), a.marks.get("admitted")
            if a.cluster in per and r is not None and ad is not None and ad >= r:
                per[a.cluster].append(_minutes(ad - r, scale))
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    names = [c for c in per if per[c]] or list(per)
    data = [per[c] or [0.0] for c in names]
    if names:
        ax.boxplot(data, orientation="horizontal", tick_labels=names, widths=0.5, showfliers=False)
        for i, values in enumerate(data, start=1):
            ax.scatter(values, [i] * len(values), s=18, alpha=0.7, zorder=3)
    ax.set_xlabel("queue delay, ready -> admitted (simulated minutes)")
    ax.set_title("Queue delay per destination")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def gantt(report: dict[str, Any], timelines: Sequence[WorkloadTimeline]) -> Figure:
    scale = float(report.get("time_scale") or 1.0)
    rows = [w for w in timelines if w.submitted is not None and w.attempts]
    rows.sort(key=lambda w: w.submitted or 0.0)
    t0 = min((w.submitted or 0.0 for w in rows), default=0.0)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.45 * len(rows) + 1.4)), dpi=100)
    labels: list[str] = []
    for y, w in enumerate(rows):
        labels.append(w.workload_id[:28])
        n = max(len(w.attempts), 1)
        h = 0.8 / n
        for j, a in enumerate(sorted(w.attempts, key=lambda x: x.number)):
            yy = y - 0.4 + j * h
            for g in a.gaps:
                ax.broken_barh([(_minutes(g.start - t0, scale), _minutes(g.seconds, scale))], (yy, h * 0.9),
                               facecolors=PHASE_COLORS.get(g.name, "#777"),
                               edgecolors=OUTCOME_EDGE.get(a.outcome, "none"), linewidth=1.2)  # fmt: skip
            if a.gaps:
                end = a.gaps[-1].end
                ax.text(_minutes(end - t0, scale), yy + h * 0.45, f" {a.cluster} ({a.outcome})", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("simulated minutes since the first submit")
    ax.set_title("Workloads and their phases (one bar per attempt)")
    ax.legend(handles=[Patch(color=PHASE_COLORS[name], label=name) for name, _ in GAPS],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(GAPS), fontsize=7, frameon=False)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def gpu_hours(report: dict[str, Any], timelines: Sequence[WorkloadTimeline]) -> Figure:
    dests = report["destinations"]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    names = [d["cluster"] for d in dests]
    useful = [(d["gpu_hours"] - d["retry_overhead_gpu_hours"]) / d["results"] if d["results"] else 0.0 for d in dests]
    wasted = [d["retry_overhead_gpu_hours"] / d["results"] if d["results"] else d["retry_overhead_gpu_hours"] for d in dests]
    ax.bar(names, useful, color="#66bb6a", label="attempts that produced results")
    ax.bar(names, wasted, bottom=useful, color="#d32f2f", label="failed and lost attempts")
    for i, d in enumerate(dests):
        per = d["gpu_hours_per_result"]
        ax.text(i, useful[i] + wasted[i], f"{per:.2f}" if per is not None else "no result", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("GPU-hours per promoted result")
    ax.set_title("GPU-hours per result by destination")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


ACTIVITY_CHART = "activity"
ACTIVITY_BARS = 12  # bars per panel: the groups with the most allocated GPU-hours


def activity(report: dict[str, Any], timelines: Sequence[WorkloadTimeline]) -> Figure:
    """Allocated vs active GPU-hours per destination, owner and stage (`report["activity"]`, from
    `gpuorch.observe.activity.report`): the grey bar is allocated, the green one active (allocated x
    the devices' mean activity); a hatched end is allocation whose activity is unknown."""
    act = report["activity"]
    panels = [("destination", act["by_destination"]), ("owner", act["by_owner"]), ("stage", act["by_stage"])]
    rows = max(1, *(min(len(gs), ACTIVITY_BARS) for _, gs in panels))
    fig, axes = plt.subplots(1, 3, figsize=(13, max(2.6, 0.42 * rows + 1.6)), dpi=100)
    for ax, (by, groups) in zip(axes, panels, strict=True):
        gs = sorted(groups, key=lambda g: (-g["allocated_gpu_hours"], g["key"]))[:ACTIVITY_BARS]
        names = [str(g["key"]) for g in gs]
        allocated = [g["allocated_gpu_hours"] for g in gs]
        known = [g["activity_known_gpu_hours"] for g in gs]
        active = [g["active_gpu_hours"] or 0.0 for g in gs]
        y = range(len(gs))
        ax.barh(y, known, color="#cfd8dc", label="allocated")
        ax.barh(y, [a - k for a, k in zip(allocated, known, strict=True)], left=known, color="#eceff1", hatch="//",
                edgecolor="#90a4ae", label="allocated, activity unknown")  # fmt: skip
        ax.barh(y, active, height=0.5, color="#43a047", label="active")
        for i, g in enumerate(gs):
            what = "activity unknown" if g["activity"] is None else f"{100 * g['activity']:.0f}% active"
            if g["steps_per_hour"]:
                what += f", {g['steps_per_hour']:.0f} steps/h"
            ax.text(allocated[i], i, f" {what}", va="center", fontsize=7)
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(allocated, default=1.0) * 1.6 or 1.0)
        ax.set_title(f"by {by}", fontsize=10)
        ax.set_xlabel("GPU-hours (clusters' time)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Allocated vs active GPU-hours")
    fig.tight_layout()
    return fig


_DRAW = {"queue-delay": queue_delay, "gantt": gantt, "gpu-hours": gpu_hours, ACTIVITY_CHART: activity}


def render_png(name: str, report: dict[str, Any], timelines: Sequence[WorkloadTimeline]) -> bytes:
    fig = _DRAW[name](report, timelines)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def render_all(report: dict[str, Any], timelines: Sequence[WorkloadTimeline], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (*CHARTS, *((ACTIVITY_CHART,) if "activity" in report else ())):
        p = out_dir / f"{name}.png"
        p.write_bytes(render_png(name, report, timelines))
        paths.append(p)
    return paths
