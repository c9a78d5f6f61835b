"""Preemption under the deterministic simulation (gpuorch/dev/dst): the router's own round
(`core.preemptions`), the dispatcher's fence, the fencer, under crashes, partitions and node loss;
every schedule is checked against the invariants, `preempted-only-interruptible` included."""

from __future__ import annotations

from gpuorch.dev.dst.sim import run


def test_simulated_schedules_preempt_and_keep_every_invariant() -> None:
    preempting = 0
    for seed in range(1, 81):
        r = run(seed, trace=True)
        assert not r.violations, (seed, r.violations)
        lines = r.trace if isinstance(r.trace, list) else str(r.trace).splitlines()
        requested = [
            ln.split("publish preemption-requested ", 1)[1].split(".preemption-requested", 1)[0]
            for ln in lines
            if "publish preemption-requested " in ln
        ]
        for attempt in requested:  # each victim is fenced through the dispatcher and the fencer
            assert any(f"publish fence-requested {attempt}.fence-requested" in ln for ln in lines), (
                seed,
                attempt,
            )
            assert any(f"publish fenced {attempt}.fenced" in ln for ln in lines), (seed, attempt)
        preempting += bool(requested)
    assert preempting >= 1  # the schedules do exercise it
