"""Fair share across all clusters (issue 13, item 5): the pure core `gpuorch_router.fairshare`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.policy import AdmissionPolicy, FairShare, PolicyError, QueuePolicy
from gpuorch_router import fairshare as fs
from gpuorch_router import pipeline as pl

NOW = 1_000_000.0
HOUR = 3600.0


def fair_policy(
    weights: dict[str, float] | None = None, *, window: str = "24h", quantum: str = "1h", **limits: float
) -> AdmissionPolicy:
    q = QueuePolicy(
        name="default", fair_share=FairShare(weights=weights or {}, window=window, quantum=quantum)
    )
    org = pl.Limits(**{k: v for k, v in limits.items()})  # type: ignore[arg-type]
    return AdmissionPolicy(organisation=org, queues=[q])


def cand(
    wid: str,
    owner: str,
    *,
    gpus: float = 1,
    at: float = NOW,
    priority: int = 0,
    hours: float = 0.0,
    queue: str | None = None,
) -> pl.Candidate:
    return pl.Candidate(
        workload_id=wid,
        owner=owner,
        gpus=gpus,
        submitted_at=at,
        priority=priority,
        gpu_hours=gpus * hours,
        queue=queue,
    )


def burst(owner: str, n: int, at: float, **kw: float) -> list[pl.Candidate]:
    return [cand(f"{owner}-{i:03d}", owner, at=at + i, **kw) for i in range(n)]  # type: ignore[arg-type]


CAP = fs.Vec(gpus=16)


def released_owners(verdicts: list[pl.Verdict], owner_of: dict[str, str]) -> list[str]:
    return [owner_of[v.workload_id] for v in verdicts if isinstance(v, pl.Released)]


# ---- the share itself -------------------------------------------------------------------


def test_dominant_share_is_the_largest_resource_fraction_over_the_window() -> None:
    cap = fs.Vec(gpus=10, cpu=100, memory_gib=1000)
    used = fs.Vec(gpus=1, cpu=50, memory_gib=10).scale(HOUR)  # 10 % of GPUs, 50 % of CPU, 1 % of memory
    assert fs.dominant_share(used, cap, HOUR) == pytest.approx(0.5)
    assert fs.dominant_share(used, fs.Vec(gpus=10), HOUR) == pytest.approx(0.1)  # unknown CPU: left out


def test_resource_seconds_clip_to_the_window_and_running_work_counts_what_it_is_committed_to() -> None:
    v = fs.Vec(gpus=2)
    old = fs.Use("a", "q", v, start=NOW - 10 * HOUR, end=NOW - 5 * HOUR)
    assert fs.resource_seconds(old, 4 * HOUR, HOUR, NOW).gpus == 0  # left the window
    half = fs.Use("a", "q", v, start=NOW - 6 * HOUR, end=NOW - 2 * HOUR)
    assert fs.resource_seconds(half, 4 * HOUR, HOUR, NOW).gpus == 2 * 2 * HOUR  # (now-4h, now-2h]
    just_started = fs.Use("a", "q", v, start=NOW - 60)
    assert fs.resource_seconds(just_started, 4 * HOUR, HOUR, NOW).gpus == 2 * HOUR  # at least the quantum
    declared = fs.Use("a", "q", v, start=NOW - 60, expected=3 * HOUR)
    assert fs.resource_seconds(declared, 4 * HOUR, HOUR, NOW).gpus == 2 * 3 * HOUR
    overran = fs.Use("a", "q", v, start=NOW - 2 * HOUR, expected=HOUR)
    assert fs.resource_seconds(overran, 4 * HOUR, HOUR, NOW).gpus == 2 * 2 * HOUR  # what it really used


def test_usage_on_every_cluster_counts_towards_one_share() -> None:
    # the Use carries no cluster: an owner's work on primary and on burst is one owner's use
    uses = [fs.Use("a", "default", fs.Vec(gpus=4), NOW - 2 * HOUR, NOW - HOUR) for _ in range(2)]
    q = fair_policy().queues[0]
    shares = fs.weighted_shares(fs.Usage(uses, CAP), q, NOW)
    assert shares["a"] == pytest.approx(8 * HOUR / (16 * 24 * HOUR))


# ---- the order --------------------------------------------------------------------------


def test_a_200_trial_sweep_does_not_starve_another_owners_single_job() -> None:
    policy = fair_policy(max_gpus=16)
    sweep = burst("sweeper", 200, NOW - 600, gpus=2)
    single = [cand("solo-job", "solo", gpus=8, at=NOW)]  # submitted last
    owner_of = {c.workload_id: c.owner for c in sweep + single}
    fair = pl.admit(policy, [], [], sweep + single, NOW, fs.Usage((), CAP))
    assert "solo" in released_owners(fair, owner_of)
    fifo = pl.admit(policy, [], [], sweep + single, NOW)  # the same without fair share
    assert "solo" not in released_owners(fifo, owner_of)


def test_one_round_alternates_between_owners_of_equal_weight() -> None:
    policy = fair_policy(max_gpus=8)
    cs = burst("a", 20, NOW - 100) + burst("b", 20, NOW)
    owners = released_owners(
        pl.admit(policy, [], [], cs, NOW, fs.Usage((), CAP)), {c.workload_id: c.owner for c in cs}
    )
    assert sorted(owners) == ["a"] * 4 + ["b"] * 4


def test_the_owner_who_used_more_in_the_window_waits() -> None:
    policy = fair_policy(max_gpus=4)
    cs = burst("a", 4, NOW - 100) + burst("b", 4, NOW)
    used = [fs.Use("a", "default", fs.Vec(gpus=8), NOW - 5 * HOUR, NOW - HOUR)]  # 32 GPU-hours inside 24 h
    owners = released_owners(
        pl.admit(policy, [], [], cs, NOW, fs.Usage(used, CAP)), {c.workload_id: c.owner for c in cs}
    )
    assert owners == ["b"] * 4


def test_weights_divide_the_slots_in_proportion() -> None:
    policy = fair_policy({"a": 3.0, "b": 1.0}, max_gpus=8)
    cs = burst("a", 20, NOW) + burst("b", 20, NOW)
    owners = released_owners(
        pl.admit(policy, [], [], cs, NOW, fs.Usage((), CAP)), {c.workload_id: c.owner for c in cs}
    )
    assert owners.count("a") == 6 and owners.count("b") == 2


def test_dominant_resource_decides_a_cpu_heavy_owner_is_charged_by_cpu() -> None:
    policy = fair_policy(max_running=2)
    cap = fs.Vec(gpus=16, cpu=64)
    cs = [
        cand("cpu-0", "cpu-team", gpus=0, at=NOW - 10),
        cand("cpu-1", "cpu-team", gpus=0, at=NOW - 9),
        cand("gpu-0", "gpu-team", gpus=1, at=NOW),
    ]
    demand = {"cpu-0": fs.Vec(cpu=32), "cpu-1": fs.Vec(cpu=32), "gpu-0": fs.Vec(gpus=1, cpu=1)}
    owners = released_owners(
        pl.admit(policy, [], [], cs, NOW, fs.Usage((), cap, demand)), {c.workload_id: c.owner for c in cs}
    )
    assert sorted(owners) == ["cpu-team", "gpu-team"]  # half the CPU for one job is a large share


def test_queue_priority_comes_before_fair_share() -> None:
    policy = AdmissionPolicy(
        organisation=pl.Limits(max_gpus=2),
        queues=[QueuePolicy(name="default", fair_share=FairShare()), QueuePolicy(name="prod", priority=10)],
    )
    cs = [
        cand("r1", "b", at=NOW - 50),
        cand("r2", "c", at=NOW - 40),
        cand("p1", "a", queue="prod", at=NOW),
        cand("p2", "a", queue="prod", at=NOW + 1),
    ]
    got = [
        v.workload_id
        for v in pl.admit(policy, [], [], cs, NOW, fs.Usage((), CAP))
        if isinstance(v, pl.Released)
    ]
    assert got == ["p1", "p2"]


def test_fair_share_config_is_validated_with_its_path() -> None:
    with pytest.raises(PolicyError) as exc:
        load_policy_yaml("queues: [{name: default, fair_share: {weights: {a: -1}, quantum: 0s}}]")
    paths = {e.path for e in exc.value.errors}
    assert paths == {"queues[0].fair_share.weights.a", "queues[0].fair_share.quantum"}
    with pytest.raises(PolicyError):
        load_policy_yaml("queues: [{name: default, fair_share: {weight: {a: 1}}}]")  # unknown field


# ---- properties -------------------------------------------------------------------------

owners_st = st.sampled_from(["a", "b", "c"])


@st.composite
def candidates(draw: st.DrawFn) -> list[pl.Candidate]:
    n = draw(st.integers(0, 30))
    return [
        cand(
            f"w{i:02d}",
            draw(owners_st),
            gpus=draw(st.sampled_from([0, 1, 2, 8])),
            at=NOW - draw(st.integers(0, 1000)),
            priority=draw(st.integers(0, 2)),
            hours=draw(st.sampled_from([0.0, 1.0, 3.0])),
            queue=draw(st.sampled_from([None, "prod"])),
        )
        for i in range(n)
    ]


POLICY = AdmissionPolicy(
    queues=[
        QueuePolicy(name="default", fair_share=FairShare(weights={"a": 2.0})),
        QueuePolicy(name="prod", priority=5),
    ]
)


@given(cs=candidates())
@settings(max_examples=200, deadline=None)
def test_without_usage_the_order_is_the_admission_order(cs: list[pl.Candidate]) -> None:
    key = lambda c: pl.order_key(POLICY, c)  # noqa: E731
    assert list(fs.FairOrder(POLICY, cs, None, NOW, key)) == sorted(cs, key=key)


@given(cs=candidates(), charged=st.lists(st.booleans(), min_size=30, max_size=30))
@settings(max_examples=200, deadline=None)
def test_every_candidate_comes_exactly_once_and_each_owner_keeps_its_own_order(
    cs: list[pl.Candidate], charged: list[bool]
) -> None:
    key = lambda c: pl.order_key(POLICY, c)  # noqa: E731
    order = fs.FairOrder(POLICY, cs, fs.Usage((), CAP), NOW, key)
    got = []
    for i, c in enumerate(order):
        got.append(c)
        if charged[i]:
            order.charge(c)
    assert sorted(c.workload_id for c in got) == sorted(c.workload_id for c in cs)
    for owner in ("a", "b", "c"):
        mine = [c for c in got if c.owner == owner and c.queue is None]
        assert mine == sorted(mine, key=key)
    # a higher-priority queue's work always comes first
    prods = [i for i, c in enumerate(got) if c.queue == "prod"]
    assert prods == list(range(len(prods)))


@given(n=st.integers(1, 40), wa=st.integers(1, 4), wb=st.integers(1, 4))
@settings(max_examples=100, deadline=None)
def test_releases_track_the_weights_at_every_step(n: int, wa: int, wb: int) -> None:
    """Identical work, no usage yet: after each release, each owner's count stays within one
    job of its weighted proportion (the share chosen is always the lowest)."""
    policy = fair_policy({"a": float(wa), "b": float(wb)})
    cs = burst("a", n, NOW) + burst("b", n, NOW)
    order = fs.FairOrder(policy, cs, fs.Usage((), CAP), NOW, lambda c: pl.order_key(policy, c))
    counts = {"a": 0, "b": 0}
    for c in order:
        if counts["a"] == n or counts["b"] == n:
            break
        counts[c.owner] += 1
        order.charge(c)
        total = counts["a"] + counts["b"]
        assert abs(counts["a"] - total * wa / (wa + wb)) <= 1.0 + 1e-9


def test_the_router_builds_usage_from_the_projection_across_clusters() -> None:
    from gpuorch.projection import Projection
    from gpuorch_proto import RoutingDecision, workload_from_obj
    from gpuorch_proto import events as ev
    from gpuorch_proto.inventory import ClusterSnapshot, NodeInfo

    digest = "example.org/train@sha256:" + "ab" * 32
    p = Projection()
    seq = 0
    for wid, owner, cluster in (("a1", "a", "primary"), ("a2", "a", "burst"), ("b1", "b", "primary")):
        wl = workload_from_obj(
            {
                "metadata": {"name": wid, "owner": owner},
                "spec": {
                    "image": digest,
                    "command": ["python", "run.py"],
                    "resources": {"gpus": 2, "cpu": "8", "memory": "32Gi"},
                },
            }
        )
        d = RoutingDecision(workload_id=wid, decided_at=NOW, outcome="routed", cluster=cluster, summary="ok")
        for e in (
            ev.Submitted(workload_id=wid, at=NOW, workload=wl),
            ev.Routed(workload_id=wid, at=NOW, decision=d),
            ev.AttemptCreated(
                workload_id=wid,
                at=NOW,
                attempt_id=f"{wid}-a1",
                epoch=1,
                cluster=cluster,
                attempt_number=1,
                job_name=f"{wid}-a1",
                output_path="/o",
                checkpoint_path="/c",
            ),
            ev.Running(workload_id=wid, at=NOW - HOUR, attempt_id=f"{wid}-a1", epoch=1, cluster=cluster),
        ):
            seq += 1
            p.apply(e, seq)  # type: ignore[arg-type]
    snaps = [
        ClusterSnapshot(
            cluster=c,
            reachable=True,
            observed_at=NOW,
            published_at=NOW,
            nodes=[NodeInfo(name="n", gpus_allocatable=8, cpu_free=64, memory_free=512 * 1024**3)],
        )
        for c in ("primary", "burst")
    ]
    assert fs.usage_of(p.workloads, AdmissionPolicy(), snaps) is None  # no queue has fair share
    usage = fs.usage_of(p.workloads, fair_policy(), snaps)
    assert usage is not None and usage.capacity == fs.Vec(16, 128, 1024)
    assert usage.demand["b1"] == fs.Vec(2, 8, 32)
    shares = fs.weighted_shares(usage, fair_policy().queues[0], NOW)
    assert shares["a"] == pytest.approx(2 * shares["b"])  # a's work on both clusters counts as one owner's


# ---- the router's wiring: one unit of time, and released work in flight ---------------------

SCALE = 600.0  # the local clusters' simulated seconds per second


def test_on_scaled_clusters_history_and_commitments_are_counted_in_the_events_seconds() -> None:
    """On the local clusters (600 simulated seconds per second) a 40 m job runs 4 s. `a` had all
    8 GPUs for 8 s (64 GPU-s, finished); `b` nothing. b's 2-GPU jobs (40 m each: 8 GPU-s) are
    released until b's commitments catch a's history up: 8 of them before a's next. Counted in
    simulated seconds, each of b's commitments (2 x 2400) outweighed all of a's history, and a
    got the second slot: its lead was never given back."""
    policy = fair_policy(window="7d")
    history = [fs.Use("a", "default", fs.Vec(gpus=8), start=NOW - 10, end=NOW - 2)]
    cs = burst("a", 10, NOW, gpus=1, hours=2400 / HOUR) + burst("b", 10, NOW + 100, gpus=2, hours=2400 / HOUR)

    def first_owners(usage: fs.Usage) -> list[str]:
        order = fs.FairOrder(policy, cs, usage, NOW, lambda c: pl.order_key(policy, c))
        out = []
        for c in order:
            out.append(c.owner)
            order.charge(c)
        return out[:9]

    scaled = first_owners(fs.Usage(history, fs.Vec(gpus=8), time_scale=SCALE))
    assert scaled == ["b"] * 8 + ["a"], scaled
    unscaled = first_owners(fs.Usage(history, fs.Vec(gpus=8)))  # the units mixed, as before
    assert unscaled[:2] == ["b", "a"], unscaled


def test_a_running_jobs_commitment_and_the_quantum_are_scaled_to_the_events_seconds() -> None:
    v = fs.Vec(gpus=2)
    view = projection_of(("w", "a", "primary", "40m", ["running"]))
    (u,) = fs.uses_of(view.workloads.values(), fair_policy(), SCALE)
    assert u.expected == 4.0  # 40 simulated minutes: 4 s of the events' clock
    q = fs.clock_seconds("1h", SCALE)
    assert q == 6.0 and fs.resource_seconds(fs.Use("a", "q", v, start=NOW - 1), 1e6, q, NOW).gpus == 2 * 6.0


def projection_of(*specs: tuple[str, str, str, str, list[str]]) -> Any:
    """Workloads (id, owner, cluster, expected run time, what happened) folded into a projection:
    'released', then an attempt created and 'running', 'succeeded', 'failed', 'cancel'."""
    from gpuorch.projection import Projection
    from gpuorch_proto import RoutingDecision, workload_from_obj
    from gpuorch_proto import events as ev

    p = Projection()
    seq = 0
    for wid, owner, cluster, expected, steps in specs:
        wl = workload_from_obj({
            "metadata": {"name": wid, "owner": owner},
            "spec": {"image": "example.org/train@sha256:" + "ab" * 32, "command": ["python", "run.py"],
                     "resources": {"gpus": 2, "cpu": "8", "memory": "32Gi"}, "expected_runtime": expected},
        })  # fmt: skip
        a = dict(workload_id=wid, attempt_id=f"{wid}-a1", epoch=1, cluster=cluster)
        d = RoutingDecision(workload_id=wid, decided_at=NOW, outcome="routed", cluster=cluster, summary="ok")
        events: list[Any] = [ev.Submitted(workload_id=wid, at=NOW - 30, workload=wl),
                             ev.Released(workload_id=wid, at=NOW - 20, queue="default", gpus=2)]  # fmt: skip
        for step in steps:
            if step == "running":
                events += [ev.Routed(workload_id=wid, at=NOW - 20, decision=d),
                           ev.AttemptCreated(at=NOW - 20, attempt_number=1, job_name=f"{wid}-a1", output_path="/o",
                                             checkpoint_path="/c", **a),
                           ev.Running(at=NOW - 10, **a)]  # fmt: skip
            elif step == "succeeded":
                events.append(ev.Succeeded(at=NOW - 5, output_path="/o", **a))
            elif step == "failed":
                events.append(ev.Failed(at=NOW - 5, reason="oom", **a))
            elif step == "cancel":
                events.append(ev.CancelRequested(workload_id=wid, at=NOW - 5, reason="no"))
        for e in events:
            seq += 1
            p.apply(e, seq)
    return p


def test_released_work_not_running_yet_counts_its_commitment_and_nothing_more() -> None:
    """Between its release and its pods' start (routing, the Job, image pulls) a workload holds
    its slot: it counts what it is committed to (its expected run time), however long it waits,
    as the round that released it charged it. So the next round does not hand the owner with the
    most work in flight another slot. Work that ran and awaits promotion, or is being cancelled,
    is not charged again; work that failed and will run again is."""
    p = projection_of(
        ("in-flight", "a", "primary", "40m", []),
        ("promoting", "a", "primary", "40m", ["running", "succeeded"]),
        ("retrying", "b", "burst", "40m", ["running", "failed"]),
        ("cancelling", "b", "burst", "40m", ["cancel"]),
    )
    uses = fs.uses_of(p.workloads.values(), fair_policy(), SCALE)
    pending = {(u.owner, u.expected) for u in uses if u.start == fs.NOT_STARTED}
    assert pending == {("a", 4.0), ("b", 4.0)}, uses  # in-flight and retrying; not promoting, not cancelling
    (u,) = [u for u in uses if u.start == fs.NOT_STARTED and u.owner == "a"]
    for now in (NOW, NOW + 3600):  # however long it waits
        assert fs.resource_seconds(u, 7 * 86400, 6.0, now).gpus == 2 * 4.0
    ran = [u for u in uses if u.start != fs.NOT_STARTED]
    assert sorted(u.end - u.start for u in ran) == [5.0, 5.0]  # type: ignore[operator]
