"""Whole replays: determinism, the clairvoyant's exact knowledge, every policy, the CLI, purity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuorch.cli import main
from gpuorch.simulate.engine import Simulation, simulate
from gpuorch.simulate.generator import GeneratorConfig
from gpuorch.simulate.policies import POLICIES, Choice, Context
from gpuorch.simulate.report import markdown, summarize
from tests.test_layering import FORBIDDEN, _closure

from .builders import cluster, jobs, world
from .test_trace import ITP

BG = {"utilization": 0.4, "gpus": 4, "mean_seconds": 3600}
DS = [{"name": "a", "size_gb": 200, "locations": ["east"], "weight": 3}, {"name": "b", "size_gb": 20, "locations": ["west"]}]


def _world():  # type: ignore[no-untyped-def]
    return world(
        cluster("east", nodes=3, local=["east"], bandwidth={"west": 100}, background=BG, price=3.0),
        cluster("west", nodes=2, model="NVIDIA-H100-80GB-HBM3", memory_mib=81559, local=["west"], bandwidth={"east": 100},
                background=BG, price=4.5),
        cluster("slow", nodes=6, model="Tesla-V100-SXM2-32GB", memory_mib=32768, bandwidth={"east": 500, "west": 500},
                background=BG, price=1.0),
        datasets=DS, interval=5.0,
    )


def _trace(n: int = 150):  # type: ignore[no-untyped-def]
    return [(300.0 * k + (k % 3), 1200.0 + 331 * (k % 11), [1, 1, 2, 4, 8, 16][k % 6]) for k in range(n)]


def _table(seed: int, policies: tuple[str, ...] = ("gpuorch", "emptiest", "random")) -> str:
    w = _world()
    js = jobs(_trace(), w, GeneratorConfig(), seed=seed)
    return markdown([summarize(simulate(w, js, p, seed=seed)) for p in policies])


def test_the_same_seed_gives_the_same_table_and_another_seed_another() -> None:
    first = _table(7)
    assert _table(7) == first
    assert _table(8) != first


def test_the_clairvoyant_knows_each_jobs_true_completion_time_where_it_puts_it() -> None:
    w = _world()
    js = jobs(_trace(), w, GeneratorConfig(), seed=1)
    promised: dict[int, float] = {}

    def oracle(job, ctx: Context, now: float) -> Choice:  # type: ignore[no-untyped-def]
        elig, why = ctx.eligible(job)
        if not elig:
            return Choice(None, "rejected", why)
        best = min(elig, key=lambda i: (ctx.true_completion(job, i, now), ctx.models[i].name))
        promised[job.index] = ctx.true_completion(job, best, now)
        return Choice(best)

    r = Simulation(w, js, oracle, seed=1).run()
    ran = [j for j in r.jobs if not j.never]
    assert len(ran) > 100 and all(j.completion == pytest.approx(promised[j.index]) for j in ran)
    assert any(j.wait > 0 for j in ran) and any(j.staging_s > 0 for j in ran)  # queues and copies were in play


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_every_runnable_job_exactly_once(policy: str) -> None:
    w = _world()
    r = simulate(w, jobs(_trace(60), w, GeneratorConfig(), seed=2), policy, seed=2)
    for j in r.jobs:
        assert (j.never != "") == (j.cluster is None)
        if not j.never:
            assert j.submit <= j.start < j.end < j.completion and j.gpu_hours > 0
    row = summarize(r)
    assert row.ran + row.never == 60 and row.ran > 40


def test_the_command_replays_real_itp_rows_and_writes_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(ITP), "--limit", "20", "--policy", "gpuorch,emptiest", "--seed", "3", "-o", "json",
              "--plot", str(tmp_path)])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["jobs"] == 200 and [p["policy"] for p in doc["policies"]] == ["gpuorch", "emptiest"]
    assert doc["fields"]["real"] == ["job_id", "submission_time", "duration", "num_gpu"] and "accelerator" in doc["fields"]["generated"]
    assert all(p["ran"] + p["never"] == 200 and p["jct_mean_h"] > 0 for p in doc["policies"])
    for name in ("jct-cdf.png", "load-per-cluster.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def _command_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(ITP), "--limit", "20", "--seed", "3", "-o", "json", *args])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    del doc["wall_seconds"]
    for p in doc["policies"]:
        assert p.pop("cpu_seconds") > 0  # measured in the process that replayed it
    return doc


def test_policies_replayed_in_worker_processes_give_the_same_table(capsys: pytest.CaptureFixture[str]) -> None:
    policies = "gpuorch,emptiest,random,clairvoyant"
    apart = _command_json(capsys, "--policy", policies, "--workers", "2")
    together = _command_json(capsys, "--policy", policies, "--workers", "1")
    assert [p["policy"] for p in apart["policies"]] == policies.split(",")  # type: ignore[index]
    assert apart == together


def test_a_replay_leaves_the_collector_as_it_found_it() -> None:
    import gc

    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    w = _world()
    simulate(w, jobs(_trace(20), w, GeneratorConfig(), seed=0), "gpuorch")
    assert gc.get_threshold() == thresholds and gc.isenabled() == enabled and gc.get_freeze_count() == 0


@pytest.mark.parametrize("module", ["gpuorch.simulate.engine", "gpuorch.simulate.model", "gpuorch.simulate.policies",
                                    "gpuorch.simulate.generator", "gpuorch.simulate.report"])
def test_the_simulators_core_imports_no_io(module: str) -> None:
    bad = {m for m in _closure(module) if m.split(".")[0] in FORBIDDEN}
    assert not bad, bad
