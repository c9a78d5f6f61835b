"""The first-step marker: what the program writes, what the dispatcher reads, and how often it looks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuorch.observe import progress
from gpuorch.projection import AttemptView
from gpuorch_proto import events as ev

TICK = 0.5


def attempt(tmp: Path, attempt_id: str = "w-1-a1") -> AttemptView:
    out = tmp / "w-1" / "attempts" / attempt_id
    return AttemptView(attempt_id=attempt_id, number=1, epoch=1, cluster="east", output_path=str(out))


def marker(a: AttemptView) -> bytes | None:
    """The marker as the dispatcher reads it: the object gpuorch's agent uploaded (its bytes), or None."""
    path = progress.marker_path(a.output_path)
    return path.read_bytes() if path.exists() else None


def test_a_written_marker_is_read_once_as_one_compute_started_event(tmp_path: Path) -> None:
    a = attempt(tmp_path)
    assert progress.compute_started("w-1", a, marker(a), 100.0) == []  # nothing written yet
    progress.write_marker(a.output_path, attempt_id=a.attempt_id, step=3, at=42.5)
    progress.write_marker(a.output_path, attempt_id=a.attempt_id, step=9, at=99.0)  # the first one stays
    [e] = progress.compute_started("w-1", a, marker(a), 100.0)
    assert isinstance(e, ev.ComputeStarted)
    assert (e.started_at, e.step, e.attempt_id, e.event_id) == (42.5, 3, a.attempt_id, f"{a.attempt_id}.{progress.KIND}")
    a.times[progress.KIND] = 100.0  # on record: not published again
    assert progress.compute_started("w-1", a, marker(a), 101.0) == []


def test_another_attempts_marker_is_not_taken_for_this_one(tmp_path: Path) -> None:
    a = attempt(tmp_path)
    progress.write_marker(a.output_path, attempt_id="w-1-a0", step=1, at=1.0)
    assert progress.compute_started("w-1", a, marker(a), 2.0) == []


@pytest.mark.parametrize("data", [b"", b"not json", b"[1, 2]", b'{"attempt_id": "w-1-a1"}', b'{"started_at": "soon"}'])
def test_a_marker_that_is_not_one_starts_nothing(tmp_path: Path, data: bytes) -> None:
    assert progress.compute_started("w-1", attempt(tmp_path), data, 2.0) == []


@given(
    running_at=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    age=st.floats(min_value=0, max_value=1e6),
)
def test_the_next_look_is_between_a_tick_and_the_longest_wait(running_at: float | None, age: float) -> None:
    now = (running_at or 0.0) + age
    at = progress.next_look(running_at, now, TICK)
    assert now + TICK <= at <= now + max(TICK, progress.LOOK_MAX)
    if running_at is None:
        assert at == now + TICK  # nothing known of its age: as soon as a young one


@given(running_at=st.floats(min_value=0, max_value=1e6), a=st.floats(0, 1e5), b=st.floats(0, 1e5))
def test_an_older_attempt_never_waits_less(running_at: float, a: float, b: float) -> None:
    young, old = sorted((a, b))
    wait = lambda age: progress.next_look(running_at, running_at + age, TICK) - (running_at + age)  # noqa: E731
    assert wait(young) <= wait(old) + 1e-9


def test_an_hour_without_a_marker_costs_a_few_hundred_looks_not_one_per_tick() -> None:
    start, now, looks = 1000.0, 1000.0, 0
    while now < start + 3600:
        now = max(progress.next_look(start, now, TICK), now + TICK)  # the watch ticks every TICK
        looks += 1
    assert looks <= 3600 / progress.LOOK_MAX + 60  # about 400, where every tick was 7,200
    # and a young attempt is looked at every tick: a marker written at once is seen at once
    assert progress.next_look(start, start + 1.0, TICK) == start + 1.0 + TICK
