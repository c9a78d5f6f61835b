"""Timelines and the per-destination report, computed from a hand-made event log (no broker)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuorch.observe import plots
from gpuorch.observe.report import build_report, percentile, render
from gpuorch.observe.timeline import timelines
from tests.observe.builders import scenario


def test_every_mark_and_named_gap_of_a_clean_attempt() -> None:
    t = timelines(scenario().events)["clean"]
    (a,) = t.attempts
    assert a.marks == {"ready": 0.0, "routed": 1.0, "created": 2.0, "admitted": 5.0, "running": 7.0,
                       "compute-started": 8.0, "finished": 20.0, "promoted": 21.0}  # fmt: skip
    assert [(g.name, g.seconds) for g in a.gaps] == [
        ("policy delay", 1.0), ("dispatch", 1.0), ("admission", 3.0), ("staging", 2.0),
        ("startup", 1.0), ("run", 12.0), ("output", 1.0),
    ]  # fmt: skip
    assert a.outcome == "promoted"
    assert a.gpu_seconds() == pytest.approx(2 * (20.0 - 5.0))


def test_a_replacement_is_ready_when_it_was_requested_and_a_missing_mark_merges_gaps() -> None:
    t = timelines(scenario().events)["retried"]
    first, second = t.attempts
    assert first.outcome == "failed" and second.outcome == "promoted"
    assert second.marks["ready"] == 13.0 and second.marks["routed"] == 14.0
    # the failed attempt never reported compute: its run is counted from `running`
    assert [(g.name, g.seconds) for g in first.gaps][-1] == ("run", 4.0)
    assert sum(g.seconds for g in first.gaps) == first.marks["finished"] - first.marks["ready"]


def test_report_figures_per_destination() -> None:
    tl = list(timelines(scenario().events).values())
    r = build_report(tl, time_scale=1.0)
    by = {d["cluster"]: d for d in r["destinations"]}
    alpha, beta = by["alpha"], by["beta"]
    assert alpha["attempts"] == 3 and beta["attempts"] == 2
    assert alpha["results"] == 1 and beta["results"] == 2
    assert alpha["failed_attempts"] == 1 and alpha["lost_attempts"] == 1
    # queue delay = ready -> admitted
    assert alpha["queue_delay_s"]["n"] == 3
    assert alpha["queue_delay_s"]["p50"] == pytest.approx(np.percentile([5.0, 4.0, 3.0], 50))
    assert alpha["queue_delay_s"]["p90"] == pytest.approx(np.percentile([5.0, 4.0, 3.0], 90))
    assert beta["queue_delay_s"]["p99"] == pytest.approx(np.percentile([3.0, 3.0], 99))
    assert alpha["staging_s"]["p50"] == pytest.approx(np.percentile([2.0, 2.0, 1.0], 50))
    assert beta["completion_s"]["p50"] == pytest.approx(np.percentile([31.0, 25.0], 50))
    # GPU-hours: clean 2 GPUs x 15 s; retried a1 4 x 6 s; lost a1 2 x (4 -> 40 s, until its Job was collected)
    alpha_s = 2 * 15.0 + 4 * 6.0 + 2 * 36.0
    assert alpha["gpu_hours"] == pytest.approx(alpha_s / 3600)
    assert alpha["gpu_hours_per_result"] == pytest.approx(alpha_s / 3600 / 1)
    assert alpha["retry_overhead_gpu_hours"] == pytest.approx((4 * 6.0 + 2 * 36.0) / 3600)
    # the failure cost: ready of the failed attempt -> ready of its replacement
    assert alpha["retry_overhead_s"] == pytest.approx((13.0 - 0.0) + (11.0 - 1.0))
    # cleanup: the lost attempt's Job and the unknown workload's Job were collected
    assert alpha["cleanup"]["orphans_removed"] == 2
    assert alpha["cleanup"]["confirmed_gone"] == 2
    assert alpha["cleanup"]["time_to_confirm_s"]["max"] == pytest.approx(40.0 - 10.5)
    assert r["fleet"]["results"] == 3 and r["fleet"]["lost_attempts"] == 1
    assert "alpha" in render(r)


def test_since_cluster_and_time_scale() -> None:
    tl = list(timelines(scenario().events).values())
    r = build_report(tl, since=0.5, cluster="beta", time_scale=600.0)
    assert r["workloads"] == 1  # only "lost" was submitted after 0.5
    (beta,) = r["destinations"]
    assert beta["cluster"] == "beta"
    assert beta["completion_s"]["p50"] == pytest.approx((26.0 - 1.0) * 600)


def test_percentile_interpolates() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(np.percentile([1, 2, 3, 4], 90))


def test_charts_are_pngs(tmp_path: Path) -> None:
    tl = list(timelines(scenario().events).values())
    paths = plots.render_all(build_report(tl, time_scale=600.0), tl, tmp_path)
    assert [p.name for p in paths] == ["queue-delay.png", "gantt.png", "gpu-hours.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
