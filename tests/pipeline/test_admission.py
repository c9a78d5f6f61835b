"""Admission: concurrency that is not capacity (organisation, queue, pipeline; workloads and GPUs),
queues as policy (priority, who may submit, a GPU-hour budget over a sliding window); held work says
why and is released as soon as a slot frees."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_proto import Workload
from gpuorch_proto.workload import Limits
from gpuorch_router import pipeline as pl
from gpuorch_router.pipeline import Candidate, GpuSpan, Held, Refused, Released, Running, Tally

from .builders import NOW, make_policy, make_sweep, research, started

HOUR = 3600.0


def cand(wid: str = "w", gpus: float = 2, queue: str | None = "research", **kw: object) -> Candidate:
    return Candidate(workload_id=wid, gpus=gpus, queue=queue, **kw)  # type: ignore[arg-type]


def running(n: int, gpus: float = 2, queue: str = "research", pipeline: str | None = None) -> list[Running]:
    return [Running(f"r{i}", queue, gpus, pipeline) for i in range(n)]


def verdict(
    policy: object, run: list[Running], c: Candidate, spans: list[GpuSpan] | None = None
) -> pl.Verdict:
    return pl.admission(policy, Tally.of(run), spans or [], c, NOW)  # type: ignore[arg-type]


# ---- the reasons held work gives -----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "run", "c", "reason"),
    [
        pytest.param(
            research(max_gpus=16),
            running(8),
            cand(),
            "held: queue research at 16 of 16 GPUs",
            id="queue-gpus-full",
        ),
        pytest.param(
            research(max_gpus=16),
            running(7),
            cand(gpus=4),
            "held: queue research at 14 of 16 GPUs, needs 4",
            id="queue-gpus-not-enough-left",
        ),
        pytest.param(
            research(max_gpus=None, max_running=3),
            running(3),
            cand(),
            "held: queue research at 3 of 3 running workloads",
            id="queue-running-full",
        ),
        pytest.param(
            make_policy(organisation={"max_gpus": 10}, queues=[{"name": "default"}, {"name": "research"}]),
            running(5),
            cand(),
            "held: organisation at 10 of 10 GPUs",
            id="organisation-gpus-full",
        ),
        pytest.param(
            research(max_gpus=None),
            running(4, pipeline="sweep-1"),
            cand(pipeline="sweep-1", pipeline_limits=Limits(max_gpus=8)),
            "held: pipeline sweep-1 at 8 of 8 GPUs",
            id="pipeline-gpus-full",
        ),
        pytest.param(
            make_policy(
                organisation={"max_running": 4},
                queues=[{"name": "default"}, {"name": "research", "limits": {"max_gpus": 8}}],
            ),
            running(4),
            cand(),
            "held: organisation at 4 of 4 running workloads; queue research at 8 of 8 GPUs",
            id="every-limit-that-holds-widest-first",
        ),
    ],
)
def test_held_work_says_which_limit_holds_it(
    policy: object, run: list[Running], c: Candidate, reason: str
) -> None:
    v = verdict(policy, run, c)
    assert isinstance(v, Held) and v.reason == reason
    e = v.event(NOW, k=2)
    assert (e.event_id, e.reason, e.queue, [h.message for h in e.holds]) == (
        "w.held.2",
        reason,
        "research",
        reason[6:].split("; "),
    )


def test_released_work_says_where_it_leaves_the_limits() -> None:
    v = verdict(research(max_gpus=16, max_running=10), running(6), cand())
    assert isinstance(v, Released)
    assert (
        v.reason == "released: queue research at 7 of 10 running workloads; queue research at 14 of 16 GPUs"
    )
    e = v.event(NOW)
    assert (e.event_id, e.gpus, e.queue) == ("w.released", 2, "research")


def test_a_cpu_stage_is_never_held_by_a_gpu_limit_or_budget() -> None:
    policy = research(max_gpus=16, budget={"gpu_hours": 1, "window": "1d"})
    spans = [GpuSpan("research", 16, NOW - HOUR)]
    assert isinstance(verdict(policy, running(8), cand(gpus=0), spans), Released)


@pytest.mark.parametrize(
    ("policy", "c", "reason"),
    [
        pytest.param(
            research(),
            cand(queue="nope"),
            "queue 'nope' does not exist (queues: default, research)",
            id="unknown-queue",
        ),
        pytest.param(
            research(owners=["vision"]),
            cand(owner="team-a"),
            "team-a may not submit to queue research (owners: vision)",
            id="not-an-owner",
        ),
        pytest.param(
            research(max_gpus=16),
            cand(gpus=32),
            "needs 32 GPUs; queue research allows 16 at once",
            id="larger-than-the-limit",
        ),
        pytest.param(
            research(budget={"gpu_hours": 100, "window": "7d"}),
            cand(gpu_hours=160),
            "needs ~160 GPU-hours; queue research's budget is 100 GPU-hours per 168h",
            id="larger-than-the-budget",
        ),
    ],
)
def test_work_that_can_never_be_released_is_refused(policy: object, c: Candidate, reason: str) -> None:
    v = verdict(policy, [], c)
    assert isinstance(v, Refused) and v.reason == reason


# ---- the budget: GPU-hours over a sliding window -----------------------------------------------


def test_the_budget_counts_gpu_time_inside_the_window_only() -> None:
    spans = [
        GpuSpan("research", 8, NOW - 30 * HOUR, NOW - 20 * HOUR),  # outside a 1d window except 4h: 32
        GpuSpan("research", 4, NOW - 2 * HOUR),  # still running: 8
        GpuSpan("other", 100, NOW - 2 * HOUR, NOW - HOUR),  # another queue's
    ]
    assert pl.spent_gpu_hours(spans, "research", 24 * HOUR, NOW) == pytest.approx(32 + 8)


@pytest.mark.parametrize(
    ("spent_hours", "needs", "outcome"),
    [
        pytest.param(99, 0, Released, id="under-the-cap-unknown-run-time"),
        pytest.param(100, 0, Held, id="at-the-cap"),
        pytest.param(90, 8, Released, id="its-estimate-fits"),
        pytest.param(95, 8, Held, id="its-estimate-does-not-fit"),
    ],
)
def test_a_queue_budget_holds_work_once_spent(spent_hours: float, needs: float, outcome: type) -> None:
    policy = research(max_gpus=None, budget={"gpu_hours": 100, "window": "1d"})
    spans = [GpuSpan("research", spent_hours / 12, NOW - 12 * HOUR, NOW)]
    v = verdict(policy, [], cand(gpu_hours=needs), spans)
    assert type(v) is outcome
    if isinstance(v, Held):
        assert v.reason.startswith(
            f"held: queue research spent {spent_hours:g} of 100 GPU-hours in the last 24h"
        )


def test_the_budget_frees_as_the_window_slides() -> None:
    policy = research(max_gpus=None, budget={"gpu_hours": 10, "window": "1d"})
    spans = [GpuSpan("research", 10, NOW - 24 * HOUR, NOW - 23 * HOUR)]
    assert isinstance(pl.admission(policy, Tally(), spans, cand(), NOW), Held)
    assert isinstance(pl.admission(policy, Tally(), spans, cand(), NOW + 0.5 * HOUR), Released)


def test_one_round_does_not_overspend_the_budget() -> None:
    policy = research(max_gpus=None, budget={"gpu_hours": 10, "window": "1d"})
    vs = pl.admit(policy, [], [], [cand(f"w{i}", gpu_hours=4) for i in range(5)], NOW)
    assert [type(v).__name__ for v in vs] == ["Released", "Released", "Held", "Held", "Held"]


# ---- the budget's unit: GPU-hours of the workload's own clock (simulated at time scale > 1) -----

SCALE = 600.0  # the local clusters' simulated seconds per second of the events' clock


def test_at_time_scale_600_spans_count_600_times_and_the_window_is_600_times_shorter() -> None:
    # a 1d budget window is 144 s of the events' clock at 600x
    spans = [
        GpuSpan("research", 6, NOW - 150, NOW - 138),  # 6 s inside: 6 GPUs x 6 s x 600 = 6 GPU-hours
        GpuSpan("research", 2, NOW - 12),  # still running: 2 GPUs x 12 s x 600 = 4 GPU-hours
        GpuSpan("research", 100, NOW - 1000, NOW - 145),  # in 24 h of the events' clock, not 1 simulated day
    ]
    assert pl.spent_gpu_hours(spans, "research", 24 * HOUR, NOW, SCALE) == pytest.approx(6 + 4)
    unscaled = (72 + 24 + 85_500) / HOUR  # time scale 1: as before
    assert pl.spent_gpu_hours(spans, "research", 24 * HOUR, NOW) == pytest.approx(unscaled)


@pytest.mark.parametrize(
    ("real_seconds", "needs", "outcome"),
    [
        pytest.param(54, 1, Released, id="9-used-plus-1-expected-fits-10"),
        pytest.param(54, 2, Held, id="9-used-plus-2-expected-passes-10"),
        pytest.param(59, 0, Released, id="unknown-run-time-under-the-cap"),
        pytest.param(60, 0, Held, id="unknown-run-time-at-the-cap"),
    ],
)
def test_at_time_scale_600_a_budget_holds_work_once_used_seconds_times_600_plus_expected_pass_it(
    real_seconds: float, needs: float, outcome: type
) -> None:
    """10 GPU-hours per simulated day: 1 GPU for 54 s of the events' clock is 9 simulated GPU-hours
    (unscaled, 0.015: the old arithmetic released everything here)."""
    policy = research(max_gpus=None, budget={"gpu_hours": 10, "window": "1d"})
    spans = [GpuSpan("research", 1, NOW - real_seconds, NOW)]
    v = pl.admission(policy, Tally(), spans, cand(gpu_hours=needs), NOW, SCALE)
    assert type(v) is outcome
    if isinstance(v, Held):
        spent = real_seconds * SCALE / HOUR
        assert v.holds[0].kind == "budget" and v.holds[0].used == pytest.approx(spent)
        assert v.reason.startswith(f"held: queue research spent {spent:g} of 10 GPU-hours in the last 24h")


def test_at_time_scale_600_the_budget_window_slides_in_simulated_time() -> None:
    """A 1 h window is 6 s of the events' clock at 600x: 10 GPUs for those 6 s spent the whole
    10 GPU-hours; 3 s later half of it has left the window, 6 s later all of it."""
    policy = research(max_gpus=None, budget={"gpu_hours": 10, "window": "1h"})
    spans = [GpuSpan("research", 10, NOW - 6, NOW)]

    def at(dt: float, needs: float = 0.0) -> pl.Verdict:
        return pl.admission(policy, Tally(), spans, cand(gpu_hours=needs), NOW + dt, SCALE)

    assert isinstance(at(0), Held)
    assert isinstance(at(3, needs=6), Held), "5 used + 6 > 10"
    assert isinstance(at(3, needs=5), Released), "5 used + 5"
    assert isinstance(at(6, needs=10), Released), "all of it has left the window"


def test_at_time_scale_600_one_round_commits_simulated_hours_with_the_used_ones() -> None:
    """What a round releases (GPUs x expected run time: simulated) adds to what spans used, in one unit."""
    policy = research(max_gpus=None, budget={"gpu_hours": 10, "window": "1d"})
    spans = [GpuSpan("research", 1, NOW - 36, NOW)]  # 6 GPU-hours at 600x
    vs = pl.admit(policy, [], spans, [cand(f"w{i}", gpu_hours=2) for i in range(3)], NOW, time_scale=SCALE)
    assert [type(v).__name__ for v in vs] == ["Released", "Released", "Held"]
    held = vs[2]
    assert isinstance(held, Held) and "spent 10 of 10 GPU-hours in the last 24h, needs ~2" in held.reason


# ---- order: queue priority, then workload priority, then submit time -------------------------


def test_order_is_queue_priority_then_priority_then_submit_time() -> None:
    policy = make_policy(
        queues=[{"name": "default"}, {"name": "prod", "priority": 100}, {"name": "research", "priority": 1}],
        organisation={"max_running": 3},
    )
    cs = [
        cand("late-research", queue="research", submitted_at=5),
        cand("early-research", queue="research", submitted_at=1),
        cand("urgent-research", queue="research", submitted_at=9, priority=50),
        cand("prod", queue="prod", submitted_at=10),
    ]
    vs = pl.admit(policy, [], [], cs, NOW)
    assert [(v.workload_id, type(v).__name__) for v in vs] == [
        ("prod", "Released"),
        ("urgent-research", "Released"),
        ("early-research", "Released"),
        ("late-research", "Held"),
    ]


def test_a_smaller_candidate_may_pass_one_that_does_not_fit() -> None:
    vs = pl.admit(
        research(max_gpus=16),
        running(6),
        [],
        [cand("big", gpus=8, submitted_at=1), cand("small", gpus=2, submitted_at=2)],
        NOW,
    )
    assert [(v.workload_id, type(v).__name__) for v in vs] == [("big", "Held"), ("small", "Released")]


# ---- the 200-trial sweep with a limit of 16 GPUs ------------------------------------------------


def _sweep_candidates(state: pl.PipelineState, wl: Workload) -> list[Candidate]:
    return pl.candidates_of(state, wl, NOW)


def test_a_200_trial_sweep_runs_16_gpus_at_a_time_and_releases_as_trials_finish() -> None:
    wl = make_sweep(
        grid={"lr": list(range(20)), "seed": list(range(10))},
        resources={"gpus": 2},
        policy_queue="research",
        limits={"max_gpus": 16},
    )
    policy = research(max_gpus=64)
    s = started("sweep-1", wl)
    for r in pl.ready_stages(s, NOW):
        s.apply(r)
    assert len(s.stages) == 200

    def round_() -> list[pl.Verdict]:
        vs = pl.admit(policy, pl.running_of(s, "research"), [], _sweep_candidates(s, wl), NOW)
        for v in vs:
            if isinstance(v, (Released, Held)):
                s.apply(v.event(NOW))
        return vs

    vs = round_()
    rel = [v.workload_id for v in vs if isinstance(v, Released)]
    assert rel == [f"sweep-1--t{i:04d}" for i in range(8)]  # 8 x 2 GPUs, in the sweep's order
    held = next(v for v in vs if isinstance(v, Held))
    assert held.reason == "held: pipeline sweep-1 at 16 of 16 GPUs"
    assert round_() and [v for v in round_() if isinstance(v, Released)] == []  # nothing frees, nothing moves
    from .builders import completed, promoted

    s.apply(promoted(s, "t0003"))
    s.apply(completed(s, "t0003"))
    assert [v.workload_id for v in round_() if isinstance(v, Released)] == [
        "sweep-1--t0008"
    ]  # the slot goes at once


# ---- properties --------------------------------------------------------------------------------

_limit = st.one_of(st.none(), st.integers(1, 12))
_glimit = st.one_of(st.none(), st.sampled_from([0, 2, 4, 8, 16]))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[object, list[Running], list[Candidate]]:
    policy = make_policy(
        organisation={
            k: v for k, v in (("max_running", draw(_limit)), ("max_gpus", draw(_glimit))) if v is not None
        },
        queues=[{"name": "default"}]
        + [
            {
                "name": q,
                "priority": draw(st.integers(0, 3)),
                "limits": {
                    k: v
                    for k, v in (("max_running", draw(_limit)), ("max_gpus", draw(_glimit)))
                    if v is not None
                },
            }
            for q in ("a", "b")
        ],
    )
    pipes = {p: Limits(max_running=draw(_limit), max_gpus=draw(_glimit)) for p in ("p1", "p2")}
    shapes = st.tuples(
        st.sampled_from(["a", "b"]), st.sampled_from([None, "p1", "p2"]), st.sampled_from([0, 1, 2, 4])
    )
    cs = [
        Candidate(
            workload_id=f"c{i}",
            queue=q,
            pipeline=p,
            pipeline_limits=pipes[p] if p else Limits(),
            gpus=g,
            priority=draw(st.integers(0, 2)),
            submitted_at=draw(st.integers(0, 5)),
        )
        for i, (q, p, g) in enumerate(draw(st.lists(shapes, max_size=12)))
    ]
    return policy, [], cs


def _within(policy: object, run: list[Running], cs: dict[str, Candidate]) -> None:
    t = Tally.of(run)
    for (scope, name), n in t.running.items():
        if scope == "organisation":
            lim = policy.organisation  # type: ignore[attr-defined]
        elif scope == "queue":
            lim = policy.queue(name).limits  # type: ignore[attr-defined]
        else:
            lim = next(c.pipeline_limits for c in cs.values() if c.pipeline == name)
        assert lim.max_running is None or n <= lim.max_running, (scope, name)
        assert lim.max_gpus is None or t.gpus[(scope, name)] <= lim.max_gpus + 1e-9, (scope, name)


@given(world=worlds(), data=st.data())
@settings(max_examples=200, deadline=None)
def test_limits_are_never_exceeded_and_held_work_is_released_when_a_slot_frees(
    world: tuple[object, list[Running], list[Candidate]], data: st.DataObject
) -> None:
    policy, run, waiting = world
    by_id = {c.workload_id: c for c in waiting}
    run = list(run)
    for _ in range(len(waiting) + 2):
        vs = pl.admit(policy, run, [], waiting, NOW)  # type: ignore[arg-type]
        newly = [v for v in vs if isinstance(v, Released)]
        run += [Running(v.workload_id, v.queue, by_id[v.workload_id].gpus, v.pipeline) for v in newly]
        _within(policy, run, by_id)  # released work never exceeds a limit
        held = [v for v in vs if isinstance(v, Held)]
        tally = Tally.of(run)
        for h in held:  # work-conserving: nothing left held that would fit now
            assert isinstance(pl.admission(policy, tally, [], by_id[h.workload_id], NOW), Held)  # type: ignore[arg-type]
        waiting = [by_id[h.workload_id] for h in held]
        if not run:
            break
        run.remove(data.draw(st.sampled_from(run)))  # a slot frees: the next round releases what fits


@given(world=worlds())
@settings(max_examples=100, deadline=None)
def test_of_identical_candidates_the_earlier_ones_are_released_first(
    world: tuple[object, list[Running], list[Candidate]],
) -> None:
    policy, run, cs = world
    twins = [
        replace(c, queue="a", pipeline="p1", gpus=cs[0].gpus, priority=0) for c in cs[:1] for _ in range(6)
    ]
    twins = [replace(t, workload_id=f"t{i}", submitted_at=i) for i, t in enumerate(twins)]
    vs = pl.admit(policy, run, [], twins, NOW)  # type: ignore[arg-type]
    released = [isinstance(v, Released) for v in vs]
    assert released == sorted(released, reverse=True)  # a prefix of the order
