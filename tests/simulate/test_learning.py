"""The replay learns as the router does (issue 30): from each job it routed, when its outputs are
promoted, through the router's own `core.measured_timeline` and `history.update_history`; later
decisions read what it learnt; `learn: false` turns it off."""

from __future__ import annotations

import dataclasses
import math

import pytest

import gpuorch_router.core as router_core
from gpuorch.simulate import engine
from gpuorch.simulate.engine import Simulation
from gpuorch.simulate.generator import repeat_class
from gpuorch.simulate.trace import TraceJob
from gpuorch_proto.routing import RoutingDecision
from gpuorch_router import history

from .builders import EXACT, cluster, jobs, world

#: one recurring program (same file, GPU count and duration: one class), declared with an error
NOISY = dataclasses.replace(EXACT, declared_sigma=0.5, repeat_classes=True)
RUN = 5400.0


def _replay(monkeypatch: pytest.MonkeyPatch, learn: bool = True) -> tuple[Simulation, list[RoutingDecision]]:
    w = dataclasses.replace(world(cluster("east", nodes=2)), learn=learn)
    js = jobs([(1800.0 * k, RUN, 1) for k in range(40)], w, NOISY)
    decisions: list[RoutingDecision] = []
    real = router_core.decide

    def recording(*a, **k):  # type: ignore[no-untyped-def]
        d = real(*a, **k)
        decisions.append(d)
        return d

    monkeypatch.setattr(engine.router_core, "decide", recording)
    sim = Simulation(w, js, "gpuorch")
    sim.run()
    return sim, decisions


def test_the_replay_learns_each_routed_job_when_it_completes_and_later_decisions_read_it(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, decisions = _replay(monkeypatch)
    key = repeat_class(TraceJob("j0", 0.0, RUN, 1, "t"))
    assert all(j.workload.metadata.workload_class == key for j in sim.jobs)
    assert sim.history is not None
    runs = sim.history.runs_of(key)["NVIDIA-A100-SXM4-80GB"]
    assert runs.n == history.RUN_SAMPLES and all(s.seconds == pytest.approx(RUN) for s in runs.samples)
    assert sorted(s.declared for s in runs.samples) == sorted(j.declared_run for j in sim.jobs[-history.RUN_SAMPLES :])
    assert not sim.routed, "every routed job was learnt from"
    first = decisions[0].verdicts[0].estimate
    last = decisions[-1].verdicts[0].estimate
    assert first is not None and last is not None
    assert first.run_source.startswith("declared") and "no runs learnt" in first.run_source
    assert f"of class {key}" in last.run_source, last.run_source
    err = [abs(math.log(d.verdicts[0].estimate.run / RUN)) for d in decisions if d.verdicts[0].estimate is not None]
    declared_err = [abs(math.log(j.declared_run / RUN)) for j in sim.jobs]
    assert sum(err[-10:]) < 0.3 * sum(declared_err[-10:]), "the last estimates are far closer than the declarations"


def test_the_replay_learns_through_the_routers_own_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"timeline": 0, "update": 0}
    real_t, real_u = router_core.measured_timeline, engine.update_history
    assert real_u is history.update_history, "the router's history module, not a copy"

    def timeline(*a, **k):  # type: ignore[no-untyped-def]
        calls["timeline"] += 1
        return real_t(*a, **k)

    def update(*a, **k):  # type: ignore[no-untyped-def]
        calls["update"] += 1
        return real_u(*a, **k)

    monkeypatch.setattr(engine.router_core, "measured_timeline", timeline)
    monkeypatch.setattr(engine, "update_history", update)
    sim, _ = _replay(monkeypatch)
    assert calls == {"timeline": len(sim.jobs), "update": len(sim.jobs)}


def test_learn_false_keeps_the_replay_without_history(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, decisions = _replay(monkeypatch, learn=False)
    assert sim.history is None
    assert all(d.verdicts[0].estimate is not None and d.verdicts[0].estimate.run_source.startswith("declared") for d in decisions)


def test_a_learn_setting_that_is_not_a_boolean_is_refused_with_where() -> None:
    from gpuorch.simulate.world import parse_world

    with pytest.raises(ValueError, match=r"my\.yaml: learn: expected true or false, got 'yes'"):
        parse_world({"clusters": [cluster("east")], "learn": "yes"}, "my.yaml")
