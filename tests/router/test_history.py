"""Learning from measured timelines: overlap, run time, output transfer; and their effect on routing."""

from __future__ import annotations

from typing import Any

import pytest

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_router.history import (
    MeasuredTimeline,
    RoutingHistory,
    measured_overlap,
    update_history,
)
from gpuorch_router.policy import route
from tests.support.builders import (
    A100_80,
    H100_80,
    NOW,
    make_input,
    make_nodes,
    make_queue,
    make_snapshot,
    make_workload,
    snapshots,
)

H = 3600.0


def timeline(**kw: Any) -> MeasuredTimeline:
    base: dict[str, Any] = {
        "cluster": "spare",
        "workload_key": "resnet",
        "gpu_product": A100_80,
        "routed_at": 0.0,
        "admitted_at": 2 * H,
        "staging_started_at": 0.0,
        "staging_finished_at": 1 * H,
        "compute_started_at": 2 * H,
        "finished_at": 3 * H,
        "promoted_at": 3 * H + 120,
    }
    base.update(kw)
    return MeasuredTimeline(**base)


@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        pytest.param({}, 1.0, id="staging entirely inside the queue wait is fully hidden"),
        pytest.param(
            {"staging_started_at": 2 * H, "staging_finished_at": 3 * H, "compute_started_at": 3 * H},
            0.0,
            id="staging after admission is not hidden",
        ),
        pytest.param(
            {"staging_started_at": 1 * H, "staging_finished_at": 3 * H},
            0.5,
            id="half the copy ran while queued",
        ),
        pytest.param({"staging_finished_at": 0.0}, None, id="zero-length staging measures nothing"),
        pytest.param({"admitted_at": None}, None, id="missing admission stamp measures nothing"),
    ],
)
def test_measured_overlap(stamps: dict[str, float | None], expected: float | None) -> None:
    assert measured_overlap(timeline(**stamps)) == expected


def test_update_history_is_pure_and_learns_each_term() -> None:
    empty = RoutingHistory()
    h1 = update_history(empty, timeline(workload_id="w1"))
    assert empty.overlap == {} and not empty.runs_of("resnet")  # the input is untouched
    assert h1.overlap_for("spare") == (1.0, True)
    assert h1.overlap_for("primary") == (0.0, False)
    assert h1.runs_of("resnet")[A100_80].value == 1 * H
    assert h1.output_seconds["spare"] == 120
    h2 = update_history(
        h1,
        timeline(
            staging_started_at=2 * H, staging_finished_at=3 * H, compute_started_at=3 * H, finished_at=5 * H,
            promoted_at=5 * H + 60, workload_id="w2",
        ),
    )
    assert h2.overlap["spare"] == pytest.approx(0.5)  # the mean of the recent fractions (1 and 0)
    assert h2.runs_of("resnet")[A100_80].value == pytest.approx(1.5 * H)  # p50 of 1 h and 2 h
    assert h2.output_seconds["spare"] == pytest.approx(90)  # the median of 120 s and 60 s
    assert h2.samples["spare"] == 2
    assert update_history(h2, timeline(workload_id="w1")) is h2, "a timeline folded again changes nothing"


def _queued_with_copy() -> dict[str, ClusterSnapshot]:
    # one cluster: 2 h queue and a 1 h copy (360 GB at 100 MB/s)
    return snapshots(
        make_snapshot(
            "spare",
            nodes=make_nodes("s", 1, free=0),
            queues=[make_queue("training", wait="2h")],
            bandwidth_mbps={"s3": 100},
        )
    )


def test_learnt_overlap_hides_staging_behind_the_queue() -> None:
    wl = make_workload(inputs=[make_input("ds@1", 360, ["s3"])])
    plain = route(wl, "w", _queued_with_copy(), NOW)
    learnt = route(wl, "w", _queued_with_copy(), NOW, history=update_history(None, timeline()))
    p, q = plain.verdicts[0].estimate, learnt.verdicts[0].estimate
    assert p is not None and q is not None
    assert p.staging_overlap == 0 and p.total == pytest.approx(2 * H + 1 * H + 60 + 1 * H + 60)
    assert q.staging_overlap == pytest.approx(1 * H)
    assert q.total == pytest.approx(p.total - 1 * H + (120 - 60))  # hidden copy; measured 120 s output


def test_learnt_overlap_can_flip_the_seed_decision() -> None:
    """With staging fully hidden behind a long queue, a queued cluster needing a copy can win."""
    wl = make_workload(inputs=[make_input("imagenet@v3", 1080, ["s3-east"])])
    clusters = snapshots(
        make_snapshot(
            "queued-copy",
            nodes=make_nodes("q", 1, free=0),
            queues=[make_queue("training", wait="3h")],
            bandwidth_mbps={"s3-east": 100},
        ),
        make_snapshot(
            "slow-cached",
            nodes=make_nodes("s", 1, free=0),
            queues=[make_queue("training", wait="3h30m")],
            datasets_cached=["imagenet@v3"],
        ),
    )
    assert route(wl, "w", clusters, NOW).cluster == "slow-cached"  # plain sum: 3h+3h copy > 3h30m
    h = update_history(None, timeline(cluster="queued-copy"))
    assert route(wl, "w", clusters, NOW, history=h).cluster == "queued-copy"


def _run_on(cluster: str, product: str, wl: Any, h: RoutingHistory | None) -> tuple[float, str]:
    d = route(wl, "w", snapshots(make_snapshot(cluster, nodes=make_nodes("h", 1, product=product))), NOW, history=h)
    est = d.verdicts[0].estimate
    assert est is not None
    return est.run, est.run_source


def test_run_time_is_learnt_per_workload_class_and_scaled_by_model() -> None:
    """Runs of 4 h on an A100 declared 1 h: one leaves the declared value; a few move it most of
    the way; twenty replace it (scaled to H100)."""
    wl = make_workload(workload_class="resnet", expected_runtime="1h")
    declared, source = _run_on("hopper", H100_80, wl, None)
    assert declared == pytest.approx(0.5 * H) and source.startswith("declared 30m")  # 1 h on A100 / 2.0
    h: RoutingHistory | None = None
    for i in range(20):
        h = update_history(h, timeline(workload_key="resnet", compute_started_at=0.0, finished_at=4 * H + i,
                                       workload_id=f"r{i}", declared_seconds=1 * H))  # (as declared, on the A100)
        if i == 0:
            once, _ = _run_on("hopper", H100_80, wl, h)
            assert once == declared  # one run does not move a declaration (history.MIN_RUNS)
        if i == 2:
            few, _ = _run_on("hopper", H100_80, wl, h)
            assert declared < few < 2 * H  # three, each declared 4x short: most of the way
    many, source = _run_on("hopper", H100_80, wl, h)
    assert many == pytest.approx(2 * H, rel=0.15)  # 4 h on A100, H100 is 2x
    assert f"of 20 runs of class resnet on {A100_80}, scaled x0.5 to {H100_80}" in source
    assert "declared 30m" in source
    same, source = _run_on("ampere", A100_80, wl, h)
    assert same == pytest.approx(4 * H, rel=0.1) and "scaled" not in source
    other = make_workload(workload_class="bert", expected_runtime="1h")
    assert _run_on("hopper", H100_80, other, h)[0] == pytest.approx(0.5 * H)  # another class: declared
