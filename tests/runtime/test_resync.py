"""The pacing of full passes (`gpuorch.resync`): every `every` passes, later after a costly one."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gpuorch.resync import COST_SHARE, Resync


def fulls(r: Resync, times: list[float]) -> list[int]:
    return [i + 1 for i, t in enumerate(times) if r.full(t)]


def test_the_first_pass_is_full_then_every_nth_while_passes_are_cheap() -> None:
    r = Resync(every=5)
    out = []
    for i in range(1, 17):
        if r.full(float(i)):
            out.append(i)
            r.took(float(i), 0.001)
    assert out == [1, 6, 11, 16]


def test_a_costly_full_pass_puts_the_next_off_by_its_share_of_the_time() -> None:
    r = Resync(every=5)
    assert r.full(100.0)
    r.took(100.0, 2.0)  # two seconds: the next full pass not before 100 + 30 x 2
    later = [t for t in range(101, 200) if r.full(float(t))]
    assert later[0] == 100 + int(COST_SHARE * 2.0)
    assert all(b - a >= 5 for a, b in itertools.pairwise(later))


def test_again_makes_the_next_pass_full_whatever_the_last_one_cost() -> None:
    r = Resync(every=10)
    assert r.full(0.0)
    r.took(0.0, 100.0)
    assert not r.full(1.0)
    r.again()  # a cache was re-listed
    assert r.full(2.0)
    assert not r.full(3.0)


@given(
    every=st.integers(min_value=1, max_value=20),
    costs=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=200),
)
def test_full_passes_are_at_least_every_apart_and_take_at_most_their_share(every: int, costs: list[float]) -> None:
    """Passes one second apart with random costs: full ones are at least `every` passes apart,
    each starts no sooner than `share` x the previous one's cost after it, and a full pass comes
    as soon as both allow it (none is skipped for no reason)."""
    r = Resync(every=every)
    last: tuple[int, float, float] | None = None  # (pass, start, cost) of the latest full pass
    for i, cost in enumerate(costs, start=1):
        now = float(i)
        full = r.full(now)
        allowed = last is None or (i - last[0] >= every and now >= last[1] + COST_SHARE * last[2])
        assert full == allowed
        if full:
            r.took(now, cost)
            last = (i, now, cost)
