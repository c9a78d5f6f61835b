"""The replay's snapshots carry inventory's own waits per request shape, and on a strict-FIFO
cluster whose expected times are the true ones those waits are exact: each is when the
simulator's cluster (`ClusterModel.plan`, the ground truth the clairvoyant uses) would start a
request of that shape submitted now."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuorch_inventory.core as inventory
from gpuorch.simulate import model as sim_model
from gpuorch.simulate.model import ClusterModel, Work
from gpuorch.simulate.world import parse_world

from .builders import cluster

STARTUP = 60.0


def model_of(groups: list[tuple[int, int, str, str]]) -> ClusterModel:
    """A cluster of node groups (count, GPUs per node, model, pool), admission strict FIFO."""
    c = cluster("c", startup=STARTUP)
    c["nodes"] = [{"name": f"g{k}", "count": n, "pool": pool, "gpu": {"model": model, "memory_mib": 81920, "count": gpus}}
                  for k, (n, gpus, model, pool) in enumerate(groups)]
    return ClusterModel(parse_world({"clusters": [c]}).clusters[0])


groups = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([2, 4, 8]), st.sampled_from(["A100", "V100"]),
                            st.sampled_from(["train", "dev"])), min_size=1, max_size=3)
jobs = st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 3), st.sampled_from([1, 2, 4, 8]),
                          st.integers(1, 5000), st.booleans()), max_size=14)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups, jobs, st.integers(0, 6000))
def test_the_waits_per_shape_are_the_fifo_clusters_own_starts(
    layout: list[tuple[int, int, str, str]], submitted: list[tuple[int, int, int, int, bool]], now: int
) -> None:
    m = model_of(layout)
    nodes = m.spec.nodes
    booked: list[Work] = []
    for key, (at, workers, per_worker, run, narrow) in enumerate(sorted(submitted)):
        if at > now:
            break
        first = nodes[0]  # "narrow": only the first node's model and pool
        suitable = tuple(i for i, n in enumerate(nodes) if n.gpus >= per_worker
                         and (not narrow or (n.product, n.pool) == (first.product, first.pool)))
        w = Work(key=key, workers=workers, per_worker=per_worker, suitable=suitable, submit=float(at),
                 expected_run=float(run), startup_s=STARTUP)
        plan = m.plan(w, float(at))
        if plan is None:
            continue
        m.commit(w, plan, run + STARTUP)  # the true hold is the expected one
        booked.append(w)
    for w in booked:  # what has started and ended by `now` (ends first, as the replay orders them)
        if w.start <= now:
            m.apply_start(w)
            if w.end <= now:
                m.apply_end(w)

    published = m.snapshot(float(now)).queues[0].shape_waits
    assert [w.shape for w in published] == m.shapes
    for wait in published:
        shape = wait.shape
        on = tuple(i for i, n in enumerate(nodes) if shape.counts(n.product, n.pool))
        probe = Work(key=-1, workers=shape.workers, per_worker=shape.gpus, suitable=on, submit=float(now), expected_run=0.0)
        truth = m.plan(probe, float(now))
        assert truth is not None, shape
        assert wait.seconds == truth.start - now, (shape, wait)


def test_the_replay_calls_inventorys_function_not_a_copy() -> None:
    assert sim_model.shape_waits is inventory.shape_waits
    assert sim_model.request_shapes is inventory.request_shapes
    assert sim_model.published_waits is inventory.published_waits


def test_a_clusters_file_that_asks_for_another_admission_order_is_refused() -> None:
    c = cluster("c")
    c["registry"]["queueing"] = "best-effort"
    try:
        parse_world({"clusters": [c]})
    except ValueError as exc:
        assert "clusters[0].registry.queueing: 'best-effort'" in str(exc) and "arrival order" in str(exc)
    else:
        raise AssertionError("a non-FIFO queueing was accepted")
    assert parse_world({"clusters": [cluster("c")]}).clusters[0].registry.queueing == "fifo"
