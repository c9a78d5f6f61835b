"""Failures without lost or duplicated work: lost clusters, fencing, retry vs resume, waiting."""

from __future__ import annotations

import json

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.system import System
from gpuorch_proto import type_tag
from tests.e2e.workloads import train
from tests.support.system import keys_at, result_object
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e


async def running_on(system: System, client: Client, wid: str, cluster: str, with_checkpoint: bool = False) -> None:
    async def ok() -> bool:
        v = await client.view(wid)
        if v is None:
            return False
        for a in v.attempts.values():
            if a.cluster == cluster and (a.status == "running" or (a.status == "succeeded" and not with_checkpoint)):
                if not with_checkpoint:
                    return True
                return bool(await keys_at(system, a.checkpoint_path))
        return False

    async def history() -> str:
        return " ".join(f"{type_tag(e)}({getattr(e, 'attempt_id', '')})" for _, e in await client.events(wid))

    try:
        await assert_eventually(ok, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events: {await history()}") from exc


async def no_jobs(kube: dict, wid: str) -> None:
    def gone() -> bool:
        for cc in kube.values():
            try:
                jobs = cc.batch.list_namespaced_job("gpuorch", label_selector=f"gpuorch.io/workload={wid}", _request_timeout=(2, 5))
            except Exception:
                return False
            assert jobs.items == [], f"{[j.metadata.name for j in jobs.items]} still on {cc.name}"
        return True

    await assert_eventually(gone, timeout=60)


@pytest.mark.parametrize("fencing", ["strict", "fast"])
async def test_partition_mid_run_replaces_elsewhere_resumes_and_promotes_exactly_once(system: System, client: Client, kube: dict, fencing: str) -> None:
    # fast: the replacement may start right after the epoch bump, long before the lease runs out
    wid = await client.submit(train(f"part-{fencing}", steps=120, fencing=fencing, lease="10m" if fencing == "strict" else "10h"))

    async def first_cluster() -> str | None:
        v = await client.view(wid)
        return v.latest_attempt.cluster if v is not None and v.latest_attempt is not None else None

    home = await assert_eventually(first_cluster, timeout=60)
    other = "beta" if home == "alpha" else "alpha"
    await running_on(system, client, wid, home, with_checkpoint=True)
    system.fault(home, "partition")
    try:
        await running_on(system, client, wid, other)
        v = await client.view(wid)
        assert v is not None
        a1 = next(a for a in v.attempts.values() if a.cluster == home)
        a2 = next(a for a in v.attempts.values() if a.cluster == other)
        assert a1.status == "lost" and a1.fenced and a2.epoch > a1.epoch
        assert a2.mode == "resume" and a2.resume_from, a2.mode_reason
        if fencing == "strict":
            assert a1.cancel_confirmed == "lease-expired", "strict: replacement only after confirmation or lease expiry"
        else:
            assert a1.cancel_confirmed is None, "fast: replacement before any confirmation"
    finally:
        system.fault(home, "heal")
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    assert view.promoted_attempt == a2.attempt_id
    metrics = json.loads(await result_object(system, view.result_path, "metrics.json"))
    assert metrics["resumed_from_step"] and metrics["resumed_from_step"] > 0 and metrics["steps"] == 120
    # after the heal, the old attempt is cancelled (or its late promotion rejected) and its Job removed
    await no_jobs(kube, wid)

    async def old_attempt_settled() -> bool:
        v2 = await client.view(wid)
        assert v2 is not None
        old = v2.attempts[a1.attempt_id]
        return old.orphan_deleted or old.promotion_rejected or old.cancel_confirmed == "deleted"

    try:
        await assert_eventually(old_attempt_settled, timeout=60)
    except AssertionError as exc:
        trail = " ".join(f"{type_tag(e)}({getattr(e, 'attempt_id', '')}:{getattr(e, 'how', '')})" for _, e in await client.events(wid))
        raise AssertionError(f"{exc}; events: {trail}") from exc
    events = await client.events(wid)
    assert [type_tag(e) for _, e in events].count("promoted") == 1
    assert check(events) == []


async def test_unreachable_everywhere_waits_then_runs_when_a_cluster_returns(system: System, client: Client) -> None:
    system.fault("alpha", "partition")
    system.fault("beta", "partition")
    try:
        wid = await client.submit(train("waits", steps=3))

        async def waiting() -> str:
            v = await client.view(wid)
            assert v is not None and v.status == "waiting", v and v.status
            return v.reason

        reason = await assert_eventually(waiting, timeout=30)
        assert "unreachable" in reason.lower() or "stale" in reason.lower(), reason
    finally:
        system.fault("alpha", "heal")
        system.fault("beta", "heal")
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed"


async def test_missing_credentials_is_rejected_with_every_clusters_reasons(system: System, client: Client) -> None:
    wid = await client.submit(train("no-creds", steps=1, requirements={"credentials": ["hf-token"]}))
    view = await client.wait(wid, timeout=30)
    assert view.status == "rejected"
    assert view.decision is not None
    for verdict in view.decision.verdicts:
        assert any(c.code == "CREDENTIALS" and not c.ok for c in verdict.checks), verdict


async def test_failed_attempt_is_retried_from_its_checkpoint(system: System, client: Client) -> None:
    wid = await client.submit(train("flaky", steps=20, args=["--input", "mnist@v1", "--steps", "20", "--step-seconds", "60", "--checkpoint-every", "5", "--fail-at-step", "10", "--exit-code", "3"]))
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    attempts = sorted(view.attempts.values(), key=lambda a: a.number)
    assert [a.status for a in attempts] == ["failed", "succeeded"]
    assert attempts[0].exit_code == 3 and attempts[1].mode == "resume"
    metrics = json.loads(await result_object(system, view.result_path, "metrics.json"))
    assert metrics["resumed_from_step"] == 10


async def test_permanent_exit_code_fails_without_retry(system: System, client: Client) -> None:
    wid = await client.submit(train("broken", steps=5, args=["--input", "mnist@v1", "--steps", "5", "--fail-at-step", "1", "--exit-code", "2"]))
    view = await client.wait(wid, timeout=120)
    assert view.status == "failed" and "permanent" in view.reason
    assert len(view.attempts) == 1
    kinds = [type_tag(e) for _, e in await client.events(wid)]
    assert "workload-failed" in kinds and "promoted" not in kinds
    assert "route-requested" not in kinds, "a permanent exit code is never retried"


async def test_no_allocatable_gpus_waits_then_runs_when_capacity_frees(system: System, client: Client) -> None:
    nodes = ["alpha-gpu-0", "alpha-gpu-1", "beta-gpu-0", "beta-gpu-1"]
    for node in nodes:
        system.fault(node.split("-")[0], "capacity", node, "0")
    try:

        async def inventory_sees_it() -> bool:
            snaps = await client.snapshots()
            return all(n.gpus_allocatable == 0 for c in ("alpha", "beta") for n in snaps[c].nodes)

        await assert_eventually(inventory_sees_it, timeout=30)
        wid = await client.submit(train("capacity", steps=3))

        async def waiting() -> str:
            v = await client.view(wid)
            assert v is not None and v.status == "waiting", v and (v.status, v.reason)
            return v.reason

        reason = await assert_eventually(waiting, timeout=30)
        assert "GPU_CAPACITY" in reason, reason
    finally:
        for node in nodes:
            system.fault(node.split("-")[0], "capacity", node, "4")
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed"
    kinds = [type_tag(e) for _, e in await client.events(wid)]
    assert kinds.index("unroutable") < kinds.index("routed"), kinds
