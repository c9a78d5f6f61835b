"""Learned run times (issue 30): a distribution per workload key and GPU model, blended with the
declared value (`history.RunStats.blend`), the same after a restart and on a replica, bounded.

* the estimate converges on a class with a fixed true run time (the bound the blend documents);
* a history is a function of the set of timelines folded in: any order, any duplicates, the same
  history, and the one a plain reference computation of the bounds keeps;
* a restart keeps it: the snapshot round trip, and a router restored from a snapshot that folds the
  rest of the log (some events twice, as after a restart from the ack floor);
* a replica that folds the same events in another interleaving (each workload's in order, as a
  router handling several workloads at once does) learns the same, and estimates the same;
* bounded: many classes never hold more than the bounds, and keep the most recent runs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch.config import Settings
from gpuorch.projection import dump_projection, load_projection
from gpuorch_proto import Event, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.routing import Estimate
from gpuorch_router import core as rcore
from gpuorch_router import history
from gpuorch_router.core import RouterState, decide
from gpuorch_router.history import (
    MeasuredTimeline,
    RoutingHistory,
    history_parts,
    update_history,
    workload_key,
)
from gpuorch_router.policy import SnapshotIndex, build_index, route
from gpuorch_router.service import Router
from tests.snapshot.histories import MAKERS
from tests.support.builders import A100_80, H100_80, NOW, make_nodes, make_snapshot, make_workload, snapshots

GIVEN = settings(max_examples=60, deadline=None)
V100 = "Tesla-V100-SXM2-32GB"


def run_estimate(wl: Workload, h: RoutingHistory | None, product: str = A100_80) -> Estimate:
    d = route(wl, "w", snapshots(make_snapshot("east", nodes=make_nodes("e", 1, product=product))), NOW, history=h)
    est = d.verdicts[0].estimate
    assert est is not None, d.summary
    return est


# ---- convergence -------------------------------------------------------------------------------


@GIVEN
@given(
    true=st.integers(60, 10**6),
    declared=st.one_of(st.none(), st.integers(60, 10**6)),
    runs=st.integers(1, 2 * history.RUN_SAMPLES),
)
def test_the_learnt_estimate_converges_on_a_class_with_a_fixed_true_run_time(true: int, declared: int | None, runs: int) -> None:
    """After n >= MIN_RUNS runs of T (n up to the window), within a factor
    exp(PRIOR_CLASS_SIGMA x sqrt(2/n)) of T, whatever the (fixed) declaration; exactly T from the
    first run when nothing is declared."""
    wl = make_workload(workload_class="fixed", expected_runtime=f"{declared}s" if declared else None)
    h: RoutingHistory | None = None
    for i in range(runs):
        start = 1000.0 * i
        h = update_history(h, MeasuredTimeline(cluster="east", workload_key="fixed", gpu_product=A100_80, compute_started_at=start,
                                               finished_at=start + true, workload_id=f"w{i}", declared_seconds=declared))  # fmt: skip
        n = min(i + 1, history.RUN_SAMPLES)
        est = run_estimate(wl, h)
        err = abs(math.log(est.run / true))
        if declared is None:
            assert err < 1e-9, est.run_source
        elif n < history.MIN_RUNS:
            assert est.run == declared, "one run does not move a declaration"
        else:
            assert err <= history.PRIOR_CLASS_SIGMA * math.sqrt(2.0 / n) + 1e-9, (n, est.run, est.run_source)
    assert f"of {min(runs, history.RUN_SAMPLES)} run" in est.run_source and est.run_source.endswith("of class fixed") == (declared is None)


def test_convergence_is_not_trivial_one_run_does_not_replace_a_declaration() -> None:
    """(The bound above can fail: one run of 4 h leaves a declared 1 h as it is.)"""
    wl = make_workload(workload_class="fixed", expected_runtime="1h")
    h = update_history(None, MeasuredTimeline(cluster="east", workload_key="fixed", gpu_product=A100_80, compute_started_at=0.0,
                                              finished_at=4 * 3600.0, workload_id="w0", declared_seconds=3600.0))  # fmt: skip
    assert run_estimate(wl, h).run == 3600.0


SCATTERED = [60, 86400, 600, 30000, 120, 50000, 3000, 200] * 3  # 1 min .. 1 day


def test_a_class_whose_runs_scatter_leaves_the_declaration_exactly() -> None:
    wl = make_workload(workload_class="anything", expected_runtime="2h")
    h: RoutingHistory | None = None
    for i, seconds in enumerate(SCATTERED):
        h = update_history(h, MeasuredTimeline(cluster="east", workload_key="anything", gpu_product=A100_80, compute_started_at=0.0,
                                               finished_at=float(seconds), workload_id=f"w{i}", declared_seconds=float(seconds)))  # fmt: skip
    est = run_estimate(wl, h)
    assert est.run == 7200.0 and "weight 0" in est.run_source


@pytest.mark.parametrize(("bias", "expected"), [(1.0, 7200.0), (0.5, 3600.0)], ids=["declarations right", "declared 2x too long"])
def test_a_signature_corrects_only_the_bias_of_its_teams_declarations(bias: float, expected: float) -> None:
    """No class: owner + image + command. Runs of any length, each declared `1/bias` too long:
    the runs correct the bias, never replace a declaration by their own lengths."""
    wl = make_workload(expected_runtime="2h")
    h: RoutingHistory | None = None
    for i, seconds in enumerate(SCATTERED):
        h = update_history(h, MeasuredTimeline(cluster="east", workload_key=workload_key(wl), gpu_product=A100_80, compute_started_at=0.0,
                                               finished_at=seconds * bias, workload_id=f"w{i}", declared_seconds=float(seconds)))  # fmt: skip
    est = run_estimate(wl, h)
    assert est.run == pytest.approx(expected)
    assert "24 runs of alice's image and command (no class given)" in est.run_source
    assert ("within noise" in est.run_source) == (bias == 1.0), est.run_source


def test_a_long_job_is_not_estimated_by_the_short_runs_that_finished_first() -> None:
    wl = make_workload(workload_class="mixed", expected_runtime="10h")
    h: RoutingHistory | None = None
    for i in range(10):  # only short runs have finished so far, each as declared
        h = update_history(h, MeasuredTimeline(cluster="east", workload_key="mixed", gpu_product=A100_80, compute_started_at=0.0,
                                               finished_at=600.0 + i, workload_id=f"w{i}", declared_seconds=600.0))  # fmt: skip
    assert run_estimate(wl, h).run == 36000.0
    short = make_workload(workload_class="mixed", expected_runtime="11m")
    assert run_estimate(short, h).run == pytest.approx(605, rel=0.1)


def test_runs_on_another_model_are_scaled_by_the_speed_table() -> None:
    wl = make_workload(workload_class="c", expected_runtime=None)
    h = update_history(None, MeasuredTimeline(cluster="east", workload_key="c", gpu_product=V100, compute_started_at=0.0,
                                              finished_at=4000.0, workload_id="w0"))  # fmt: skip
    est = run_estimate(wl, h, H100_80)
    assert est.run == pytest.approx(4000.0 * 0.5 / 2.0)  # V100 0.5, H100 2.0
    assert est.gpu_model == H100_80 and f"on {V100}, scaled x0.25 to {H100_80}" in est.run_source


# ---- order, duplicates and the bounds -------------------------------------------------------------


KEYS = ["resnet", "bert", "gpt", "vit", "unet"]
MODELS = [A100_80, H100_80, None]


@st.composite
def timelines(draw: st.DrawFn, max_size: int = 30) -> list[MeasuredTimeline]:
    """Distinct workloads' timelines (one per workload id), with ties in time."""
    out = []
    for i in range(draw(st.integers(0, max_size))):
        t0 = float(draw(st.integers(0, 20)) * 100)
        run = float(draw(st.integers(1, 5000)))
        out.append(MeasuredTimeline(
            cluster=draw(st.sampled_from(["east", "west"])), workload_key=draw(st.sampled_from(KEYS)),
            gpu_product=draw(st.sampled_from(MODELS)), routed_at=t0, admitted_at=t0 + draw(st.integers(0, 50)),
            staging_started_at=t0, staging_finished_at=t0 + draw(st.integers(1, 100)), compute_started_at=t0 + 100,
            finished_at=t0 + 100 + run, promoted_at=t0 + 100 + run + draw(st.integers(0, 90)), workload_id=f"w{i}",
            declared_seconds=draw(st.one_of(st.none(), st.floats(1.0, 1e5))),
        ))  # fmt: skip
    return out


def fold(ts: Sequence[MeasuredTimeline], h: RoutingHistory | None = None) -> RoutingHistory | None:
    for t in ts:
        h = update_history(h, t)
    return h


def parts(h: RoutingHistory | None) -> object:
    return rcore.dump_history(h)


@contextmanager
def small_bounds() -> Iterator[None]:
    """Bounds small enough for a few dozen timelines to hit every one of them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(history, "RUN_SAMPLES", 3)
        mp.setattr(history, "BUCKETS", 2)
        mp.setattr(history, "BUCKET_SAMPLES", 5)
        mp.setattr(history, "CLUSTER_SAMPLES", 4)
        yield


def reference_runs(ts: Sequence[MeasuredTimeline]) -> set[tuple[str, str, float, float]]:
    """The runs the bounds keep, computed plainly from the set: per (key, model) the RUN_SAMPLES
    most recent, then per bucket the BUCKET_SAMPLES most recent of those."""
    per_entry: dict[tuple[str, str], list[tuple[float, int, str, str, float]]] = {}
    for t in ts:
        assert t.finished_at is not None and t.compute_started_at is not None
        uid = history._uid(t)
        per_entry.setdefault((t.workload_key, t.gpu_product or ""), []).append(
            (t.finished_at, uid, t.workload_key, t.gpu_product or "", t.finished_at - t.compute_started_at))
    per_bucket: dict[int, list[tuple[float, int, str, str, float]]] = {}
    for (key, _), runs in per_entry.items():
        per_bucket.setdefault(zlib.crc32(key.encode()) % history.BUCKETS, []).extend(sorted(runs)[-history.RUN_SAMPLES:])
    return {(k, m, at, s) for runs in per_bucket.values() for at, _, k, m, s in sorted(runs)[-history.BUCKET_SAMPLES:]}


def kept_runs(h: RoutingHistory | None) -> set[tuple[str, str, float, float]]:
    if h is None:
        return set()
    runs, _ = history_parts(h)
    return {(k, m, s.at, s.seconds) for k, ms in runs.items() for m, w in ms.items() for s in w}


@GIVEN
@given(ts=timelines(), data=st.data())
def test_a_history_is_a_function_of_the_set_of_timelines(ts: list[MeasuredTimeline], data: st.DataObject) -> None:
    with small_bounds():
        check_set_function(ts, data)


def check_set_function(ts: list[MeasuredTimeline], data: st.DataObject) -> None:
    once = fold(ts)
    twice = data.draw(st.lists(st.sampled_from(ts), max_size=10)) if ts else []
    again = data.draw(st.permutations([*ts, *twice]))
    other = fold(again)
    assert parts(other) == parts(once), "another order, some timelines twice: the same history"
    assert kept_runs(once) == reference_runs(ts)
    if once is not None:
        assert once.run_count() <= history.BUCKETS * history.BUCKET_SAMPLES
        for b in once.runs:
            assert all(s.n <= history.RUN_SAMPLES for ms in b.entries.values() for s in ms.values())
        assert all(len(w) <= history.CLUSTER_SAMPLES for w in once.clusters.values())


def test_the_order_comparison_can_fail() -> None:
    ts = [MeasuredTimeline(cluster="east", workload_key="k", compute_started_at=0.0, finished_at=float(s), workload_id=f"w{s}")
          for s in (10, 20)]  # fmt: skip
    assert parts(fold(ts)) != parts(fold(ts[:1]))


# ---- restart: the snapshot round trip -----------------------------------------------------------


@GIVEN
@given(ts=timelines(max_size=60))
def test_the_snapshot_round_trip_keeps_the_history_and_its_estimates(ts: list[MeasuredTimeline]) -> None:
    h = fold(ts)
    back = rcore.load_history(rcore.dump_history(h))
    assert rcore.same_history(back, h)
    if h is None:
        assert back is None
        return
    assert back is not None and back.samples == h.samples and back.overlap == h.overlap and back.output_seconds == h.output_seconds
    for key in KEYS:
        wl = make_workload(workload_class=key, expected_runtime="30m")
        for product in (A100_80, H100_80):
            assert run_estimate(wl, back, product) == run_estimate(wl, h, product)
    more = ts[: len(ts) // 2]
    assert rcore.same_history(fold(more, back), h), "folding again what the snapshot holds changes nothing"


# ---- restart and replica: routers folding the log -----------------------------------------------

EAST = {"east": build_index(make_snapshot("east", nodes=make_nodes("e", 2, product=A100_80)))}
CLASS_RUN = {"resnet": 5400.0, "bert": 1800.0}


MIXED = {"east": build_index(make_snapshot("east", nodes=[*make_nodes("e", 1, product=A100_80), *make_nodes("v", 1, product=V100, memory_mib=32768)]))}


def workload_events(wid: str, cls: str, declared: str, run: float, t0: float, indexes: Mapping[str, SnapshotIndex] = EAST) -> list[Event]:
    """One workload's log from submit to completed on `east` (A100), its run `run` seconds."""
    wl = make_workload(name=wid, workload_class=cls, expected_runtime=declared)
    at = {"attempt-created": t0 + 2, "admitted": t0 + 3, "running": t0 + 4, "succeeded": t0 + 4 + run,
          "promote-requested": t0 + 5 + run, "promoted": t0 + 6 + run, "completed": t0 + 7 + run}  # fmt: skip
    return [
        ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=t0, workload=wl, idempotency_key=f"key-{wid}"),
        ev.Routed(workload_id=wid, at=t0 + 1, decision=decide(RouterState(), wl, wid, 1, indexes, NOW), attempt_number=1),
        *(MAKERS[kind](wid, 0, 1, t) for kind, t in at.items()),
    ]


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[list[Event]], list[int], list[int]]:
    """Per workload its events; the stream's interleaving; another one (a replica's handling)."""
    runs = []
    for i in range(draw(st.integers(1, 8))):
        cls = draw(st.sampled_from(sorted(CLASS_RUN)))
        run = CLASS_RUN[cls] * draw(st.sampled_from([0.9, 1.0, 1.1]))
        runs.append(workload_events(f"w{i}", cls, draw(st.sampled_from(["30m", "1h", "3h"])), run, NOW + draw(st.integers(0, 5)) * 600))
    slots = [i for i, r in enumerate(runs) for _ in r]
    return runs, draw(st.permutations(slots)), draw(st.permutations(slots))


def interleave(runs: list[list[Event]], order: list[int]) -> list[Event]:
    cursors = [0] * len(runs)
    out = []
    for i in order:
        out.append(runs[i][cursors[i]])
        cursors[i] += 1
    return out


def folded(events: Sequence[Event], router: Router | None = None, first_seq: int = 1) -> Router:
    r = router or Router(Settings(prefix="t"))
    for seq, e in enumerate(events, first_seq):
        r.fold(e, seq)
    return r


@settings(max_examples=25, deadline=None)
@given(log=logs(), data=st.data())
def test_a_restart_and_a_replica_learn_the_same_as_one_router(log: tuple[list[list[Event]], list[int], list[int]], data: st.DataObject) -> None:
    runs, stream, replica_order = log
    events = interleave(runs, stream)
    one = folded(events)
    assert one.history is not None and one.history.run_count() == len(runs), "one run learnt per completed workload"
    assert {m for c in CLASS_RUN for m in one.history.runs_of(c)} == {A100_80}, "on the model the decisions estimated"

    # a replica handles the same events, several workloads at once: another interleaving
    replica = Router(Settings(prefix="t"))
    for e in interleave(runs, replica_order):
        replica.fold(e, events.index(e) + 1)  # (its stream sequence)
    assert rcore.same_history(replica.history, one.history)

    # a restart: the snapshot at a cut, then the log from an ack floor at or before the cut
    cut = data.draw(st.integers(0, len(events)))
    floor = data.draw(st.integers(0, cut))
    half = folded(events[:cut])
    restored = Router(Settings(prefix="t"))
    restored.follower.restore(load_projection(dump_projection(half.follower.projection)), {})
    restored.state, restored.gate, restored.history = rcore.load_router(rcore.dump_router(half.state, half.gate, half.history))
    folded(events[floor:], restored, first_seq=floor + 1)
    assert rcore.same_history(restored.history, one.history)

    new = make_workload(name="next", workload_class="resnet", expected_runtime="1h")
    estimates = {run_estimate(new, r.history).run_source for r in (one, replica, restored)}
    assert len(estimates) == 1, estimates


def test_the_router_learns_the_gpu_model_from_the_log_not_from_inventory() -> None:
    """Before inventory has published anything (a restart's replay), the run is on the model the
    routing decision estimated for that cluster: the same as a router with snapshots learns."""
    r = folded(workload_events("w0", "resnet", "1h", 5400.0, NOW))
    assert r.history is not None and not r.snapshots
    learnt = r.history.runs_of("resnet")
    assert set(learnt) == {A100_80} and learnt[A100_80].samples[0].seconds == 5400.0
    assert learnt[A100_80].samples[0].declared == 3600.0


def test_no_run_is_learnt_where_gpus_of_several_suitable_models_could_have_run_it() -> None:
    r = folded(workload_events("w0", "resnet", "1h", 5400.0, NOW, MIXED))
    assert r.history is not None and not r.history.runs_of("resnet"), "the log does not say which model ran it"
    assert r.history.samples == {"east": 1}, "the cluster's terms are still learnt"


def test_the_run_is_measured_from_the_programs_first_step_when_it_reported_one() -> None:
    events = workload_events("w0", "resnet", "1h", 5400.0, NOW)
    running = next(e for e in events if isinstance(e, ev.Running))
    first_step = ev.ComputeStarted(workload_id="w0", at=running.at + 700, attempt_id=running.attempt_id, epoch=1, cluster="east",
                                   started_at=running.at + 600, step=1)  # fmt: skip
    r = folded([*events[: events.index(running) + 1], first_step, *events[events.index(running) + 1 :]])
    assert r.history is not None and r.history.runs_of("resnet")[A100_80].samples[0].seconds == 5400.0 - 600


# ---- bounded under many classes ------------------------------------------------------------------


def test_many_classes_never_hold_more_than_the_bounds_and_keep_the_most_recent() -> None:
    limit = history.BUCKETS * history.BUCKET_SAMPLES
    h: RoutingHistory | None = None
    n = limit + limit // 4
    for i in range(n):  # every workload a class of its own, finishing in order
        h = update_history(h, MeasuredTimeline(cluster=f"c{i % 3}", workload_key=f"class-{i}", gpu_product=A100_80,
                                               compute_started_at=float(i), finished_at=float(i) + 60.0, workload_id=f"w{i}"))  # fmt: skip
    assert h is not None
    assert h.run_count() <= limit and h.key_count() <= limit
    assert h.run_count() > limit * 0.9, "the buckets fill (crc32 spreads the keys)"
    assert all(len(w) == history.CLUSTER_SAMPLES for w in h.clusters.values())
    assert h.runs_of(f"class-{n - 1}"), "the newest class is kept"
    assert not h.runs_of("class-0"), "the oldest went first"
    assert len(rcore.dump_history(h)) < 4 * 1024 * 1024, "and so is its snapshot"
