"""PNG plots of a comparison: JCT distributions per policy, load per cluster over time, a what-if (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .engine import RunResult
from .whatif import METRICS, Delta


def _agg(series: Sequence[float], per: int) -> list[float]:
    return [sum(series[i:i + per]) for i in range(0, len(series), per)]


def write_plots(results: Sequence[RunResult], out: Path, *, hours_per_point: int = 6) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        jct = sorted(j.jct / 3600 for j in r.jobs if not j.never)
        if not jct:
            continue
        n = len(jct)
        ax.step(jct, [(k + 1) / n for k in range(n)], where="post", label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT distribution per policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    files.append(out / "jct-cdf.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    rows = len(results)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.2 * rows + 0.6), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        for name in r.clusters:
            series = _agg(r.load.get(name, []), hours_per_point)
            cap = r.capacity.get(name, 0) * r.bucket * hours_per_point
            if not series or cap <= 0:
                continue
            days = [(k + 0.5) * hours_per_point / 24 for k in range(len(series))]
            ax.plot(days, [s / cap for s in series], linewidth=0.8, label=name)
        ax.set_ylabel("busy GPUs")
        ax.set_ylim(0, 1.05)
        ax.set_title(r.policy, fontsize=9, loc="left")
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(ncol=5, fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.15))
    axes[-1, 0].set_xlabel(f"day of trace ({hours_per_point} h means; fraction of each cluster's GPUs busy)")
    fig.tight_layout()
    files.append(out / "load-per-cluster.png")
    fig.savefig(files[-1], dpi=100)
    plt.close(fig)
    return files


def write_whatif_plot(baseline: Sequence[RunResult], what_if: Sequence[RunResult], deltas: Sequence[Delta], out: Path, *,
                      title: str = "") -> Path:
    """`whatif.png`: the JCT distribution per policy on both fleets (baseline dashed, what-if solid),
    and each policy's change in per cent of its baseline (`whatif.diff`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1.1, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (b, w) in enumerate(zip(baseline, what_if, strict=True)):
        for r, style, tag in ((b, "--", "baseline"), (w, "-", "what-if")):
            jct = sorted(j.jct / 3600 for j in r.jobs if not j.never)
            if jct:
                n = len(jct)
                left.step(jct, [(i + 1) / n for i in range(n)], where="post", linestyle=style, linewidth=1.0,
                          color=colors[k % len(colors)], label=f"{r.policy} ({tag})")
    left.set_xscale("log")
    left.set_xlabel("job completion time (hours, log)")
    left.set_ylabel("fraction of jobs")
    left.set_title("JCT per policy: baseline dashed, what-if solid", fontsize=10)
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, ncol=2)

    shown = ("jct_mean_h", "jct_p95_h", "jct_p99_h", "wait_mean_h", "utilization_pct")
    label = dict(METRICS)
    policies = list(dict.fromkeys(d.policy for d in deltas))
    by = {(d.policy, d.metric): d for d in deltas}
    height = 0.8 / len(shown)
    for m, metric in enumerate(shown):
        ys = [p + (m - (len(shown) - 1) / 2) * height for p in range(len(policies))]
        xs = [by[(p, metric)].delta_pct or 0.0 for p in policies]
        right.barh(ys, xs, height=height, label=label[metric], color=colors[m % len(colors)])
    right.set_yticks(range(len(policies)), policies)
    right.invert_yaxis()
    right.axvline(0, color="black", linewidth=0.8)
    right.set_xlabel("what-if vs baseline (%)")
    right.set_title("change per policy", fontsize=10)
    right.grid(True, axis="x", alpha=0.3)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=len(shown))
    if title:
        fig.suptitle(f"what-if: {title}", fontsize=11)
    fig.tight_layout()
    path = out / "whatif.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
