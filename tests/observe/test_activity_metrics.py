"""The allocated vs productive metrics gpuorch exports (gpuorch.observe.metrics.activity_registry,
docs/activity.md *Metrics*): names, labels, bounded cardinality, the same sums as the report;
checked by Prometheus' own linter (`promtool check metrics`)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuorch.observe import activity as act
from gpuorch.observe.facts import Round
from gpuorch.observe.metrics import ACTIVITY_FAMILIES, activity_registry
from tests.observe.test_activity import facts, progress, use

OWNERS, STAGES = 25, 30


def _round() -> Round:
    rows = [facts(attempt_id=f"a{i}", workload_id=f"w{i}", owner=f"owner-{i % OWNERS}", stage=f"trial-{i % STAGES}",
                  cluster=("east", "west")[i % 2]) for i in range(150)]  # fmt: skip
    rows.append(facts(attempt_id="slow", workload_id="slow", owner="owner-0", stage=None, cluster="east",
                      progress=progress(compute=30, wait=60), compute_use=use(0.33)))  # fmt: skip
    judged = act.judge(rows, time_scale=60)
    return Round(1767225600.0, 0.25, 1, judged, act.cells(judged))


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def test_names_labels_and_bounded_cardinality() -> None:
    r = _round()
    got = _samples(generate_latest(activity_registry(lambda: r)).decode())
    for name in ACTIVITY_FAMILIES:
        assert got[name] and all(set(labels) == {"destination", "owner", "stage"} for labels, _ in got[name]), name
    alloc = got["gpuorch_gpu_allocated_seconds"]
    owners = {lab["owner"] for lab, _ in alloc}
    stages = {lab["stage"] for lab, _ in alloc}
    assert len(owners) == act.TOP_OWNERS + 1 and act.OTHER in owners  # 25 owners: 10 named, the rest "other"
    assert len(stages) == act.TOP_STAGES + 2 and {act.OTHER, act.NO_STAGE} <= stages
    assert len(alloc) <= 2 * (act.TOP_OWNERS + 1) * (act.TOP_STAGES + 2)
    # the same sums as the report, in GPU-seconds
    report = act.report_of(r.judged)
    for g in report["by_destination"]:
        total = sum(v for lab, v in alloc if lab["destination"] == g["key"])
        assert total == pytest.approx(g["allocated_gpu_hours"] * 3600)
        active = sum(v for lab, v in got["gpuorch_gpu_active_seconds"] if lab["destination"] == g["key"])
        assert active == pytest.approx(g["active_gpu_hours"] * 3600)
    verdicts = {(lab["destination"], lab["owner"], lab["stage"], lab["verdict"]): v for lab, v in got["gpuorch_attempts_diagnosed"]}
    assert verdicts[("east", "owner-0", "-", "data-bound")] == 1
    assert sum(verdicts.values()) == 151 == got["gpuorch_activity_round_attempts"][0][1]
    assert got["gpuorch_activity_round_timestamp_seconds"][0][1] == 1767225600.0


def test_before_the_first_round_the_families_are_there_and_empty() -> None:
    got = _samples(generate_latest(activity_registry(lambda: None)).decode())
    assert not any(got.get(name) for name in ACTIVITY_FAMILIES)


def test_promtool_accepts_the_exposition() -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    r = _round()
    out = subprocess.run([promtool, "check", "metrics"], input=generate_latest(activity_registry(lambda: r)),
                         capture_output=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    # and it does object to what it should: a counter without _total
    bad = subprocess.run([promtool, "check", "metrics"], input=b"# HELP x_seconds x\n# TYPE x_seconds counter\nx_seconds 1\n",
                         capture_output=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0
