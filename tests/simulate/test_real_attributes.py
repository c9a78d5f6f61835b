"""Real attributes from real traces (issue 30 item 3): the mapping reader on real rows of the ITP
and Alibaba GPU-sharing (openb) traces, GPU-model lists and shares honoured under every policy,
clusters from a node list, bad mapping files refused with their path and key, and the output
saying which fields were real."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpuorch.cli import main
from gpuorch.simulate.engine import simulate
from gpuorch.simulate.generator import GeneratorConfig, SimJob, generate
from gpuorch.simulate.mapping import MappingError, builtin_formats, load_mapping, parse_mapping
from gpuorch.simulate.model import ClusterModel
from gpuorch.simulate.policies import POLICIES
from gpuorch.simulate.trace import TraceJob, read_nodes, read_trace
from gpuorch.simulate.world import World, world_from_nodes
from gpuorch_proto.placement import accelerator_matches
from gpuorch_proto.workload import Sharing

from .builders import world
from .test_trace import ITP

DATA = Path(__file__).parent / "data" / "openb"
PODS = DATA / "openb_pod_list_gpuspec33.sample.csv"
NODES = DATA / "openb_node_list_gpu_node.sample.csv"


def _openb_world(fmt_name: str = "openb") -> World:
    fmt = load_mapping(fmt_name)
    assert fmt.nodes is not None
    return world_from_nodes(read_nodes(NODES, fmt), fmt.nodes.registry, fmt.source)


def _openb_jobs(w: World, seed: int = 0) -> list[SimJob]:
    fmt = load_mapping("openb")
    trace, _ = read_trace(PODS, fmt)
    cfg = GeneratorConfig.from_mapping(fmt.generator)
    return [generate(t, i, seed, w.datasets, cfg, fmt.sharing) for i, t in enumerate(trace)]


# ---- the reader on real rows -----------------------------------------------------------------------


def test_the_built_in_formats_are_mapping_files_read_by_the_one_reader() -> None:
    assert {"itp", "helios", "philly", "pai", "openb"} <= set(builtin_formats())
    itp = load_mapping("itp")
    assert itp.real == ("id", "submit", "duration", "gpus") and itp.source.endswith("formats/itp.yaml")
    jobs, stats = read_trace(ITP, "itp", limit=20)
    assert len(jobs) == 200 and stats.skipped == 0
    # the ITP trace records only the four fields: the others are None (generated)
    assert all(j.share is None and j.accelerators is None and j.cpu is None and j.memory is None for j in jobs)


def test_real_openb_rows_read_with_model_lists_shares_cpu_and_memory() -> None:
    jobs, stats = read_trace(PODS, "openb")
    rows = list(csv.DictReader(PODS.open()))
    # skipped: pods never scheduled (no scheduled_time: no run time) and CPU-only pods
    never = sum(1 for r in rows if not r["scheduled_time"])
    cpu_only = sum(1 for r in rows if r["scheduled_time"] and r["num_gpu"] == "0")
    assert stats.rows == len(rows) and stats.skipped == never + cpu_only and len(jobs) == len(rows) - never - cpu_only
    by = {j.job_id: j for j in jobs}
    # openb-pod-0135,3152,5600,1,1000,V100M16|V100M32,BE,Failed,10037662,10037952,10037729 (the clock starts at pod 0000's 0)
    j = by["openb-pod-0135"]
    assert (j.submit, j.duration, j.gpus, j.share) == (10037662, 10037952 - 10037729, 1, 1.0)
    assert j.accelerators == ("Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB")  # the mapping's models: product names
    assert j.cpu == pytest.approx(3.152) and j.memory == 5600 * 2**20 and not j.fractional
    # openb-pod-0351,4000,15258,1,220,T4,...: 0.22 of a T4
    f = by["openb-pod-0351"]
    assert f.fractional and f.share == pytest.approx(0.22) and f.accelerators == ("Tesla-T4",)
    assert by["openb-pod-0000"].accelerators == ()  # an empty gpu_spec: any model (real, not generated)


def test_a_recorded_field_replaces_its_draw_and_leaves_every_other_attribute_as_it_was() -> None:
    cfg = GeneratorConfig()
    bare = TraceJob("x", 0.0, 3600.0, 1, "f")
    full = TraceJob("x", 0.0, 3600.0, 1, "f", share=0.5, accelerators=("Tesla-T4",), cpu=4.0, memory=2.0**33)
    a = generate(bare, 0, 7, (), cfg)
    b = generate(full, 0, 7, (), cfg, Sharing(mechanism="time-slicing"))
    assert (a.memory_gib, a.store, a.workload.spec.image, a.declared_run, a.true_factor) == \
           (b.memory_gib, b.store, b.workload.spec.image, b.declared_run, b.true_factor)
    res = b.workload.spec.resources
    assert (res.gpus, res.sharing, res.accelerators, res.cpu, res.memory) == \
           (0.5, Sharing(mechanism="time-slicing"), ["Tesla-T4"], "4000m", str(2**33))
    assert b.per_worker == 1 and a.workload.spec.resources.sharing is None
    with pytest.raises(ValueError, match="names no sharing mechanism"):
        generate(full, 0, 7, (), cfg)


# ---- the node list ----------------------------------------------------------------------------------


def test_a_node_list_builds_the_clusters_its_rules_say() -> None:
    w = _openb_world()
    rows = list(csv.DictReader(NODES.open()))
    expect: Counter[str] = Counter()
    for r in rows:  # the shipped rules, computed here by hand: even T4/P100/G2 nodes share their GPUs
        shared = r["model"] in ("T4", "P100", "G2") and int(r["sn"][-1]) % 2 == 0
        expect[f"openb-{r['model'].lower()}{'-shared' if shared else ''}"] += 1
    assert {c.name: len(c.nodes) for c in w.clusters} == dict(expect)
    t4s = w.cluster("openb-t4-shared")
    gpus = {r["sn"]: int(r["gpu"]) for r in rows}
    assert all(n.sharing == ("time-slicing",) and n.gpus == 2 * gpus[n.name] and n.product == "Tesla-T4" for n in t4s.nodes)
    v = w.cluster("openb-v100m32").nodes[0]
    row = next(r for r in rows if r["sn"] == v.name)
    assert (v.cpu, v.memory, v.memory_mib, v.sharing) == (int(row["cpu_milli"]) / 1000, int(row["memory_mib"]) * 2**20, 32768, ())
    assert t4s.registry.artifact_stores == ["prod", "scratch"] and t4s.registry.queueing == "fifo"


def test_nodes_group_by_a_column_and_rules_leave_nodes_out(tmp_path: Path) -> None:
    nodes: dict[str, Any] = {"name": "sn", "gpus": "gpu", "model": "model", "cluster": {"column": "model", "prefix": "dc-"}}
    doc = {"jobs": {"id": "name", "submit": "creation_time", "duration": "d", "gpus": "num_gpu"}, "nodes": nodes}
    rows = read_nodes(NODES, parse_mapping(doc, "by-model.yaml"))
    assert Counter(r.cluster for r in rows) == Counter(f"dc-{r['model'].lower()}" for r in csv.DictReader(NODES.open()))
    nodes["cluster"] = {"rules": [{"where": {"model": "G2"}, "cluster": "big"}, {"cluster": None}]}
    rows = read_nodes(NODES, parse_mapping(doc, "g2-only.yaml"))
    assert {r.cluster for r in rows} == {"big"} and len(rows) == sum(1 for r in csv.DictReader(NODES.open()) if r["model"] == "G2")
    nodes["cluster"] = {"rules": [{"where": {"model": "G2"}, "cluster": "big"}]}
    with pytest.raises(MappingError, match=r"no-rule\.yaml: node 'openb-node-\d+' matches no rule of nodes.cluster.rules"):
        read_nodes(NODES, parse_mapping(doc, "no-rule.yaml"))


# ---- constraints and shares honoured under every policy --------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_model_lists_and_shares_are_honoured_under_every_policy(policy: str) -> None:
    w = _openb_world()
    jobs = _openb_jobs(w)
    assert sum(1 for j in jobs if j.accelerators) >= 50 and sum(1 for j in jobs if j.sharing) >= 50
    res = simulate(w, jobs, policy, seed=0)
    ran = [(j, r) for j, r in zip(jobs, res.jobs, strict=True) if not r.never]
    assert len(ran) >= 0.9 * len(jobs)
    for j, r in ran:
        nodes = w.cluster(r.cluster).nodes  # type: ignore[arg-type]
        if j.accelerators:  # every node of the cluster it ran on is a model of its list (clusters are per model)
            assert all(any(accelerator_matches(a, n.product) for a in j.accelerators) for n in nodes), (j.trace, r.cluster)
        # a share runs only where GPUs are time-sliced; a whole GPU never there
        assert all(bool(n.sharing) == (j.sharing is not None) for n in nodes), (j.trace, r.cluster)
    assert any(j.sharing for j, _ in ran) and any(j.accelerators for j, _ in ran)


def test_without_a_sharing_mechanism_a_share_never_runs_and_the_router_says_why() -> None:
    w = world({"name": "plain", "nodes": [{"name": "t4", "count": 2, "gpu": {"model": "Tesla-T4", "memory_mib": 15360, "count": 4}}],
               "registry": {"artifact_stores": ["prod", "scratch"]}})
    fmt = load_mapping("openb")
    share = TraceJob("s", 0.0, 600.0, 1, "f", share=0.46, accelerators=())
    whole = TraceJob("w", 0.0, 600.0, 1, "f", share=1.0, accelerators=())
    cfg = GeneratorConfig.from_mapping(fmt.generator)
    jobs = [generate(t, i, 0, (), cfg, fmt.sharing) for i, t in enumerate((share, whole))]
    for policy in POLICIES:
        s, wh = simulate(w, jobs, policy).jobs
        assert "SHARING" in s.never and not wh.never and wh.cluster == "plain", policy


def test_a_cluster_offers_a_share_only_its_shared_nodes_and_checks_cpu_and_memory() -> None:
    w = world({"name": "mixed", "nodes": [
        {"name": "ts", "count": 1, "sharing": "time-slicing", "gpu": {"model": "Tesla-T4", "memory_mib": 15360, "count": 4}},
        {"name": "t4", "count": 1, "gpu": {"model": "Tesla-T4", "memory_mib": 15360, "count": 4}},
        {"name": "v", "count": 1, "gpu": {"model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "count": 8}}]})
    m = ClusterModel(w.clusters[0])
    ts = Sharing(mechanism="time-slicing")
    assert m.suitable(0.0, (), 1, ts) == (0,)
    assert m.suitable(0.0, (), 1) == (1, 2)
    assert m.suitable(0.0, ("Tesla-T4",), 1) == (1,) and m.suitable(0.0, ("V100",), 1, ts) == ()
    fmt = load_mapping("openb")
    small = world_from_nodes(read_nodes(NODES, fmt), {}, "x")
    big = max(n.cpu or 0 for c in small.clusters for n in c.nodes)
    c = small.clusters[0]
    sh = ts if c.nodes[0].sharing else None
    assert ClusterModel(c).suitable(0.0, (), 1, sh, big + 1, 0.0) == ()  # more cores than any node has
    assert len(ClusterModel(c).suitable(0.0, (), 1, sh, 1.0, 2.0**30)) == len(c.nodes)


# ---- bad mapping files ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "where"), [
    ("jobs: {id: a, submit: b, duration: c, gpus: {column: g, scael: 100}}", "jobs.gpus.scael: unknown key"),
    ("jobs: {submit: b, duration: c, gpus: g}", "jobs.id: missing"),
    ("jobs: {id: a, submit: {column: b, unit: fortnights}, duration: c, gpus: g}", "jobs.submit.unit: unknown unit 'fortnights'"),
    ("jobs: {id: a, submit: b, duration: c, gpus: g, gpu_share: s}", "sharing: missing"),
    ("jobs: {id: a, submit: b, duration: c, gpus: g}\nsharing: magic", "sharing:"),
    ("jobs: {id: a, submit: b, duration: c, gpus: g}\nnodes: {name: n, gpus: g, model: m, cluster: {rules: [{cluster: x, replicas: 0}]}}",
     "nodes.cluster.rules[0].replicas"),
    ("jobs: {id: a, submit: b, duration: c, gpus: g}\nnodes: {name: n, gpus: g, model: m, cluster: {rules: [{cluster: x, where: {m: '('}}]}}",
     "nodes.cluster.rules[0].where.m: not a regular expression"),
    ("jobs: {id: a, submit: b, duration: c, gpus: g}\ncolumns: {}", "columns: unknown key"),
    ("jobs: [a, b", "not YAML"),
])
def test_a_bad_mapping_is_refused_naming_the_file_and_the_key(tmp_path: Path, text: str, where: str) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text(text)
    with pytest.raises(MappingError) as err:
        load_mapping(bad)
    assert str(err.value).startswith(str(bad)) and where in str(err.value)


def test_the_cli_refuses_a_bad_mapping_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text("jobs: {id: a, submit: b, duration: c, gpus: {column: g, scale: -1}}")
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(PODS), "--trace-format", str(bad)])
    assert str(done.value) == f"gpuorch simulate: {bad}: jobs.gpus.scale: expected a positive number, got -1"
    with pytest.raises(SystemExit, match="unknown trace format 'nosuch'"):
        main(["simulate", "--trace", str(PODS), "--trace-format", "nosuch"])


# ---- the output says which fields were real ---------------------------------------------------------


def test_the_output_says_which_fields_were_real(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--trace", str(PODS), "--trace-format", "openb", "--nodes", str(NODES), "--policy", "gpuorch,emptiest",
              "-o", "json"])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fields"]["real"] == ["name", "creation_time", "deletion_time - scheduled_time", "num_gpu", "gpu_milli", "gpu_spec",
                                     "cpu_milli", "memory_mib"]
    assert doc["fields"]["real_fields"]["accelerators"] == "gpu_spec"
    generated = doc["fields"]["generated"]
    assert "accelerator" not in generated and "CPU (1 core per worker)" not in generated and "GPU memory floor" in generated
    assert doc["nodes"]["nodes"] == sum(1 for _ in csv.DictReader(NODES.open())) and doc["fractional_jobs"] > 0
    assert sorted(doc["clusters"]) == sorted(c.name for c in _openb_world().clusters)
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(PODS), "--trace-format", "openb", "--nodes", str(NODES), "--nodes-by", "model",
              "--policy", "emptiest"])
    out = capsys.readouterr().out
    assert "real fields: name, creation_time, deletion_time - scheduled_time, num_gpu, gpu_milli, gpu_spec" in out
    assert "generated (seeded): GPU memory floor, gang shape" in out and "174 nodes" in out


def test_the_documented_mapping_example_reads_a_trace_and_a_node_list(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulation.md").read_text()
    section = doc[doc.index("## Replaying your own trace"):]
    text = section[section.index("```yaml") + len("```yaml"):section.index("```\n", section.index("```yaml") + 7)]
    (tmp_path / "my-trace.yaml").write_text(text)
    fmt = load_mapping(tmp_path / "my-trace.yaml")
    assert fmt.real == ("id", "submit", "duration", "gpus", "gpu_share", "accelerators", "cpu", "memory")
    (tmp_path / "jobs.csv").write_text("id,queued_at,started,finished,gpus,gpu_frac,allowed,cores,mem_gb\n"
                                       "a,1000,5,65,1,0.25,T4;P100,2,8\nb,3000,0,7200,4,1,,16,64\n")
    jobs, _ = read_trace(tmp_path / "jobs.csv", fmt)
    assert [(j.job_id, j.submit, j.duration, j.gpus, j.share, j.accelerators, j.cpu, j.memory) for j in jobs] == [
        ("a", 0.0, 60.0, 1, 0.25, ("Tesla-T4", "P100"), 2.0, 8 * 2**30), ("b", 2.0, 7200.0, 4, 1.0, (), 16.0, 64 * 2**30)]
    (tmp_path / "nodes.csv").write_text("host,site,gpus,model,cores,mem_gb\nh1,ams-1,4,T4,32,128\nh2,ams-2,8,A100,64,512\n"
                                        "h3,fra,8,A100,64,512\nh4,fra,4,K80,16,64\n")
    rows = read_nodes(tmp_path / "nodes.csv", fmt)
    assert [(r.name, r.cluster, r.gpus, r.sharing) for r in rows] == [
        ("h1", "ams-shared", 16, ("time-slicing",)), ("h2", "ams", 8, ()), ("h3", "fra", 8, ())]


def test_the_example_mapping_builds_two_regions_from_the_openb_nodes() -> None:
    fmt = load_mapping(Path(__file__).resolve().parents[2] / "examples" / "sim" / "openb-east-west.yaml")
    rows = read_nodes(NODES, fmt)
    csv_rows = list(csv.DictReader(NODES.open()))
    assert Counter(r.cluster for r in rows) == Counter(
        "east" if r["sn"][-1] in "01" else "west" for r in csv_rows if r["sn"][-1] in "0156")
    assert all(bool(r.sharing) == (r.name[-1] in "05" and r.product in ("Tesla-T4", "Tesla-P100-PCIE-16GB", "G2")) for r in rows)
    jobs, _ = read_trace(PODS, fmt)
    plain, _ = read_trace(PODS, "openb")
    assert [j.submit * 100 for j in jobs] == pytest.approx([j.submit for j in plain])  # arrivals 100 times faster
