"""The supervisor's restart decision: capped exponential backoff, reset by a healthy run (pure)."""

from __future__ import annotations

import pytest

from gpuorch.backoff import BackoffPolicy, decide_restart
from tests.test_layering import FORBIDDEN, _closure

P = BackoffPolicy(initial=0.5, factor=2.0, cap=30.0, healthy_after=60.0)


def test_first_crash_restarts_after_the_initial_delay() -> None:
    d = decide_restart(P, crashes=0, started_at=100.0, now=105.0)
    assert d.delay == 0.5 and d.restart_at == 105.5
    assert d.crashes == 1 and d.ran == 5.0 and not d.reset


def test_consecutive_crashes_double_the_delay_up_to_the_cap() -> None:
    delays = []
    crashes, t = 0, 0.0
    for _ in range(10):
        d = decide_restart(P, crashes, started_at=t, now=t + 1.0)  # each run dies after 1 s
        delays.append(d.delay)
        crashes, t = d.crashes, d.restart_at
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert crashes == 10
    assert "capped" in decide_restart(P, 7, 0.0, 1.0).reason


def test_a_healthy_run_resets_the_backoff() -> None:
    d = decide_restart(P, crashes=6, started_at=0.0, now=60.0)
    assert d.delay == 0.5 and d.crashes == 1 and d.reset
    assert "healthy" in d.reason
    # just short of healthy: the history still counts
    d = decide_restart(P, crashes=6, started_at=0.0, now=59.9)
    assert d.delay == 30.0 and d.crashes == 7 and not d.reset


def test_huge_crash_counts_do_not_overflow() -> None:
    assert decide_restart(P, crashes=10_000, started_at=0.0, now=1.0).delay == 30.0


def test_clock_going_backwards_counts_as_no_run_time() -> None:
    d = decide_restart(P, crashes=2, started_at=50.0, now=40.0)
    assert d.ran == 0.0 and d.delay == 2.0


def test_zero_initial_restarts_immediately_every_time() -> None:
    p = BackoffPolicy(initial=0.0, cap=5.0)
    assert [decide_restart(p, n, 0.0, 1.0).delay for n in range(4)] == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [{"initial": -1}, {"cap": -1}, {"factor": 0.5}, {"healthy_after": -1}])
def test_invalid_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**bad)


def test_the_decision_module_is_pure() -> None:
    reached = _closure("gpuorch.backoff")
    assert not {m for m in reached if m.split(".")[0] in FORBIDDEN | {"os", "time", "signal"}}, reached
