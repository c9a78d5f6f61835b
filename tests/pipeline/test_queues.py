"""`gpuorch queues` (`gpuorch_router.queues`): the report is read from the log the router's own
rounds wrote, folded as the CLI folds it (`queues.fold`), never from a copy of a rule.

Each test runs the router's gate (`core.gate_round`, through test_gate's `Log`) on a policy, keeps
every event it published and every other service's event in stream order, and checks the report
against what the rules decided."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuorch_proto import ClusterSnapshot
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_router import queues as qs
from tests.support.builders import make_node, make_queue, make_snapshot

from .builders import NOW, make_policy, make_workload, research
from .test_gate import Log as GateLog


class Log(GateLog):
    """test_gate's router log, keeping the stream (sequence, event) the CLI reads."""

    def __init__(self, policy: AdmissionPolicy, time_scale: float = 1.0) -> None:
        super().__init__(policy, time_scale)
        self.stream: list[tuple[int, Any]] = []

    def echo(self, events: list[Any]) -> None:
        for e in events:
            seq = next(self.seq)
            self.stream.append((seq, e))
            self.gate.apply(e, seq)
            self.state.apply(e, seq)

    def start(self, wid: str) -> None:
        """The dispatcher's attempt for `wid` is created and its pods run."""
        a = {"workload_id": wid, "at": self.now, "attempt_id": f"{wid}-a1", "epoch": 1, "cluster": "primary"}
        self.echo([
            ev.AttemptCreated(event_id=f"{wid}-a1.attempt-created", attempt_number=1, job_name=f"{wid}-a1",
                              output_path=f"/o/{wid}", checkpoint_path=f"/c/{wid}", **a),
            ev.Running(event_id=f"{wid}-a1.running", **a),
        ])  # fmt: skip

    def finish(self, wid: str) -> None:
        a = {"workload_id": wid, "at": self.now, "attempt_id": f"{wid}-a1", "epoch": 1, "cluster": "primary"}
        self.echo([ev.Succeeded(event_id=f"{wid}-a1.succeeded", output_path=f"/o/{wid}", **a)])
        self.lifecycle(wid, "completed")
        self.round()

    def report(self, snapshots: dict[str, ClusterSnapshot] | None = None, **kw: Any) -> qs.QueuesReport:
        gate, projection = qs.fold(self.stream)  # from the log alone, as `gpuorch queues` does
        return qs.queues_report(self.policy, gate, projection, snapshots or {}, self.now, time_scale=self.time_scale, **kw)


def gpu_job(name: str, gpus: float = 1, queue: str = "research", owner: str = "team-a", **spec: Any) -> Any:
    return make_workload(name, owner=owner, policy_queue=queue, resources={"gpus": gpus}, **spec)


def queue(report: qs.QueuesReport, name: str) -> qs.QueueUse:
    return next(q for q in report.queues if q.name == name)


def owner(q: qs.QueueUse, name: str) -> qs.OwnerUse:
    return next(o for o in q.owners if o.owner == name)


def limit(uses: list[qs.LimitUse], kind: str) -> tuple[float, float | None]:
    u = next(u for u in uses if u.kind == kind)
    return u.used, u.limit


def reasons(held: list[qs.HeldReason]) -> dict[tuple[str, str, str], int]:
    return {(r.scope, r.name, r.kind): r.workloads for r in held}


# ---- limits and their use -----------------------------------------------------------------


def test_limits_show_what_released_work_holds_and_the_next_release_after_a_finish() -> None:
    log = Log(make_policy(organisation={"max_gpus": 10}, queues=[{"name": "default"}, {"name": "research", "limits": {"max_running": 2, "max_gpus": 8}}]))
    for i in range(4):
        log.submit(f"w{i}", gpu_job(f"w{i}", gpus=3))
    r = log.report()
    q = queue(r, "research")
    assert limit(q.limits, "running") == (2, 2) and limit(q.limits, "gpus") == (6, 8)
    assert limit(r.organisation, "gpus") == (6, 10) and limit(r.organisation, "running") == (2, None)
    assert (q.released, q.waiting, q.held, q.gpus) == (2, 2, 2, 6)
    assert limit(queue(r, "default").limits, "running") == (0, None)

    log.now += 60
    log.finish("w0")  # frees a slot: the router's round releases w2 at once
    q = queue(log.report(), "research")
    assert (q.released, q.waiting, q.held) == (2, 1, 1)
    assert limit(q.limits, "running") == (2, 2)


def test_released_and_running_are_told_apart_by_the_attempts_on_the_clusters() -> None:
    log = Log(research(max_gpus=None, max_running=3))
    for i in range(3):
        log.submit(f"w{i}", gpu_job(f"w{i}", owner="team-a" if i else "team-b"))
    log.start("w1")
    q = queue(log.report(), "research")
    assert (q.released, q.running) == (3, 1)
    assert (owner(q, "team-a").released, owner(q, "team-a").running) == (2, 1)
    assert (owner(q, "team-b").released, owner(q, "team-b").running) == (1, 0)


# ---- budgets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time_scale", "ran_for"),
    [pytest.param(1.0, 1800.0, id="production-clock"), pytest.param(600.0, 3.0, id="local-clusters-at-600x")],
)
def test_budget_use_is_the_gpu_hours_the_router_counts_inside_the_window(time_scale: float, ran_for: float) -> None:
    """2 GPUs for half a (simulated) hour: 1 GPU-hour of a budget of 3 per 1h spent, 2 left."""
    log = Log(research(max_gpus=None, budget={"gpu_hours": 3, "window": "1h"}), time_scale=time_scale)
    log.submit("a", gpu_job("a", gpus=2))
    log.start("a")
    log.now += ran_for
    log.finish("a")
    b = queue(log.report(), "research").budget
    assert b is not None and (b.gpu_hours, b.window) == (3, "1h")
    assert b.spent == pytest.approx(1.0) and b.left == pytest.approx(2.0)
    assert queue(log.report(), "default").budget is None, "a queue without a budget shows none"


def test_running_work_counts_against_the_budget_until_now() -> None:
    log = Log(research(max_gpus=None, budget={"gpu_hours": 10, "window": "1h"}))
    log.submit("a", gpu_job("a", gpus=4))
    log.start("a")
    log.now += 900
    b = queue(log.report(), "research").budget
    assert b is not None and b.spent == pytest.approx(1.0), "4 GPUs for a quarter hour, still running"


# ---- held, counted by reason ----------------------------------------------------------------


def test_held_work_is_counted_by_each_limit_that_holds_it_per_queue_and_per_owner() -> None:
    log = Log(make_policy(
        organisation={"max_gpus": 4},
        queues=[{"name": "default"}, {"name": "research", "limits": {"max_running": 2}}],
    ))  # fmt: skip
    log.submit("w1", gpu_job("w1", gpus=2))
    log.submit("w2", gpu_job("w2", gpus=2))  # organisation at 4 of 4 GPUs; research at 2 of 2 running
    log.submit("w3", gpu_job("w3", owner="team-a"))
    log.submit("w4", gpu_job("w4", owner="team-b"))
    log.submit("d1", gpu_job("d1", queue="default", owner="team-b"))
    r = log.report()
    research_q, default_q = queue(r, "research"), queue(r, "default")
    assert reasons(research_q.held_reasons) == {
        ("organisation", "", "gpus"): 2,
        ("queue", "research", "running"): 2,
    }
    assert reasons(default_q.held_reasons) == {("organisation", "", "gpus"): 1}
    assert (research_q.held, default_q.held) == (2, 1)
    assert reasons(owner(research_q, "team-b").held_reasons) == {
        ("organisation", "", "gpus"): 1, ("queue", "research", "running"): 1,
    }  # fmt: skip
    assert {x.reason for x in research_q.held_reasons} == {"organisation: GPUs", "queue research: running workloads"}
    # the reasons are those of the latest `held` in the log
    held = [e for _, e in log.stream if isinstance(e, ev.Held) and e.workload_id == "w3"]
    assert {(h.scope, h.name, h.kind) for h in held[-1].holds} == {("organisation", "", "gpus"), ("queue", "research", "running")}


def test_work_released_after_being_held_is_no_longer_counted_held() -> None:
    log = Log(research(max_gpus=None, max_running=1))
    log.submit("w1", gpu_job("w1"))
    log.submit("w2", gpu_job("w2"))
    assert queue(log.report(), "research").held == 1
    log.now += 10
    log.finish("w1")
    q = queue(log.report(), "research")
    assert (q.held, q.waiting, q.released, q.held_reasons) == (0, 0, 1, [])


# ---- fair share -----------------------------------------------------------------------------

SNAP = {"primary": make_snapshot("primary", nodes=[make_node("primary-0", gpus=8, free=0)], observed_at=NOW)}


@pytest.mark.parametrize(
    ("weights", "first"),
    [
        pytest.param({}, "light", id="equal-weights-the-owner-who-used-less-goes-first"),
        pytest.param({"heavy": 4}, "heavy", id="weight-4-outweighs-twice-the-use"),
    ],
)
def test_fair_share_standing_and_who_admission_serves_next(weights: dict[str, float], first: str) -> None:
    """`heavy` runs 2 GPUs, `light` 1 (both 1 h expected); the queue is full, both have work held.
    The owner with the lower weighted share is next: `light` at equal weights, `heavy` when its
    weight (4) more than makes up for using twice as much."""
    log = Log(research(max_gpus=3, fair_share={"weights": weights, "window": "1d"}))
    log.submit("h1", gpu_job("h1", gpus=2, owner="heavy", expected_runtime="1h"))
    log.submit("l1", gpu_job("l1", gpus=1, owner="light", expected_runtime="1h"))
    log.start("h1")
    log.start("l1")
    log.now += 5
    log.submit("h2", gpu_job("h2", owner="heavy", expected_runtime="1h"))
    log.submit("l2", gpu_job("l2", owner="light", expected_runtime="1h"))
    q = queue(log.report(SNAP), "research")
    assert q.fair_share and q.held == 2
    heavy, light = owner(q, "heavy").fair_share, owner(q, "light").fair_share
    assert heavy is not None and light is not None
    assert heavy.weight == weights.get("heavy", 1.0) and light.weight == 1.0
    assert heavy.share is not None and light.share is not None
    assert heavy.share * heavy.weight == pytest.approx(2 * light.share * light.weight), "twice the use, unweighted"
    assert {"heavy": heavy.next, "light": light.next}[first] == 1
    assert sorted([heavy.next, light.next]) == [1, 2]  # type: ignore[type-var]


def test_fair_share_without_a_snapshot_says_the_share_is_unknown_and_a_queue_without_it_shows_none() -> None:
    log = Log(make_policy(queues=[{"name": "default"}, {"name": "research", "fair_share": {}}]))
    log.submit("w", gpu_job("w"))
    log.submit("d", gpu_job("d", queue="default"))
    r = log.report()
    st = owner(queue(r, "research"), "team-a").fair_share
    assert st is not None and st.share is None and st.next is None, "nothing waits: no place in line"
    assert owner(queue(r, "default"), "team-a").fair_share is None
    assert any("fair-share shares unknown" in n for n in r.notes)


# ---- oldest waiting ------------------------------------------------------------------------------


def test_the_oldest_waiting_is_the_earliest_submitted_not_released_per_queue_and_owner() -> None:
    log = Log(research(max_gpus=None, max_running=1))
    log.submit("first", gpu_job("first"))  # released: not waiting
    log.now += 10
    log.submit("b1", gpu_job("b1", owner="team-b"))
    log.now += 10
    log.submit("a1", gpu_job("a1", owner="team-a"))
    log.now += 10
    log.submit("b2", gpu_job("b2", owner="team-b"))
    log.now += 100
    q = queue(log.report(), "research")
    assert q.oldest_waiting is not None
    assert (q.oldest_waiting.workload_id, q.oldest_waiting.waiting_seconds) == ("b1", 120)
    assert q.oldest_waiting.submitted_at == NOW + 10
    a = owner(q, "team-a").oldest_waiting
    assert a is not None and (a.workload_id, a.waiting_seconds) == ("a1", 110)
    assert queue(log.report(), "default").oldest_waiting is None


# ---- cluster queues -------------------------------------------------------------------------------


def test_cluster_queues_show_pending_demand_and_the_wait_inventory_published() -> None:
    snaps = {
        "primary": make_snapshot("primary", queues=[make_queue("default", wait="2h", pending_gpus=64, pending_jobs=8)],
                                 observed_at=NOW - 3),
        "spare": make_snapshot("spare", reachable=False, error="unreachable: connection refused", observed_at=NOW - 90),
    }  # fmt: skip
    log = Log(AdmissionPolicy())
    r = log.report(snaps)
    primary = next(c for c in r.clusters if c.cluster == "primary")
    assert (primary.queue, primary.pending_jobs, primary.pending_gpus, primary.estimated_wait_seconds) == ("default", 8, 64, 7200)
    assert primary.reachable and primary.snapshot_age_seconds == pytest.approx(3)
    spare = next(c for c in r.clusters if c.cluster == "spare")
    assert (spare.queue, spare.reachable, spare.estimated_wait_seconds) == (None, False, None)
    assert spare.error == "unreachable: connection refused" and spare.snapshot_age_seconds == pytest.approx(90)
    assert not any("no capacity snapshot" in n for n in r.notes)


def test_no_snapshot_yet_is_said_not_crashed_on() -> None:
    r = Log(AdmissionPolicy()).report({})
    assert r.clusters == [] and any("no capacity snapshot yet: no cluster queues" in n for n in r.notes)
    assert "note: no capacity snapshot yet" in qs.render(r)


# ---- missing data, the contract, the table ------------------------------------------------------


def test_work_in_a_queue_the_policy_shown_does_not_have_is_shown_as_such() -> None:
    log = Log(research(max_gpus=None, max_running=1))
    log.submit("w1", gpu_job("w1"))
    log.submit("w2", gpu_job("w2"))
    gate, projection = qs.fold(log.stream)
    r = qs.queues_report(AdmissionPolicy(), gate, projection, {}, log.now)  # e.g. `--policy` of another file
    q = queue(r, "research")
    assert not q.in_policy and (q.released, q.held) == (1, 1)
    assert any("queue research" in n and "no such queue" in n for n in r.notes)
    assert "NOT IN THE POLICY SHOWN" in qs.render(r)


def test_the_json_field_names_are_stable() -> None:
    log = Log(research(max_gpus=None, max_running=1, budget={"gpu_hours": 5}, fair_share={}))
    log.submit("w1", gpu_job("w1"))
    log.submit("w2", gpu_job("w2"))
    doc = msgspec.json.decode(msgspec.json.encode(log.report(SNAP)))
    assert list(doc) == ["at", "policy", "time_scale", "organisation", "queues", "clusters", "notes"]
    q = next(x for x in doc["queues"] if x["name"] == "research")
    assert list(q) == ["name", "in_policy", "priority", "may_submit", "limits", "budget", "fair_share", "released",
                       "running", "gpus", "waiting", "held", "held_reasons", "oldest_waiting", "owners"]  # fmt: skip
    assert list(q["owners"][0]) == ["owner", "released", "running", "gpus", "waiting", "held", "held_reasons",
                                    "oldest_waiting", "fair_share"]  # fmt: skip
    assert list(q["owners"][0]["fair_share"]) == ["weight", "share", "next"]
    assert list(q["held_reasons"][0]) == ["scope", "name", "kind", "workloads", "reason"]
    assert list(q["budget"]) == ["gpu_hours", "window", "spent", "left"]
    assert list(doc["clusters"][0]) == ["cluster", "queue", "reachable", "snapshot_age_seconds", "pending_jobs",
                                        "pending_gpus", "estimated_wait_seconds", "time_scale", "error"]  # fmt: skip


def test_the_table_names_each_figure() -> None:
    log = Log(research(max_gpus=4, max_running=1, budget={"gpu_hours": 5, "window": "7d"}), time_scale=600)
    log.submit("w1", gpu_job("w1", gpus=2))
    log.submit("w2", gpu_job("w2"))
    snaps = {"primary": make_snapshot("primary", queues=[make_queue("default", wait="2h", pending_gpus=64, pending_jobs=8)], observed_at=NOW)}
    text = qs.render(log.report(snaps, policy_source="policy.yaml"))
    assert "admission policy: policy.yaml (time scale 600" in text
    assert "queue research (priority 0; may submit: *)" in text
    assert "limits:  running 1 of 1, GPUs 2 of 4" in text
    assert "budget:  0 of 5 GPU-hours spent in the last 168h (5 left)" in text
    assert "work:    1 released (0 running, 2 GPUs), 1 waiting (1 held); oldest waiting: w2 (0s)" in text
    assert "held:    1 x queue research: running workloads" in text
    assert "primary  default  yes" in text and "2h" in text
