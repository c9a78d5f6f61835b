"""Routing facts that need the whole system: staged data becomes a cache hit; the CLI explains."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import workload_to_builtins
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e


async def test_dataset_staged_to_a_cluster_is_a_cache_hit_for_later_runs(system: System, client: Client) -> None:
    first = await client.submit(train("stage-beta", steps=3, requirements={"clusters": ["beta"]}))
    view = await client.wait(first, timeout=120)
    assert view.status == "completed" and view.latest_attempt is not None and view.latest_attempt.cluster == "beta"
    beta_verdict = next(v for v in view.decision.verdicts if v.cluster == "beta")  # type: ignore[union-attr]
    assert beta_verdict.estimate is not None and beta_verdict.estimate.data_staging > 0, "beta had to copy mnist@v1"

    async def cached_on_beta() -> bool:
        snaps = await client.snapshots()
        return "mnist@v1" in snaps["beta"].registry.datasets_cached

    await assert_eventually(cached_on_beta, timeout=30)
    second = await client.submit(train("after-stage", steps=3, requirements={"clusters": ["beta"]}))
    view2 = await client.wait(second, timeout=120)
    verdict2 = next(v for v in view2.decision.verdicts if v.cluster == "beta")  # type: ignore[union-attr]
    assert verdict2.estimate is not None and verdict2.estimate.data_staging == 0, verdict2


def gpuorch(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "gpuorch"
    return subprocess.run([str(cli), "--state", str(system.state_dir), *args], capture_output=True, text=True, timeout=180)


def test_cli_submit_get_list_explain_events_clusters(system: System, tmp_path: Path) -> None:
    system.save()
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(workload_to_builtins(train("cli", steps=3))))
    out = gpuorch(system, "submit", str(f), "--wait", "-o", "json")
    assert out.returncode == 0, out.stderr
    wid = json.loads(out.stdout)["id"]
    got = json.loads(gpuorch(system, "get", wid, "-o", "json").stdout)
    assert got["status"] == "completed" and got["promoted"] == f"{wid}-a1"
    assert any(r["id"] == wid for r in json.loads(gpuorch(system, "list", "-o", "json").stdout))
    explain = gpuorch(system, "explain", wid)
    assert explain.returncode == 0 and "alpha" in explain.stdout and "beta" in explain.stdout
    exp_json = json.loads(gpuorch(system, "explain", wid, "-o", "json").stdout)
    assert exp_json["decision"]["cluster"] == got["cluster"] and len(exp_json["decision"]["verdicts"]) == 2
    events = [json.loads(line)["type"] for line in gpuorch(system, "events", wid, "-o", "json").stdout.splitlines()]
    assert events[0] == "submitted" and events[-1] == "completed"
    clusters = json.loads(gpuorch(system, "clusters", "-o", "json").stdout)
    assert set(clusters) == {"alpha", "beta"} and clusters["alpha"]["reachable"]
    doc = workload_to_builtins(train("cli-bad", steps=3))
    doc["spec"]["resources"]["gpus"] = 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    refused = gpuorch(system, "submit", str(bad))
    assert refused.returncode == 2 and "spec.resources.gpus: 0.5 is not a whole number" in refused.stderr
    missing = gpuorch(system, "get", "no-such-0000000000")
    assert missing.returncode == 1 and "no workload" in missing.stderr


def test_cli_dry_run_decides_by_the_routers_path(system: System, tmp_path: Path) -> None:
    """`submit --dry-run` folds the log and takes the snapshots as the router does, then decides
    by `core.decide`: a new workload's decision is the one the router then makes (the same
    cluster, eligibility and learnt run time); with the key of a workload that waits for no
    decision it says so; another document under that key is refused, as the router refuses it."""
    system.save()
    f = tmp_path / "dry.yaml"
    f.write_text(yaml.safe_dump(workload_to_builtins(train("dry", steps=3))))
    dry = gpuorch(system, "submit", str(f), "--dry-run", "--key", "dry-1", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    got = json.loads(dry.stdout)
    assert got["attempt"] == 1 and "a new workload" in got["note"] and got["decision"]["outcome"] == "routed", got
    text = gpuorch(system, "submit", str(f), "--dry-run", "--key", "dry-1")
    assert text.returncode == 0 and "dry run: nothing submitted" in text.stdout and got["decision"]["cluster"] in text.stdout
    out = gpuorch(system, "submit", str(f), "--key", "dry-1", "--wait", "-o", "json")
    assert out.returncode == 0, out.stderr
    wid = json.loads(out.stdout)["id"]
    assert wid == got["workload_id"]
    routed = json.loads(gpuorch(system, "explain", wid, "-o", "json").stdout)["decision"]

    def seen(d: dict) -> list[tuple[str, bool, float | None]]:  # type: ignore[type-arg]
        return [(v["cluster"], v["eligible"], v["estimate"]["run"] if v["estimate"] else None) for v in d["verdicts"]]

    assert routed["cluster"] == got["decision"]["cluster"] and seen(routed) == seen(got["decision"]), (routed["summary"], got["decision"]["summary"])
    done = gpuorch(system, "submit", str(f), "--dry-run", "--key", "dry-1", "-o", "json")
    assert done.returncode == 0 and json.loads(done.stdout)["decision"] is None, done.stdout
    assert "waits for no routing decision" in json.loads(done.stdout)["note"]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(workload_to_builtins(train("dry", steps=4))))
    refused = gpuorch(system, "submit", str(other), "--dry-run", "--key", "dry-1")
    assert refused.returncode == 2 and "exists with a different body" in refused.stderr, refused.stderr


async def test_cli_logs_of_the_running_attempt_and_a_cluster_that_does_not_answer(system: System, client: Client) -> None:
    """`gpuorch logs`: the trainer's output through its cluster's API (the attempt's pods only);
    what cannot be shown says why; a partitioned cluster is reported, not waited on."""
    system.save()
    wid = await client.submit(train("logs", steps=3000))

    async def printed() -> subprocess.CompletedProcess[str]:
        out = await asyncio.to_thread(gpuorch, system, "logs", wid)
        assert out.returncode == 0 and "training step=" in out.stdout, (out.returncode, out.stdout[-300:], out.stderr[-300:])
        return out

    out = await assert_eventually(printed, timeout=90, interval=0.5)
    assert out.stdout.startswith("input mnist@v1"), out.stdout[:200]  # its own output, from the start
    v = await client.view(wid)
    assert v is not None and v.latest_attempt is not None
    cluster = v.latest_attempt.cluster
    stage = await asyncio.to_thread(gpuorch, system, "logs", wid, "--container", "stage-0")
    assert stage.returncode == 0 and '"dataset": "mnist@v1"' in stage.stdout, stage.stdout + stage.stderr  # gpuorch's agent
    no_worker = await asyncio.to_thread(gpuorch, system, "logs", wid, "--worker", "3")
    assert no_worker.returncode == 1 and "no pod of worker 3 (workers: [0])" in no_worker.stderr, no_worker.stderr
    no_attempt = await asyncio.to_thread(gpuorch, system, "logs", wid, "--attempt", "7")
    assert no_attempt.returncode == 1 and "has no attempt 7 (it has 1)" in no_attempt.stderr, no_attempt.stderr
    system.fault(cluster, "partition")
    try:
        cut = await asyncio.to_thread(gpuorch, system, "logs", wid, "--attempt", "1")
        assert cut.returncode == 1 and f"on cluster {cluster}" in cut.stderr and "does not answer" in cut.stderr, cut.stderr
    finally:
        system.fault(cluster, "heal")
        await client.cancel(wid)
    assert (await client.wait(wid, timeout=120)).status == "cancelled"
