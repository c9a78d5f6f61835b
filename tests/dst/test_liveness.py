"""Blips around LOST_AFTER (issue 27): the production rules in virtual time
(`gpuorch.dev.dst.liveness`: the informers' retry schedule, the probe's schedule, the group that
coalesces facts, the dispatcher's contact rule).

A cut no longer than LOST_AFTER never makes anything lost, however the retries, watches, probe
and ticks fall; a longer one is declared within LOST_AFTER + one probe interval of the cut when
calls are refused (the local clusters' partition), + two when they hang (a real network
partition: the probe's own timeout), and always on a failed call made before the heal.
"""

from __future__ import annotations

import pytest

from gpuorch.dev.dst import liveness
from gpuorch.informer import PROBE_INTERVAL

LENGTHS = [round(0.5 + 0.1 * i, 2) for i in range(46)]  # 0.5 .. 5.0 s


@pytest.mark.parametrize("lost_after", [3.0, 2.0])
@pytest.mark.parametrize("kind", ["refused", "hang"])
def test_blips_of_every_length_around_lost_after(kind: str, lost_after: float) -> None:
    p = PROBE_INTERVAL
    bound = lost_after + (p if kind == "refused" else 2 * p)
    outcomes = liveness.sweep(LENGTHS, kind=kind, lost_after=lost_after, alignments=8)
    for o in outcomes:
        where = f"{kind} cut of {o.blip:.2f}s at {o.cut:.2f} (lost_after {lost_after}): {o}"
        if o.blip <= lost_after:
            assert o.lost_at is None, f"a blip no longer than LOST_AFTER lost work: {where}"
            continue
        if o.blip > bound:
            assert o.lost_at is not None, f"a long cut was never declared: {where}"
        if o.lost_at is not None:
            assert o.lost_at - o.cut <= bound + 1e-9, f"declared too late: {where}"
            assert o.evidence_at is not None and o.evidence_at < o.heal, f"declared on no evidence: {where}"
            assert o.evidence_at - o.cut >= lost_after - 1e-9, where
            if kind == "refused":
                assert o.lost_at < o.heal, f"declared after the heal: {where}"
            else:  # the proving call hung to its timeout: seen at most one interval after it was made
                assert o.lost_at - o.evidence_at <= p + 1e-9, where


def test_the_issue_s_blip_is_not_a_loss_and_the_reason_counts_the_failed_run() -> None:
    """The report: a 1.5 s partition with LOST_AFTER 3 was declared lost 3.4 s after the cut."""
    assert liveness.blip(20.0, 1.5).lost_at is None
    o = liveness.blip(20.0, 6.0)
    assert o.lost_at is not None and o.lost_at < o.heal
    assert o.reason.startswith("has not answered for 3.") and "last answer" in o.reason, o.reason


def test_the_sweep_table_says_what_it_measured() -> None:
    text = liveness.table(liveness.sweep([1.0, 4.0], alignments=2), 3.0)
    lines = text.splitlines()
    assert lines[1].split()[:2] == ["1.00", "0/2"] and lines[2].split()[:2] == ["4.00", "2/2"], text
