"""The diagnosis and the useful-work figures (gpuorch.observe.activity: pure): one case per test,
each built so that moving one number across its threshold changes the verdict."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuorch.observe import activity as act
from gpuorch.observe.activity import (
    AttemptFacts,
    DeviceUse,
    Progress,
    Shape,
    Unknown,
    diagnose,
    report,
    work_of,
)

T0 = 1000.0


def use(activity: float, fb: float = 2048, samples: int = 40) -> DeviceUse:
    return DeviceUse(activity=activity, samples=samples, devices=4, fb_used_mib=fb, series="DCGM_FI_PROF_GR_ENGINE_ACTIVE", source="test")


def progress(compute: float = 90.0, wait: float = 0.0, steps: int = 900, first: float = T0 + 5, last: float = T0 + 95,
             device: str = "gpu") -> Progress:  # fmt: skip
    return Progress(steps=steps, samples=steps * 64, compute_seconds=compute, input_wait_seconds=wait,
                    first_step_at=first, last_step_at=last, device=device, done=True)  # fmt: skip


def facts(**kw: Any) -> AttemptFacts:
    """A 4-GPU attempt held 100 s, stepping 90 s of it at full activity: healthy unless changed."""
    base: dict[str, Any] = dict(
        workload_id="w", attempt_id="w-a1", cluster="alpha", owner="vision", gpus=4.0, held=(T0, T0 + 100),
        outcome="promoted", progress=progress(), held_use=use(0.9), compute_use=use(0.98), stage="train",
    )  # fmt: skip
    return AttemptFacts(**{**base, **kw})


def test_healthy() -> None:
    d = diagnose(facts())
    assert d.case == "healthy" and d.letter == "e" and not d.also
    assert "98% active" in d.summary and "36000 steps/h" in d.summary


def test_a_stage_that_holds_gpus_it_never_uses() -> None:
    idle = facts(held_use=use(0.0, fb=0), compute_use=use(0.0, fb=0), progress=progress(device="cpu"), stage="preprocess")
    d = diagnose(idle)
    assert (d.case, d.letter) == ("never-used", "a")
    assert "resources.gpus: 0" in d.suggestion and any("0%" in e for e in d.evidence)
    # a little activity (a real kernel now and then) is use: then it is not case (a)
    assert diagnose(replace(idle, held_use=use(0.05, fb=0))).case != "never-used"
    # device memory held means the framework did load something on it
    assert diagnose(replace(idle, held_use=use(0.0, fb=4096))).case != "never-used"
    # too few samples to rest a verdict on, but the program itself says it ran on the CPU
    assert diagnose(replace(idle, held_use=use(0.0, fb=0, samples=2), progress=progress())).case != "never-used"
    assert diagnose(replace(idle, held_use=Unknown("no exporter"))).case == "never-used"


def test_data_bound() -> None:
    slow = facts(progress=progress(compute=30, wait=60), compute_use=use(0.33), held_use=use(0.3))
    d = diagnose(slow)
    assert (d.case, d.letter) == ("data-bound", "b")
    assert "67%" in d.summary and "33% active" in d.summary and "not placement" in d.suggestion
    assert diagnose(replace(slow, progress=progress(compute=70, wait=25))).case == "healthy"  # waits 26%: under the bar
    assert diagnose(replace(slow, compute_use=use(0.8))).case == "healthy"  # the devices were busy anyway


def test_shape_reuses_the_routers_rules_and_explains_words() -> None:
    spread = Shape(cluster="frag", per_node=4, units=1, free_total=4, free_slots=0, free_by_node=(1, 1, 1, 1),
                   scheduler="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                   explain=("GPU_SHAPE: 4 of 4 nodes can hold 4 GPUs on one node",), hint="fewer GPUs per worker")  # fmt: skip
    waiting = facts(held=None, outcome="live", progress=Unknown("not started"), held_use=Unknown("x"),
                    compute_use=Unknown("x"), shape=spread)  # fmt: skip
    d = diagnose(waiting)
    assert (d.case, d.letter) == ("shape", "c")
    assert "4 GPUs free on frag but at most 1 on one node" in d.summary
    assert any("Insufficient nvidia.com/gpu" in e for e in d.evidence) and "fewer GPUs per worker" in d.suggestion
    assert d.numbers["free_by_node"] == [1, 1, 1, 1]
    # fewer free GPUs than it needs: capacity, not shape
    assert diagnose(replace(waiting, shape=replace(spread, free_total=3, free_by_node=(1, 1, 1)))).case == "waiting"
    # one node with 4 free: it fits, so nothing to say about shape
    assert diagnose(replace(waiting, shape=replace(spread, free_slots=1, free_by_node=(4,)))).case != "shape"


def test_idle_allocation_before_and_after_the_program() -> None:
    late = facts(progress=progress(first=T0 + 30, last=T0 + 95, compute=65))  # 30 s staging, 5 s after
    d = diagnose(late)
    assert (d.case, d.letter) == ("idle-allocation", "d")
    assert "35% of" in d.summary and any("before its first step: 30s" in e for e in d.evidence)
    assert diagnose(replace(late, progress=progress(first=T0 + 15, last=T0 + 95, compute=80))).case == "healthy"
    # held to the end and never stepped, nothing reported: all of it idle
    never = facts(progress=Unknown("no progress"), held_use=Unknown("no metrics"), compute_use=Unknown("no window"), outcome="failed")
    assert diagnose(never).case == "idle-allocation"


def test_later_cases_that_hold_too_are_listed_and_unknowns_say_why() -> None:
    both = facts(progress=progress(compute=20, wait=45, first=T0 + 30), compute_use=Unknown("Prometheus at http://p did not answer"))
    d = diagnose(both)
    assert d.case == "data-bound" and d.also == ("idle-allocation",)
    assert any("did not answer" in u for u in d.unknown)
    blind = facts(progress=Unknown("no progress"), held_use=Unknown("no exporter"), compute_use=Unknown("no exporter"),
                  compute_started=T0 + 1)  # fmt: skip
    assert diagnose(blind).case == "unknown" and len(diagnose(blind).unknown) == 3


def test_useful_work_and_gpu_hours_in_the_clusters_time() -> None:
    w = work_of(facts(), time_scale=60)
    assert w.allocated_gpu_hours == pytest.approx(4 * 100 * 60 / 3600)
    assert w.active_gpu_hours == pytest.approx(w.allocated_gpu_hours * 0.9)
    assert w.steps_per_hour == pytest.approx(900 / (90 * 60) * 3600)
    assert w.gpu_hours_per_1k_steps == pytest.approx(w.allocated_gpu_hours / 900 * 1000)
    assert (w.idle_before_seconds, w.idle_after_seconds) == (pytest.approx(300), pytest.approx(300))
    assert work_of(facts(held_use=Unknown("x"))).active_gpu_hours is None


def test_the_report_groups_and_names_the_worst_offenders() -> None:
    rows = [
        facts(attempt_id="ok-a1", workload_id="ok"),
        facts(attempt_id="pre-a1", workload_id="pre", stage="preprocess", held_use=use(0.0, fb=0), compute_use=use(0.0, fb=0),
              progress=progress(device="cpu")),
        facts(attempt_id="slow-a1", workload_id="slow", owner="nlp", stage=None, progress=progress(compute=30, wait=60),
              compute_use=use(0.33), held_use=use(0.3), outcome="failed"),
    ]  # fmt: skip
    r = report(rows)
    owners = {g["key"]: g for g in r["by_owner"]}
    assert owners["vision"]["attempts"] == 2 and owners["nlp"]["cases"] == {"data-bound": 1}
    assert owners["vision"]["activity"] == pytest.approx(0.45) and owners["vision"]["results"] == 2
    assert [o["attempt_id"] for o in r["worst"]] == ["pre-a1", "slow-a1"]  # most idle GPU-hours first
    assert {g["key"] for g in r["by_stage"]} == {"train", "preprocess", "-"}
    text = "\n".join(act.render_report(r))
    assert "worst offenders" in text and "(a) never-used" in text


def test_metrics_cells_name_the_top_owners_and_stages_and_sum_the_rest_as_other() -> None:
    rows = [facts(attempt_id=f"a{i}", workload_id=f"w{i}", owner=f"o{i:02d}", stage=f"s{i:02d}", gpus=float(i + 1)) for i in range(14)]
    rows.append(facts(attempt_id="single", workload_id="single", owner="o13", stage=None))
    judged = act.judge(rows)
    cs = act.cells(judged, top_owners=3, top_stages=2)
    owners, stages = {c.owner for c in cs}, {c.stage for c in cs}
    assert owners == {"o13", "o12", "o11", act.OTHER}  # the most GPUs held keep their names
    assert stages == {"s13", "s12", act.NO_STAGE, act.OTHER}  # "-" (no pipeline) is always its own
    assert sum(c.group.allocated for c in cs) == pytest.approx(sum(j.work.allocated_gpu_hours for j in judged))
    other = [c for c in cs if c.owner == act.OTHER]
    assert sum(c.group.attempts for c in other) == 11 and all(c.group.cases == {"healthy": c.group.attempts} for c in cs)
    # the same sums as the report's (one computation, two views of it)
    r = act.report_of(judged)
    assert {g["key"]: g["allocated_gpu_hours"] for g in r["by_owner"]}["o13"] == pytest.approx(
        sum(c.group.allocated for c in cs if c.owner == "o13"))


def test_the_attempts_account_is_what_explain_prints() -> None:
    [j] = act.judge([facts(progress=progress(compute=30, wait=60), compute_use=use(0.33))])
    a = act.account(j)
    assert a["diagnosis"]["case"] == "data-bound" and a["work"]["steps"] == 900
    assert a["work_line"] == act.work_line(j.work) and a["work_line"].startswith("useful work: 900 steps")
    text = act.render([j.facts])
    assert f"    - {a['work_line']}" in text and f"    -> {a['diagnosis']['suggestion']}" in text
    assert act.account(act.judge([facts(progress=Unknown("none"))])[0])["work_line"] is None


def test_the_activity_chart_is_a_png_of_the_three_groupings() -> None:
    import io

    import matplotlib.image

    from gpuorch.observe.plots import ACTIVITY_CHART, render_png

    rows = [facts(), facts(attempt_id="u-a1", owner="nlp", stage=None, held_use=Unknown("no exporter"), compute_use=Unknown("x"))]
    png = render_png(ACTIVITY_CHART, {"activity": report(rows, time_scale=60)}, [])
    img = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and img.shape[1] == 1300 and img.shape[0] >= 260
    with pytest.raises(KeyError):
        render_png(ACTIVITY_CHART, {"destinations": []}, [])  # a report without its activity part has no such chart
