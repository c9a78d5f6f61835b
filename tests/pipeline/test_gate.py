"""The gate (`pipeline.Gate`, `core.gate_round`): the router's fold of everything before routing,
and the round the service and the deterministic simulation both call. Pure: events in, events out.

A log is simulated the way the router sees it: what a round publishes is noted at once, and the
log's echo (with a stream sequence) changes nothing; lifecycle events of other services are
folded in as they would arrive."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuorch_proto import RoutingDecision, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_router import core
from gpuorch_router import pipeline as pl

from .builders import NOW, make_dag, make_policy, make_sweep, make_workload, research


def routed(wl: Workload, wid: str) -> RoutingDecision:
    return RoutingDecision(workload_id=wid, decided_at=NOW, outcome="routed", cluster="primary", summary="primary")


class Log:
    """The router's view: a gate, its RouterState, a stream sequence, and what was published."""

    def __init__(self, policy: AdmissionPolicy, time_scale: float = 1.0) -> None:
        self.policy = policy
        self.time_scale = time_scale  # the registry's, as the router passes it
        self.gate = pl.Gate()
        self.state = core.RouterState()
        self.seq = itertools.count(1)
        self.published: list[ev.Base] = []
        self.cancels: list[ev.Cancel] = []
        self.now = NOW

    def echo(self, events: list[Any]) -> None:
        for e in events:
            seq = next(self.seq)
            self.gate.apply(e, seq)
            self.state.apply(e, seq)

    def round(self, *, force: bool = False) -> pl.GateRound:
        r = core.gate_round(
            self.gate, self.policy, self.state, routed, self.now, force=force, time_scale=self.time_scale
        )
        self.published += r.events
        self.cancels += r.cancels
        self.echo(r.events)
        # the tally the gate keeps as work is released and finishes is the one its running holds
        assert self.gate.tally() == pl.Tally.of(self.gate.running.values())
        return r

    def submit(self, wid: str, wl: Workload, identity: str | None = None) -> pl.GateRound:
        """As the router's `on_command`: `Gate.accept`, then a round."""
        sub = ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=self.now, workload=wl)
        accepted = self.gate.accept(self.policy, sub, identity, self.now)
        self.published += accepted
        self.echo(accepted)
        return self.round()

    def lifecycle(self, wid: str, *kinds: str) -> None:
        """Other services' events for `wid`'s first attempt (running, promoted, completed, failed)."""
        a = {"workload_id": wid, "at": self.now, "attempt_id": f"{wid}-a1", "epoch": 1, "cluster": "primary"}
        out: list[Any] = []
        for k in kinds:
            if k == "running":
                out.append(ev.Running(event_id=f"{wid}-a1.running", **a))
            elif k == "promoted":
                out.append(ev.Promoted(event_id=f"{wid}-a1.promoted", output_path=f"/o/{wid}", result_path=f"/r/{wid}", **a))
            elif k == "completed":
                out.append(ev.Completed(event_id=f"{wid}.completed", workload_id=wid, at=self.now, attempt_id=f"{wid}-a1", result_path=f"/r/{wid}"))
            elif k == "failed":
                out.append(ev.WorkloadFailed(event_id=f"{wid}.workload-failed", workload_id=wid, at=self.now, reason="exit code 2 is permanent"))
            elif k == "cancelled":
                out.append(ev.Cancelled(event_id=f"{wid}.cancelled", workload_id=wid, at=self.now, reason="cancelled"))
        self.echo(out)

    def kinds(self, wid: str) -> list[str]:
        return [ev.type_tag(e) for e in self.published if e.workload_id == wid]


def test_a_plain_workload_is_released_and_routed_in_one_round() -> None:
    log = Log(AdmissionPolicy())
    r = log.submit("w1", make_workload("w1"))
    assert [ev.type_tag(e) for e in r.events] == ["released", "routed"] and r.released == ["w1"]
    assert r.events[0].reason == "released: no limit applies"  # type: ignore[union-attr]
    assert log.round().events == [], "an unchanged gate publishes nothing"
    assert not log.gate.may_admit() and log.gate.may_admit(force=False) is False
    log.submit("w2", make_workload("w2"))
    assert not log.gate.may_admit(), "released at once: nothing waits"


def test_stages_become_ready_in_dependency_order_and_are_released_then() -> None:
    log = Log(AdmissionPolicy())
    wl = make_dag({"prep": [], "train": ["prep"], "eval": ["train", "prep"]}, gpus={"train": 8})
    log.submit("p", wl)
    assert log.kinds("p--prep") == ["submitted", "stage-ready", "released", "routed"]
    assert log.kinds("p--train") == ["submitted"] and "p" not in {e.workload_id for e in log.published if ev.type_tag(e) == "routed"}
    log.lifecycle("p--prep", "running", "promoted", "completed")
    log.round()
    assert log.kinds("p--train") == ["submitted", "stage-ready", "released", "routed"]
    ready = next(e for e in log.published if isinstance(e, ev.StageReady) and e.stage == "train")
    assert [(i.stage, i.attempt_id) for i in ready.inputs] == [("prep", "p--prep-a1")]
    assert log.kinds("p--eval") == ["submitted"]
    log.lifecycle("p--train", "running", "promoted", "completed")
    log.round()
    log.lifecycle("p--eval", "running", "promoted", "completed")
    log.round()
    end = [e for e in log.published if isinstance(e, ev.PipelineFinished)]
    assert len(end) == 1 and end[0].outcome == "completed"
    released = next(e for e in log.published if isinstance(e, ev.Released) and e.workload_id == "p--train")
    assert released.gpus == 8


def test_a_failed_stage_blocks_its_dependents_and_cancels_them_independent_branches_go_on() -> None:
    log = Log(AdmissionPolicy())
    log.submit("p", make_dag({"prep": [], "train": ["prep"], "eval": ["train"], "side": []}))
    log.lifecycle("p--prep", "running", "failed")
    r = log.round()
    blocked = {e.stage: e for e in r.events if isinstance(e, ev.StageBlocked)}
    assert set(blocked) == {"train", "eval"} and blocked["eval"].failed_stage == "prep"
    assert {c.workload_id for c in r.cancels} == {"p--train", "p--eval"}
    assert all("depends on stage prep" in c.reason for c in r.cancels)
    assert log.round().cancels == [], "a cancel is sent once"
    log.lifecycle("p--side", "running", "promoted", "completed")
    log.round()
    end = [e for e in log.published if isinstance(e, ev.PipelineFinished)]
    assert len(end) == 1 and end[0].outcome == "failed" and end[0].stages["side"] == "completed"


def test_cancelling_a_pipeline_cancels_every_unfinished_stage_and_releases_nothing_more() -> None:
    log = Log(AdmissionPolicy())
    log.submit("p", make_dag({"a": [], "b": ["a"], "c": []}))
    log.lifecycle("p--c", "running", "promoted", "completed")
    log.echo([ev.CancelRequested(event_id="p.cancel-requested", workload_id="p", at=NOW, reason="stop")])
    r = log.round()
    assert {c.workload_id for c in r.cancels} == {"p--a", "p--b"}
    assert all(c.reason == "pipeline p cancelled: stop" for c in r.cancels)
    log.lifecycle("p--a", "promoted", "completed")  # it finished before its cancel landed
    r = log.round()
    assert not any(isinstance(e, ev.StageReady) for e in r.events), "nothing becomes ready once cancelled"


def test_a_sweep_is_released_k_at_a_time_and_each_finish_releases_the_next_at_once() -> None:
    log = Log(make_policy())
    wl = make_sweep(grid={"i": list(range(12))}, limits={"max_running": 3})
    log.submit("s", wl)
    running = [e.workload_id for e in log.published if isinstance(e, ev.Released)]
    assert running == ["s--t0000", "s--t0001", "s--t0002"]
    held = [e for e in log.published if isinstance(e, ev.Held)]
    assert len(held) == 9 and held[0].reason == "held: pipeline s at 3 of 3 running workloads"
    assert not log.gate.may_admit(), "held work, nothing changed: no round can release anything"
    log.lifecycle(running[0], "running")
    assert not log.gate.may_admit(), "running changes no slot"
    for n in range(3, 12):
        log.lifecycle(running[n - 3], "running", "promoted", "completed")
        assert log.gate.may_admit(), "a slot freed"
        log.round()
        running = [e.workload_id for e in log.published if isinstance(e, ev.Released)]
        assert len(running) == n + 1, "one slot freed, one released, in the same round"
    assert len([e for e in log.published if isinstance(e, ev.Held)]) == 9, "held is re-published only when what holds it changes"


def test_queue_limits_in_gpus_hold_plain_workloads_too_and_priority_between_queues_decides_who_goes_first() -> None:
    policy = make_policy(queues=[
        {"name": "default"},
        {"name": "research", "priority": 10, "limits": {"max_gpus": 8}},
        {"name": "production", "priority": 100},
    ], organisation={"max_gpus": 8})  # fmt: skip
    log = Log(policy)
    log.submit("r1", make_workload("r1", policy_queue="research", resources={"gpus": 8}))
    r = log.submit("r2", make_workload("r2", policy_queue="research", resources={"gpus": 4}))
    held = next(e for e in r.events if isinstance(e, ev.Held))
    assert held.reason == "held: organisation at 8 of 8 GPUs; queue research at 8 of 8 GPUs"
    log.submit("p1", make_workload("p1", policy_queue="production", resources={"gpus": 8}))
    log.lifecycle("r1", "running", "completed")
    r = log.round()
    assert r.released == ["p1"], "production's priority is higher: it takes the freed GPUs first"
    cpu = log.submit("cpu", make_workload("cpu", policy_queue="research"))
    assert cpu.released == ["cpu"], "a CPU workload is never held by a GPU limit"


def test_a_submitter_outside_a_queues_owners_is_refused_and_the_refusal_is_the_workloads_own_verdict() -> None:
    policy = make_policy(queues=[{"name": "default"}, {"name": "production", "owners": ["vision"]}])
    wl = make_workload("x", owner="interns", policy_queue="production")
    why = pl.submit_refusal(policy, wl, "intern")
    assert why == "identity 'intern' (owner interns) may not submit to queue production (owners: vision)"
    assert pl.submit_refusal(policy, wl, "vision") is None, "an identity named in owners may use the queue"
    assert pl.submit_refusal(policy, make_workload("y", owner="vision", policy_queue="production")) is None
    assert "does not exist" in (pl.submit_refusal(policy, make_workload("z", policy_queue="nope")) or "")
    rej = pl.refusal_event(pl.Refused("x", why), NOW)
    assert rej.decision is not None and rej.decision.outcome == "rejected" and rej.reason == f"not admitted: {why}"
    # accepted as a record and refused at once; a refused pipeline is never expanded
    log = Log(policy)
    log.submit("px", make_dag({"a": []}, owner="interns", policy_queue="production"), identity="intern")
    assert log.kinds("px") == ["submitted", "rejected"] and log.kinds("px--a") == []
    assert log.gate.finished == {"px"} and not log.gate.pipelines
    # refused by admission (more GPUs than a limit allows at once): rejected, once
    log = Log(research(max_gpus=4))
    r = log.submit("big", make_workload("big", policy_queue="research", resources={"gpus": 8}))
    assert [ev.type_tag(e) for e in r.events] == ["rejected"] and "allows 4 at once" in r.events[0].reason  # type: ignore[union-attr]
    assert log.round(force=True).events == []


def test_the_budget_window_holds_gpu_work_and_releases_it_when_old_usage_leaves_the_window() -> None:
    log = Log(research(max_gpus=None, budget={"gpu_hours": 2, "window": "1h"}))
    log.submit("a", make_workload("a", policy_queue="research", resources={"gpus": 2}))
    log.lifecycle("a", "running")
    log.now += 3600
    a = {"workload_id": "a", "at": log.now, "attempt_id": "a-a1", "epoch": 1, "cluster": "primary"}
    log.echo([ev.Succeeded(event_id="a-a1.succeeded", output_path="/o", **a)])
    log.lifecycle("a", "completed")
    r = log.submit("b", make_workload("b", policy_queue="research", resources={"gpus": 1}, expected_runtime="2h"))
    held = next(e for e in r.events if isinstance(e, ev.Held))
    assert held.holds[0].kind == "budget" and "spent 2 of 2 GPU-hours in the last 1h, needs ~2" in held.reason
    log.now += 1800
    assert log.round(force=True).released == [], "half of the used hour is still in the window"
    log.now += 1801
    assert log.round(force=True).released == ["b"], "the window moved past the old usage"


def test_at_time_scale_600_a_budget_counts_simulated_gpu_hours_and_slides_in_simulated_time() -> None:
    """The same budget on the local clusters (600 simulated seconds per second of the events'
    clock): 2 GPUs running for 6 s of the events' clock are 1 simulated hour, 2 GPU-hours, and the
    1 h window is 6 s long. (Unscaled: 0.003 GPU-hours spent, b released at once, and a window
    of 3600 s of the events' clock.)"""
    log = Log(research(max_gpus=None, budget={"gpu_hours": 2, "window": "1h"}), time_scale=600)
    log.submit("a", make_workload("a", policy_queue="research", resources={"gpus": 2}))
    log.lifecycle("a", "running")
    log.now += 6
    a = {"workload_id": "a", "at": log.now, "attempt_id": "a-a1", "epoch": 1, "cluster": "primary"}
    log.echo([ev.Succeeded(event_id="a-a1.succeeded", output_path="/o", **a)])
    log.lifecycle("a", "completed")
    r = log.submit("b", make_workload("b", policy_queue="research", resources={"gpus": 1}, expected_runtime="2h"))
    held = next(e for e in r.events if isinstance(e, ev.Held))
    assert held.holds[0].kind == "budget" and "spent 2 of 2 GPU-hours in the last 1h, needs ~2" in held.reason
    log.now += 3
    assert log.round(force=True).released == [], "half of the used hour is still in the window"
    assert log.gate.spans, "a span inside the window is kept"
    log.now += 3.01
    assert log.round(force=True).released == ["b"], "the window moved past the old usage"
    assert not log.gate.spans, "a span older than the window (6 s of the events' clock) is dropped"


@pytest.mark.parametrize("order", ["in-order", "child-events-first"], ids=["log-order", "children-echoed-before-the-record"])
def test_the_echo_of_what_the_router_published_changes_nothing_whatever_order_it_comes_in(order: str) -> None:
    log = Log(AdmissionPolicy())
    wl = make_dag({"a": [], "b": ["a"]})
    x = pl.expand("p", wl, NOW)
    sub = ev.Submitted(event_id="p.submitted", workload_id="p", at=NOW, workload=wl)
    log.gate.note([sub], NOW)
    log.gate.note_expansion(x, wl, NOW)
    echoed = [sub, *x.events] if order == "in-order" else [*x.events[1:], sub, x.events[0]]
    log.echo(echoed)
    first = log.round()
    assert [e.workload_id for e in first.events if isinstance(e, ev.Released)] == ["p--a"]
    again = log.round(force=True)
    assert again.events == [] and again.released == []
    assert not log.gate.unconfirmed, "everything published has come back"


def test_what_was_noted_but_never_seen_in_the_log_is_overdue_and_published_again_under_the_same_id() -> None:
    gate = pl.Gate()
    wl = make_workload("w")
    sub = ev.Submitted(event_id="w.submitted", workload_id="w", at=NOW, workload=wl)
    gate.note([sub], NOW)
    r = gate.step(AdmissionPolicy(), NOW)
    assert r.released == ["w"]
    assert gate.overdue(NOW + 1, 10) == []
    late = gate.overdue(NOW + 10, 10)
    assert {e.event_id for e in late} == {"w.submitted", "w.released"}
    gate.apply(sub, 1)
    gate.apply(r.events[0], 2)  # type: ignore[arg-type]
    assert gate.overdue(NOW + 10, 10) == []



def test_a_released_stage_is_routed_with_its_inputs_and_their_sizes() -> None:
    """The promoted result's size (`promoted.result_bytes`) is in the dependent's `stage-ready`,
    and the decision of the round that releases it already reads it: the faster `far` reaches
    the store over a slow link, so copying 50 GB there costs more than its GPUs save."""
    from gpuorch_router.index import SnapshotIndex
    from tests.support.builders import H100_80, make_node, make_snapshot

    world = {
        "near": SnapshotIndex(make_snapshot("near", artifact_stores=["scratch", "prod"])),
        "far": SnapshotIndex(make_snapshot("far", [make_node("far-0", product=H100_80)], artifact_stores=["scratch", "prod"], bandwidth_mbps={"prod": 10.0})),
    }  # fmt: skip  far writes to prod over a 10 MB/s link, near has it in place
    decided: dict[str, RoutingDecision] = {}
    log = Log(AdmissionPolicy())

    def decide(wl: Workload, wid: str) -> RoutingDecision:
        decided[wid] = core.decide(log.state, wl, wid, 1, world, NOW)
        return decided[wid]

    log.round = lambda **kw: core.gate_round(log.gate, log.policy, log.state, decide, log.now, **kw)  # type: ignore[method-assign]
    r = log.submit("p", make_dag({"prep": [], "train": ["prep"]}, gpus={"train": 1}, output={"store": "prod"}))
    log.published += r.events
    log.echo(r.events)
    a = {"workload_id": "p--prep", "at": NOW, "attempt_id": "p--prep-a1", "epoch": 1, "cluster": "near"}
    log.echo([
        ev.Promoted(event_id="p--prep-a1.promoted", output_path="prod/p--prep/attempts/p--prep-a1", result_path="prod/p--prep/result", result_bytes=50 * 10**9, **a),
        ev.Completed(workload_id="p--prep", at=NOW, attempt_id="p--prep-a1", result_path="prod/p--prep/result"),
    ])  # fmt: skip
    r = log.round()
    ready = next(e for e in r.events if isinstance(e, ev.StageReady))
    assert ready.inputs == [
        ev.StageInput(stage="prep", workload_id="p--prep", attempt_id="p--prep-a1", result_path="prod/p--prep/result", store="prod", size_bytes=50 * 10**9)
    ]  # fmt: skip
    assert "p--train" in r.released
    d = decided["p--train"]
    assert d.cluster == "near"
    far = next(v for v in d.verdicts if v.cluster == "far")
    assert far.estimate is not None and far.estimate.data_staging == pytest.approx(5000.0)
    assert any(c.code == "INPUT_DATA" and "prep@p--prep-a1 copy 50 GB from prod at 10 MB/s" in c.message for c in far.checks)
    again = core.decide(log.state, log.gate.workloads["p--train"], "p--train", 2, world, NOW)  # a later attempt: the same inputs
    assert again.cluster == "near"
