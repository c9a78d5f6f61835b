"""A pipeline stage's inputs (its dependencies' promoted results, by version) count in its routing.

The router routes a released stage with those results among its inputs (`pipeline.with_stage_inputs`,
applied in `core.decide`), so the one staging rule (`checks.data_staging`) decides whether a cluster
can read them and how long moving them takes: a store the cluster reaches is read in place, a store
it has a link to is copied over that link, any other cluster is ineligible (INPUT_DATA).
"""

from __future__ import annotations

import pytest

from gpuorch_proto import events as ev
from gpuorch_proto.routing import RoutingDecision
from gpuorch_router import core
from gpuorch_router import pipeline as pl
from gpuorch_router.explain import render_explain
from gpuorch_router.fastpath import RoutingMemo
from gpuorch_router.index import SnapshotIndex
from gpuorch_router.policy import route
from tests.support.builders import A100_80, H100_80, NOW, make_node, make_snapshot, make_workload, snapshots

WID = "p--train"


def prep_result(size_bytes: int, store: str = "east-results") -> ev.StageInput:
    return ev.StageInput(
        stage="prep", workload_id="p--prep", attempt_id="p--prep-a1",
        result_path=f"{store}/p--prep/result/", store=store, size_bytes=size_bytes,
    )  # fmt: skip


def verdict(d: RoutingDecision, cluster: str):  # type: ignore[no-untyped-def]
    return next(v for v in d.verdicts if v.cluster == cluster)


def check(d: RoutingDecision, cluster: str, code: str):  # type: ignore[no-untyped-def]
    return next(c for c in verdict(d, cluster).checks if c.code == code)


def decide(world: dict, inputs: list[ev.StageInput], *, memo: RoutingMemo | None = None) -> RoutingDecision:  # type: ignore[type-arg]
    """As the router decides a released stage: its `stage-ready` folded, then `core.decide`."""
    state = core.RouterState()
    state.apply(ev.StageReady(event_id=f"{WID}.stage-ready", workload_id=WID, at=NOW, pipeline="p", stage="train", inputs=inputs), 1)
    idx = {c: SnapshotIndex(s) for c, s in world.items()}
    return core.decide(state, make_workload(gpus=8), WID, 1, idx, NOW, memo=memo)


def test_a_stage_whose_input_only_one_cluster_can_read_goes_there() -> None:
    world = snapshots(
        make_snapshot("a", artifact_stores=["scratch", "east-results"]),
        make_snapshot("b", [make_node("b-0", product=H100_80)], artifact_stores=["scratch"]),  # faster, no path to it
    )
    assert route(make_workload(gpus=8), WID, world, NOW).cluster == "b", "without the input, b wins"
    d = decide(world, [prep_result(20 * 10**9)])
    assert (d.outcome, d.cluster) == ("routed", "a")
    bad = check(d, "b", "INPUT_DATA")
    assert not bad.ok and not bad.capacity_only
    assert "prep@p--prep-a1: no replica reachable (replicas at east-results" in bad.message
    assert "reads scratch in place" in bad.message
    assert check(d, "a", "INPUT_DATA").message == "prep@p--prep-a1 local at east-results"
    assert verdict(d, "a").estimate.data_staging == 0
    assert "[permanent] INPUT_DATA" in render_explain(d)
    assert decide(world, [prep_result(20 * 10**9)], memo=RoutingMemo()) == d, "the fast path agrees"


def test_a_large_input_over_a_slow_link_makes_the_far_cluster_lose() -> None:
    near = make_snapshot("near", [make_node("near-0", product=A100_80)], artifact_stores=["scratch", "east-results"])
    far = make_snapshot(
        "far", [make_node("far-0", product=H100_80)], artifact_stores=["scratch"], bandwidth_mbps={"east-results": 10.0}
    )
    world = snapshots(near, far)
    small = decide(world, [prep_result(10**6)])  # 1 MB: the faster GPUs win
    assert small.cluster == "far"
    d = decide(world, [prep_result(50 * 10**9)])  # 50 GB at 10 MB/s: 5000 s
    assert (d.outcome, d.cluster) == ("routed", "near")
    est = verdict(d, "far").estimate
    assert est.data_staging == pytest.approx(5000.0)
    assert verdict(d, "near").estimate.data_staging == 0
    assert check(d, "far", "INPUT_DATA").message == "prep@p--prep-a1 copy 50 GB from east-results at 10 MB/s = 1h23m"
    text = render_explain(d)
    assert "far: eligible but slower or dearer: 1h55m vs 1h2m" in text and "(data +1h23m, run -30m" in text, text
    assert "far 1h55m (starts now, copy 1h23m" in d.summary
    assert decide(world, [prep_result(50 * 10**9)], memo=RoutingMemo()) == d, "the fast path agrees"


def test_a_store_with_a_link_entry_is_copied_even_when_reached() -> None:
    """A reached store the registry gives a link figure for is remote: copied at that rate."""
    s = make_snapshot("c", artifact_stores=["scratch", "east-results"], bandwidth_mbps={"east-results": 100.0})
    d = decide(snapshots(s), [prep_result(10 * 10**9)])
    assert verdict(d, "c").estimate.data_staging == pytest.approx(100.0)


def test_a_measured_link_figure_is_used_and_said_to_be_measured() -> None:
    """Inventory puts measured staging throughput in `bandwidth_mbps` and names it in
    `bandwidth_measured`: the estimate uses the figure, the reason says where it came from."""
    measured = make_snapshot(
        "c", artifact_stores=["scratch"], bandwidth_mbps={"east-results": 40.0}, bandwidth_measured={"east-results": 40.0}
    )
    d = decide(snapshots(measured), [prep_result(4 * 10**9)])
    assert verdict(d, "c").estimate.data_staging == pytest.approx(100.0)
    assert check(d, "c", "INPUT_DATA").message == "prep@p--prep-a1 copy 4 GB from east-results at 40 MB/s measured = 1m40s"
    assert decide(snapshots(measured), [prep_result(4 * 10**9)], memo=RoutingMemo()) == d, "the fast path agrees"
    registry = make_snapshot("c", artifact_stores=["scratch"], bandwidth_mbps={"east-results": 40.0})
    assert check(decide(snapshots(registry), [prep_result(4 * 10**9)]), "c", "INPUT_DATA").message.endswith("at 40 MB/s = 1m40s")


def test_inputs_are_added_after_the_stage_own_and_not_to_plain_workloads() -> None:
    wl = make_workload(inputs=[("imagenet@v3", 10.0, ["s3-east"])])
    assert pl.with_stage_inputs(wl, []) is wl
    out = pl.with_stage_inputs(wl, [prep_result(3 * 10**9)])
    assert [(i.ref, i.size_gb, i.locations) for i in out.spec.inputs] == [
        ("imagenet@v3", 10.0, ["s3-east"]),
        ("prep@p--prep-a1", 3.0, ["east-results"]),
    ]
    state = core.RouterState()
    state.apply(ev.StageReady(workload_id=WID, at=NOW, pipeline="p", stage="train", inputs=[prep_result(1)]), 1)
    state.apply(ev.Completed(workload_id=WID, at=NOW, attempt_id=f"{WID}-a1", result_path="/r"), 2)
    assert WID not in state.stage_inputs, "a finished stage is never routed again"
