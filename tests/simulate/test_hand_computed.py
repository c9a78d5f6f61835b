"""A tiny trace whose completion times are worked out by hand (docs/simulation.md, "Cluster model")."""

from __future__ import annotations

import math

import pytest

from gpuorch.simulate.engine import simulate
from gpuorch.simulate.generator import GeneratorConfig

from .builders import EXACT, cluster, jobs, world

OUT = 60.0  # output transfer (the router's default, and the simulator's)


def test_strict_fifo_on_one_node_gives_the_hand_computed_jcts() -> None:
    w = world(cluster("a", startup=60))
    js = jobs([(0, 1000, 8), (10, 500, 4), (20, 300, 4), (30, 100, 1)], w)
    r = simulate(w, js, "round-robin")
    # j0: starts 0, holds 60 + 1000 -> ends 1060, promoted 1120
    # j1: FIFO behind j0: starts 1060, ends 1620, promoted 1680 -> JCT 1670
    # j2: fits beside j1 at 1060, ends 1420, promoted 1480 -> JCT 1460
    # j3: node full (4 + 4) until j2 ends at 1420: starts 1420, ends 1580, promoted 1640 -> JCT 1610
    assert [j.jct for j in r.jobs] == [1120.0, 1670.0, 1460.0, 1610.0]
    assert [j.wait for j in r.jobs] == [0.0, 1050.0, 1040.0, 1390.0]
    assert r.jobs[1].gpu_hours == pytest.approx(4 * 560 / 3600)


def test_gpuorch_takes_the_faster_gpu_and_run_time_scales_by_model() -> None:
    w = world(cluster("fast", model="NVIDIA-H100-80GB-HBM3", memory_mib=81559, price=5.0),
              cluster("slow", model="Tesla-V100-SXM2-32GB", memory_mib=32768, price=1.0))
    r = simulate(w, jobs([(0, 3600, 8)], w), "gpuorch")
    (j,) = r.jobs
    assert j.cluster == "fast"
    assert j.jct == 60 + 3600 / 2.0 + OUT  # H100 = 2 x A100 in the router's table (and, exact here, in truth)
    r = simulate(w, jobs([(0, 3600, 8)], w), "cost-only")  # 8 x 2 h x $1 < 8 x 0.5 h x $5
    assert r.jobs[0].cluster == "slow" and r.jobs[0].jct == 60 + 3600 / 0.5 + OUT


def test_staging_holds_the_gpus_and_a_staged_dataset_is_cached_for_the_next_job() -> None:
    ds = [{"name": "big", "version": "v1", "size_gb": 100, "locations": ["far"]}]
    w = world(cluster("a", nodes=2, bandwidth={"far": 100.0}), datasets=ds)
    cfg = GeneratorConfig(**{**EXACT.__dict__, "no_input": 0.0})
    js = jobs([(0, 1000, 8), (5000, 1000, 8)], w, cfg)
    r = simulate(w, js, "round-robin")
    first, second = r.jobs
    assert first.staging_s == 100 * 1000 / 100.0 and first.data_gb == 100  # 1,000 s copy inside the GPU hold
    assert first.jct == 1000 + 60 + 1000 + OUT and first.gpu_hours == 8 * 2060 / 3600
    assert second.staging_s == 0 and second.data_gb == 0 and second.jct == 60 + 1000 + OUT


def test_a_job_no_cluster_can_run_never_runs_and_says_why() -> None:
    w = world(cluster("a"))
    cfg = GeneratorConfig(**{**EXACT.__dict__, "accelerators": (("B200", 1.0),)})
    for policy in ("gpuorch", "emptiest", "clairvoyant"):
        (j,) = simulate(w, jobs([(0, 100, 1)], w, cfg), policy).jobs
        assert j.never == "GPU_MODEL (1)" and math.isnan(j.completion), policy


@pytest.mark.parametrize("queue_model", ["pooled", "inventory", "oracle"])
def test_a_snapshot_publishes_the_queue_wait_inventory_would(queue_model: str) -> None:
    from gpuorch.simulate.model import ClusterModel, Work

    m = ClusterModel(world(cluster("a", startup=60)).clusters[0])
    w = Work(key=1, workers=1, per_worker=8, suitable=(0,), submit=0.0, expected_run=1000.0, startup_s=60.0)
    plan = m.plan(w, 0.0)
    assert plan is not None and plan.start == 0.0
    m.commit(w, plan, 1060.0)
    m.apply_start(w)
    snap = m.snapshot(10.0, queue_model=queue_model)
    assert (snap.nodes[0].gpus_free, snap.running_gpus) == (0, 8)
    assert snap.queues[0].estimated_wait_seconds == 1050.0  # the node frees at 1060: 1050 s after 10


def test_round_robin_cycles_through_the_clusters_in_name_order() -> None:
    w = world(cluster("c"), cluster("a"), cluster("b"))  # file order is not name order
    r = simulate(w, jobs([(float(k), 100, 1) for k in range(7)], w), "round-robin")
    assert [j.cluster for j in r.jobs] == ["a", "b", "c", "a", "b", "c", "a"]
