"""What-if: the change grammar, the changed world, the other tenants' load, the diff, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuorch.cli import main
from gpuorch.simulate.engine import background_jobs, simulate
from gpuorch.simulate.generator import GeneratorConfig
from gpuorch.simulate.report import summarize
from gpuorch.simulate.whatif import (
    METRICS,
    Change,
    WhatIfError,
    apply,
    background_for,
    diff,
    markdown,
    measures,
    parse_change,
    utilization,
)
from gpuorch.simulate.world import load_world
from tests.test_layering import FORBIDDEN, _closure

from .builders import cluster, jobs, world
from .test_trace import ITP

DOCUMENTED = Path(__file__).resolve().parents[2] / "deploy" / "sim" / "clusters.yaml"
BG = {"utilization": 0.3, "gpus": 4, "mean_seconds": 3600}


def _mixed():  # type: ignore[no-untyped-def]
    lab = cluster("lab", nodes=2)
    lab["nodes"].append({"name": "lab-dev", "count": 3, "pool": "dev",
                         "gpu": {"model": "Tesla-V100-SXM2-16GB", "memory_mib": 16384, "count": 8}})
    return world(cluster("east", nodes=2, background=BG), lab, cluster("west", nodes=1, background=BG))


# ---- the grammar -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "want"), [
    ("east-h100:+16 nodes", Change("east-h100", None, 16, "east-h100:+16 nodes")),
    ("east-h100:-2 node", Change("east-h100", None, -2, "east-h100:-2 node")),
    ("east-h100:+3", Change("east-h100", None, 3, "east-h100:+3")),
    ("east-h100: +4nodes", Change("east-h100", None, 4, "east-h100: +4nodes")),
    ("central-lab/dev:+4 nodes", Change("central-lab", "dev", 4, "central-lab/dev:+4 nodes")),
], ids=["add", "remove-singular-unit", "no-unit", "unit-glued-on", "pool-selector"])
def test_a_change_reads_cluster_selector_and_signed_count(text: str, want: Change) -> None:
    assert parse_change(text) == want


@pytest.mark.parametrize(("text", "names"), [
    ("east-h100 +16 nodes", "no ':'"),
    (":+16 nodes", "no cluster before ':'"),
    ("east-h100:16 nodes", "'16' is not a signed whole number of nodes (a sign is required"),
    ("east-h100:+1.5 nodes", "'+1.5' is not a signed whole number"),
    ("east-h100:+16 gpus", "unknown unit 'gpus'"),
    ("east-h100:+16 nodes please", "unexpected 'please' after '+16 nodes'"),
    ("east-h100:+0 nodes", "'+0' changes nothing"),
    ("east-h100:", "nothing after ':'"),
    ("central-lab/:+1 nodes", "'central-lab/' is not CLUSTER or CLUSTER/POOL-OR-GPU"),
    ("east h100:+1 nodes", "'east h100' is not CLUSTER"),
], ids=["no-colon", "no-cluster", "no-sign", "fraction", "wrong-unit", "trailing-word", "zero", "no-change",
        "empty-selector", "space-in-name"])
def test_a_bad_change_is_refused_naming_the_bad_part(text: str, names: str) -> None:
    with pytest.raises(WhatIfError) as err:
        parse_change(text)
    assert f'what-if "{text}"' in str(err.value) and names in str(err.value)


# ---- the changed world -------------------------------------------------------------------------

def test_adding_nodes_copies_the_kind_with_new_names_and_leaves_the_rest() -> None:
    w = _mixed()
    got = apply(w, [parse_change("east:+3 nodes"), parse_change("lab/V100:+2 nodes")])
    east, lab = got.cluster("east"), got.cluster("lab")
    assert [n.name for n in east.nodes] == ["east-n-0", "east-n-1", "east-n-2", "east-n-3", "east-n-4"]
    assert east.gpus == 40 and {(n.product, n.gpus, n.pool) for n in east.nodes} == {("NVIDIA-A100-SXM4-80GB", 8, "train")}
    assert [n.name for n in lab.nodes] == ["lab-n-0", "lab-n-1", "lab-dev-0", "lab-dev-1", "lab-dev-2", "lab-dev-3", "lab-dev-4"]
    assert got.cluster("west") == w.cluster("west") and east.registry == w.cluster("east").registry
    assert w.cluster("east").gpus == 16  # the baseline is untouched


def test_removing_nodes_takes_the_kinds_last_ones() -> None:
    got = apply(_mixed(), [parse_change("lab/dev:-2 nodes")]).cluster("lab")
    assert [n.name for n in got.nodes] == ["lab-n-0", "lab-n-1", "lab-dev-0"]


@pytest.mark.parametrize(("text", "names"), [
    ("eats:+1 nodes", "no cluster 'eats' in the clusters file; known: east, lab, west"),
    ("lab:+1 nodes", 'lab has 2 kinds of node (pool train: 2 x NVIDIA-A100-SXM4-80GB (8 GPUs); pool dev: 3 x '
                     'Tesla-V100-SXM2-16GB (8 GPUs)); name one after a slash, e.g. "lab/train:+1 nodes"'),
    ("lab/H100:+1 nodes", "no pool or GPU model 'H100' in lab"),
    ("lab/SXM:+1 nodes", "'SXM' matches 2 kinds of node in lab"),
    ("lab/dev:-4 nodes", "lab has 3 such nodes (pool dev: 3 x Tesla-V100-SXM2-16GB (8 GPUs)); cannot remove 4"),
    ("west:-1 nodes", "removes every node of west"),
], ids=["unknown-cluster", "mixed-cluster-without-selector", "selector-matches-nothing", "ambiguous-selector",
        "removes-too-many", "empties-a-cluster"])
def test_a_change_the_world_cannot_take_is_refused_with_what_it_has(text: str, names: str) -> None:
    with pytest.raises(WhatIfError) as err:
        apply(_mixed(), [parse_change(text)])
    assert names in str(err.value)


def test_the_documented_example_names_a_cluster_the_documented_world_has() -> None:
    base = load_world(DOCUMENTED)
    got = apply(base, [parse_change("east-h100:+16 nodes")])
    assert got.cluster("east-h100").gpus == base.cluster("east-h100").gpus + 128
    assert sum(c.gpus for c in got.clusters) == sum(c.gpus for c in base.clusters) + 128


# ---- the other tenants ---------------------------------------------------------------------------

def test_an_unchanged_clusters_background_stays_as_it_was_and_a_new_one_gets_its_own() -> None:
    base = world(cluster("east", nodes=2, background=BG), cluster("west", nodes=2, background=BG))
    what = world(cluster("new", nodes=2, background=BG), cluster("west", nodes=6, background=BG),
                 cluster("east", nodes=2, background={**BG, "utilization": 0.6}))
    horizon = 40 * 3600.0
    got = background_for(base, what, 3, horizon)
    base_jobs = background_jobs(base, 3, horizon)
    own = background_jobs(what, 3, horizon)
    west = [(j.submit, j.gpus, j.run) for j in got if j.cluster == 1]
    assert west == [(j.submit, j.gpus, j.run) for j in base_jobs if j.cluster == 1]  # 3x the nodes, the same work
    assert west != [(j.submit, j.gpus, j.run) for j in own if j.cluster == 1]
    assert [j for j in got if j.cluster == 0] == [j for j in own if j.cluster == 0]  # new: its own
    assert [j for j in got if j.cluster == 2] == [j for j in own if j.cluster == 2]  # its background changed: its own
    assert [j.submit for j in got] == sorted(j.submit for j in got)


# ---- the measures and the diff ---------------------------------------------------------------------

def test_the_diff_is_what_if_minus_baseline_per_policy_and_metric() -> None:
    keys = [k for k, _ in METRICS]
    base = {"a": dict.fromkeys(keys, 4.0), "b": dict.fromkeys(keys, 0.0)}
    what = {"b": dict.fromkeys(keys, 1.5), "a": {**dict.fromkeys(keys, 4.0), "jct_mean_h": 3.0, "utilization_pct": 5.0}}
    got = {(d.policy, d.metric): d for d in diff(base, what)}
    assert [(d.policy, d.metric) for d in diff(base, what)][:2] == [("a", "jct_mean_h"), ("a", "jct_p50_h")]
    mean = got[("a", "jct_mean_h")]
    assert (mean.baseline, mean.what_if, mean.delta, mean.delta_pct) == (4.0, 3.0, -1.0, -25.0)
    assert got[("a", "utilization_pct")].delta_pct == pytest.approx(25.0) and got[("a", "jct_p99_h")].delta == 0.0
    assert got[("b", "wait_mean_h")].delta == 1.5 and got[("b", "wait_mean_h")].delta_pct is None  # from zero: no per cent
    table = markdown(diff(base, what))
    assert "| a | mean JCT (h) | 4.00 | 3.00 | -1.00 | -25.0 % |" in table and "| 0.00 | 1.50 | +1.50 | n/a |" in table
    with pytest.raises(ValueError, match="lacks policies b"):
        diff(base, {"a": what["a"]})


def test_utilization_is_busy_gpu_time_over_the_fleet_in_the_window() -> None:
    w = world(cluster("one", nodes=1))  # 8 GPUs
    r = simulate(w, jobs([(0.0, 7200.0, 8), (0.0, 3600.0, 4)], w), "emptiest")
    # 8 GPUs from 0 for 2 h + 60 s startup (image cached), then 4 GPUs from 7,260 s to 10,920 s
    assert utilization(r, 4 * 3600.0) == pytest.approx(100 * (8 * 7260 + 4 * 3660) / (8 * 4 * 3600))
    assert utilization(r, 3 * 3600.0) == pytest.approx(100 * (8 * 7260 + 4 * (10800 - 7260)) / (8 * 3 * 3600))
    assert utilization(r, 1.0) == pytest.approx(100.0)  # the first (whole) hour: every GPU busy
    row = summarize(r)
    got = measures(row, r, 3 * 3600.0)
    assert list(got) == [k for k, _ in METRICS] and got["jct_mean_h"] == row.jct_mean_h


@pytest.mark.parametrize("extra", [1, 3])
def test_on_one_cluster_of_whole_node_jobs_more_nodes_finish_every_job_no_later(extra: int) -> None:
    """Strict FIFO, identical nodes, every job one whole node: by induction the nodes' free times only
    move earlier, so no job can finish later. (Across clusters the bound is greedy, and extra
    capacity may move a percentile the wrong way: docs/simulation.md shows one.)"""
    base = world(cluster("east", nodes=2))
    more = apply(base, [parse_change(f"east:+{extra} nodes")])
    js = jobs([(500.0 * k, 3600.0 + 700 * (k % 9), 8) for k in range(60)], base)
    before = simulate(base, js, "clairvoyant").jobs
    after = simulate(more, js, "clairvoyant").jobs
    assert sum(j.wait for j in before) > 3600  # the baseline is short of nodes: the question means something
    assert all(a.completion <= b.completion for a, b in zip(after, before, strict=True))
    assert sum(a.completion for a in after) < sum(b.completion for b in before)  # and the extra nodes are used


@pytest.mark.parametrize("extra", [1, 2, 6])
def test_more_nodes_on_one_of_two_clusters_do_not_make_the_clairvoyant_bound_worse_on_average(extra: int) -> None:
    base = world(cluster("east", nodes=2, background=BG), cluster("slow", nodes=2, model="Tesla-V100-SXM2-32GB",
                                                                  memory_mib=32768, background=BG), interval=5.0)
    more = apply(base, [parse_change(f"east:+{extra} nodes")])
    js = jobs([(600.0 * k, 3600.0 + 900 * (k % 7), [8, 4, 2][k % 3]) for k in range(80)], base, GeneratorConfig(), seed=4)
    horizon = max(j.submit for j in js)
    before = summarize(simulate(base, js, "clairvoyant", seed=4, background=background_jobs(base, 4, horizon)))
    after = summarize(simulate(more, js, "clairvoyant", seed=4, background=background_for(base, more, 4, horizon)))
    assert before.wait_mean_h > 0.5
    assert after.jct_mean_h < before.jct_mean_h and after.wait_mean_h <= before.wait_mean_h


# ---- the command -------------------------------------------------------------------------------

def test_the_command_replays_both_fleets_and_writes_the_diff_and_its_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(ITP), "--limit", "30", "--policy", "emptiest,clairvoyant", "--days", "20",
              "--what-if", "east-h100:+16 nodes", "--what-if", "central-lab/dev:-4 nodes", "-o", "json", "--plot", str(tmp_path)])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"]["gpus"] == 1824 and doc["what_if"]["gpus"] == 1824 + 128 - 32
    assert doc["what_if"]["changes"] == ["east-h100:+16 nodes", "central-lab/dev:-4 nodes"]
    assert 0 < doc["jobs"] < 300 and doc["utilization_window_s"] < 20 * 86400  # only the first 20 days
    assert [(d["policy"], d["metric"]) for d in doc["diff"]][:1] == [("emptiest", "jct_mean_h")] and len(doc["diff"]) == 12
    base = {p["policy"]: p for p in doc["baseline"]["policies"]}
    for d in doc["diff"]:
        if d["metric"] == "jct_mean_h":
            assert d["baseline"] == base[d["policy"]]["jct_mean_h"]
            assert d["delta"] == pytest.approx(d["what_if"] - d["baseline"])
    assert doc["plots"] == [str(tmp_path / "whatif.png")] and (tmp_path / "whatif.png").read_bytes()[:4] == b"\x89PNG"


def test_the_same_fleet_as_a_what_if_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(ITP), "--limit", "15", "--policy", "gpuorch,random", "--what-if-clusters",
              str(DOCUMENTED), "-o", "json"])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["diff"]) == 12 and all(d["delta"] == 0 for d in doc["diff"])
    assert doc["baseline"]["policies"][0]["ran"] > 100


@pytest.mark.parametrize(("args", "names"), [
    (["--what-if", "east-h10:+16 nodes"], "no cluster 'east-h10' in"),
    (["--what-if", "east-h100:16 nodes"], "'16' is not a signed whole number"),
    (["--days", "0"], "--days 0.0: give a positive number of days"),
], ids=["unknown-cluster", "unsigned", "no-days"])
def test_the_command_refuses_bad_input_with_one_clear_line(args: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(ITP), "--limit", "5", *args])
    assert isinstance(done.value.code, str) and done.value.code.startswith("gpuorch simulate: ") and names in done.value.code
    if "east-h10:" in args[-1]:
        assert "known: east-h100, east-a100, central-a100" in done.value.code


def test_the_what_if_module_imports_no_io() -> None:
    bad = {m for m in _closure("gpuorch.simulate.whatif") if m.split(".")[0] in FORBIDDEN}
    assert not bad, bad
