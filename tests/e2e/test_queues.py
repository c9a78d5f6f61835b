"""`gpuorch queues` on the running system (issue 32): the real CLI, as a subprocess, against a real
nats-server with the generated permissions, the four services and one local cluster.

The policy's `research` queue allows 2 running workloads. `team-a` submits two long jobs (both
released and running), then `team-b` one and `team-a` a third: both held by the queue's limit.
`gpuorch queues -o json` must say so: 2 released and running, 2 held, both by `queue research:
running workloads`, each owner's share of it, the oldest waiting (`team-b`'s), and the cluster's
queue from the inventory's snapshot. A policy file with an error gets its path and field, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj
from gpuorch_proto import events as ev
from tests.support.system import one_node, registry, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

SCALE = 600
CLUSTERS = registry(one_node("solo", 4, cpu="16", memory="64Gi"), time_scale=SCALE, admission_policy="policy.yaml")
POLICY = {
    "queues": [{"name": "default"}, {"name": "research", "limits": {"max_running": 2}}],
    "default_queue": "default",
}
# sleeps its run time (simulated seconds / the cluster's time scale): long enough to hold its slot
WORK = "import os, time; time.sleep(float(os.environ['RUN_SECONDS']) / float(os.environ['GPUORCH_TIME_SCALE']))"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("e2e-queues"), clusters=CLUSTERS, policy=POLICY) as s:
        s.save()  # system.json: what the CLI reads to reach it
        yield s


def job(name: str, owner: str) -> Workload:
    return workload_from_obj({
        "metadata": {"name": name, "owner": owner},
        "spec": {
            "image": "example.org/gpuorch/train@sha256:" + "5e" * 32,
            "command": ["python", "-c", WORK],
            "env": {"RUN_SECONDS": str(300 * SCALE)},
            "resources": {"gpus": 1, "gpu_memory_gib": 80, "cpu": "1", "memory": "1Gi"},
            "output": {"store": "prod"},
            "policy_queue": "research",
        },
    })  # fmt: skip


def gpuorch(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "gpuorch"
    return subprocess.run([str(cli), "--state", str(system.state_dir), *args], capture_output=True, text=True, timeout=90)


async def verdict(client: Client, wid: str) -> type:
    got = [type(e) for _, e in await client.events(wid) if isinstance(e, ev.Held | ev.Released)]
    assert got, f"no verdict on {wid} yet"
    return got[0]


async def test_queues_shows_running_and_held_work_with_the_reasons_counted(system: System, client: Client) -> None:
    a1 = await client.submit(job("a1", "team-a"))
    a2 = await client.submit(job("a2", "team-a"))

    async def both_running() -> bool:
        for wid in (a1, a2):
            v = await client.view(wid)
            assert v is not None and v.status == "running", (wid, v and v.status, v and v.reason)
        return True

    await assert_eventually(both_running, timeout=60, interval=0.3)
    b1 = await client.submit(job("b1", "team-b"))
    a3 = await client.submit(job("a3", "team-a"))
    for wid in (b1, a3):
        assert await assert_eventually(lambda w=wid: verdict(client, w), timeout=30, interval=0.2) is ev.Held  # type: ignore[misc]

    async def inventory_published() -> bool:
        return "solo" in await client.snapshots()

    await assert_eventually(inventory_published, timeout=30, interval=0.5)

    out = gpuorch(system, "queues", "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["policy"] == str((system.state_dir / "policy.yaml").resolve()) and doc["time_scale"] == SCALE
    q: dict[str, Any] = next(x for x in doc["queues"] if x["name"] == "research")
    assert (q["released"], q["running"], q["waiting"], q["held"]) == (2, 2, 2, 2), q
    assert q["held_reasons"] == [
        {"scope": "queue", "name": "research", "kind": "running", "workloads": 2, "reason": "queue research: running workloads"}
    ]
    assert {"kind": "running", "used": 2, "limit": 2} == {k: v for k, v in q["limits"][0].items() if k in ("kind", "used", "limit")}
    assert q["oldest_waiting"]["workload_id"] == b1, q["oldest_waiting"]
    owners = {o["owner"]: o for o in q["owners"]}
    assert (owners["team-a"]["released"], owners["team-a"]["running"], owners["team-a"]["held"]) == (2, 2, 1)
    assert (owners["team-b"]["released"], owners["team-b"]["held"]) == (0, 1)
    assert owners["team-a"]["oldest_waiting"]["workload_id"] == a3
    assert [o["kind"] for o in owners["team-b"]["held_reasons"]] == ["running"]
    solo = [c for c in doc["clusters"] if c["cluster"] == "solo"]
    assert solo and solo[0]["reachable"] and solo[0]["queue"] == "default", solo
    assert solo[0]["estimated_wait_seconds"] is not None and solo[0]["snapshot_age_seconds"] < 60, solo

    table = gpuorch(system, "queues")
    assert table.returncode == 0, table.stderr
    assert "queue research (priority 0; may submit: *)" in table.stdout, table.stdout
    assert "held:    2 x queue research: running workloads" in table.stdout, table.stdout
    assert "work:    2 released (2 running, 2 GPUs), 2 waiting (2 held)" in table.stdout, table.stdout


def test_a_policy_file_with_an_error_is_named_with_its_field(system: System, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  - name: research\n    limits: {max_runing: 2}\n")
    out = gpuorch(system, "queues", "--policy", str(bad))
    assert out.returncode == 2 and out.stdout == "", out
    assert f"gpuorch queues: admission policy {bad}:" in out.stderr and "max_runing" in out.stderr, out.stderr
    missing = gpuorch(system, "queues", "--policy", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read it: No such file or directory" in missing.stderr, missing.stderr
