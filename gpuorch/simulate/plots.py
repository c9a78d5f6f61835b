"""PNG plots of a comparison: JCT distributions per policy, load per cluster over time (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .engine import RunResult


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
