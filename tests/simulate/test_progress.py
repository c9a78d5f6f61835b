"""Progress of a long replay: the ETA, the line, the throttle, and the engine's callback."""

from __future__ import annotations

import pytest

from gpuorch.simulate.engine import simulate
from gpuorch.simulate.progress import CLEAR, Eta, Progress, line
from tests.test_layering import FORBIDDEN, _closure

from .builders import cluster, jobs, world


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_at_a_constant_rate_is_exact() -> None:
    eta = Eta(window=30.0)
    for s in range(0, 11):
        eta.add(100.0 + s, 50 * s)  # 50 jobs a second
    assert eta.remaining(1000) == pytest.approx((1000 - 500) / 50)


def test_the_eta_follows_the_recent_rate_not_the_average() -> None:
    eta = Eta(window=10.0)
    for s in range(0, 61):
        eta.add(float(s), 100 * s if s <= 30 else 3000 + 10 * (s - 30))  # 100/s, then 10/s
    assert eta.remaining(4000) == pytest.approx((4000 - 3300) / 10)


def test_there_is_no_eta_before_any_progress_and_none_left_at_the_end() -> None:
    eta = Eta()
    assert eta.remaining(10) is None
    eta.add(0.0, 0)
    eta.add(5.0, 0)
    assert eta.remaining(10) is None
    eta.add(6.0, 10)
    assert eta.remaining(10) == 0.0


def test_the_line_says_jobs_day_elapsed_and_eta() -> None:
    assert line("gpuorch (1/7)", 12345, 69351, 10.44 * 86400, 60.06 * 86400, 62.0, 288.0) == \
        "gpuorch (1/7): 12,345/69,351 jobs 17.8 %, day 10.4 of 60.1, 1m2s, ETA 4m48s"
    assert line("x", 0, 10, 0.0, 86400.0, 0.2, None).endswith("0/10 jobs 0.0 %, day 0.0 of 1.0, 0.2s, ETA ?")


def test_the_line_is_rewritten_at_most_every_interval_and_erased_at_the_end() -> None:
    clock, out = Clock(), []
    p = Progress(out.append, clock, interval=0.5)
    update = p.start("emptiest (2/7)", 86400.0)
    for k in range(1, 101):  # 100 jobs, 1/16 s apart: a line every 8 jobs, none before the first 0.5 s
        clock.now += 0.0625
        update(k, 100, k * 864.0)
    assert len(out) == 12 and all(s.startswith(CLEAR + "emptiest (2/7): ") for s in out)
    assert out[0] == CLEAR + "emptiest (2/7): 8/100 jobs 8.0 %, day 0.1 of 1.0, 0.5s, ETA ?"  # no rate yet
    assert out[1] == CLEAR + "emptiest (2/7): 16/100 jobs 16.0 %, day 0.2 of 1.0, 1s, ETA 5.25s"  # 16 jobs/s, 84 left
    p.finish()
    assert out[-1] == CLEAR
    p.finish()
    assert out.count(CLEAR) == 1  # nothing to erase twice


def test_the_engine_reports_every_trace_arrival_in_order_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    w = world(cluster("a", nodes=1, background={"utilization": 0.5, "gpus": 4, "mean_seconds": 600}))
    js = jobs([(60.0 * k, 600.0, 2) for k in range(12)], w)
    calls: list[tuple[int, int, float]] = []
    simulate(w, js, "gpuorch", progress=lambda done, total, t: calls.append((done, total, t)))
    assert calls == [(k + 1, 12, 60.0 * k) for k in range(12)]
    assert capsys.readouterr() == ("", "")


def test_the_progress_module_imports_no_io() -> None:
    bad = {m for m in _closure("gpuorch.simulate.progress") if m.split(".")[0] in FORBIDDEN}
    assert not bad, bad
