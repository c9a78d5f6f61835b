"""The routing bench runs (tiny sizes) and its entry point lists resolvable benches."""

from __future__ import annotations

import importlib

from gpuorch.dev.bench import BENCHES
from gpuorch.dev.bench.routing import NOW, SHAPES, Scenario, _once, make_workload, make_world
from gpuorch_router.policy import route


def test_every_registered_bench_resolves_to_a_callable() -> None:
    for path in BENCHES:
        module, _, func = path.partition(":")
        assert callable(getattr(importlib.import_module(module), func))


def test_generated_world_routes_every_shape_and_times_a_scenario() -> None:
    world = make_world(6, 40)
    outcomes = {route(make_workload(s, 0), "w", world, NOW).outcome for s in range(len(SHAPES))}
    assert "routed" in outcomes
    sc = Scenario(
        "t", lambda r: [make_workload(i % len(SHAPES), i) for i in range(30)], True, 0.001, churn=10
    )
    timing = _once(world, sc, 0)
    assert len(timing.latencies) == 30 and timing.cpu > 0
