"""The simulator's gpuorch policy is the router's: same function, same snapshots, same decision."""

from __future__ import annotations

import msgspec

import gpuorch_router.core as router_core
from gpuorch.config import Settings
from gpuorch.simulate.engine import Simulation
from gpuorch.simulate.generator import GeneratorConfig
from gpuorch.simulate.policies import Choice, Context
from gpuorch_router.service import Router

from .builders import cluster, jobs, world

DS = [{"name": "imagenet", "version": "v3", "size_gb": 150, "locations": ["east"]},
      {"name": "c4", "version": "v1", "size_gb": 800, "locations": ["west"]}]


def _world():  # type: ignore[no-untyped-def]
    bg = {"utilization": 0.5, "gpus": 4, "mean_seconds": 3600}
    return world(
        cluster("east", nodes=2, local=["east"], bandwidth={"west": 200}, background=bg),
        cluster("west", nodes=3, model="NVIDIA-H100-80GB-HBM3", memory_mib=81559, local=["west"], bandwidth={"east": 100}, background=bg),
        cluster("lab", nodes=4, gpus=4, model="NVIDIA-L40S", memory_mib=46068, bandwidth={"east": 500, "west": 500}, background=bg),
        datasets=DS, interval=30.0,
    )


def test_the_simulator_and_the_router_service_decide_the_same_for_the_same_snapshots() -> None:
    w = _world()
    js = jobs([(60.0 * k, 1800.0 + 97 * (k % 7), [1, 2, 4, 8, 16][k % 5]) for k in range(120)], w, GeneratorConfig(), seed=3)
    seen: list[tuple[int, dict[str, object], float, Choice, object]] = []

    def recording(job, ctx: Context, now: float) -> Choice:  # type: ignore[no-untyped-def]
        learnt = ctx.history  # type: ignore[attr-defined]  # what the replay had learnt by then
        choice = ctx.decide(job, now)
        seen.append((job.index, dict(ctx.indexes), now, choice, learnt))  # type: ignore[attr-defined]
        return choice

    sim = Simulation(w, js, recording, seed=3)
    sim.run()
    router = Router(Settings())
    routed = {"east": 0, "west": 0, "lab": 0}
    for index, indexes, now, choice, learnt in seen:
        router.indexes = indexes  # type: ignore[assignment]
        router.history = learnt  # type: ignore[assignment]
        d = router.decide(js[index].workload, f"trace-{index}", 1, now)
        mine = router_core.decide(router_core.RouterState(), js[index].workload, f"trace-{index}", 1, indexes, now, history=learnt)  # type: ignore[arg-type]
        assert msgspec.to_builtins(d) == msgspec.to_builtins(mine)
        assert (d.outcome, d.cluster) == (choice.outcome, sim.names[choice.cluster] if choice.cluster is not None else None)
        if d.cluster:
            routed[d.cluster] += 1
    assert len(seen) == 120 and sum(1 for v in routed.values() if v) >= 2  # the snapshots really varied


def test_the_gpuorch_policy_calls_the_routers_decide_once_per_decision(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    real = router_core.decide

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr(router_core, "decide", counting)
    w = _world()
    js = jobs([(10.0 * k, 600.0, 1) for k in range(20)], w)
    r = Simulation(w, js, "gpuorch").run()
    assert calls == [f"trace-{k}" for k in range(20)] and r.decisions == 20
