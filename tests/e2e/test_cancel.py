"""Cancellation in every state, retry backoff and orphan collection, end to end.

`client.cancel(wid)` then `client.wait(wid)` must end `cancelled` with every attempt confirmed
gone and no Job or pod of the workload left on any cluster (checked through the official
Kubernetes client), whether the workload was waiting, routed but pending, staging its input,
or lost on a partitioned cluster. (Cancelling a running workload: test_lifecycle.py.)
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.projection import WorkloadView
from gpuorch.system import System
from gpuorch_fencer.core import ORPHAN_GRACE_UNKNOWN
from gpuorch_proto import Event, type_tag
from gpuorch_proto import events as ev
from gpuorch_proto.units import parse_duration
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

NS = "gpuorch"
TIMEOUT = (2, 5)
TIME_SCALE = 600  # tests/e2e/clusters.yaml


async def trail(client: Client, wid: str) -> str:
    return " ".join(
        f"{type_tag(e)}({getattr(e, 'attempt_id', '') or ''}{':' + e.how if isinstance(e, ev.CancelConfirmed) else ''})"
        for _, e in await client.events(wid)
    )


async def eventually(client: Client, wid: str, predicate: Callable[[], Any], timeout: float) -> Any:
    """assert_eventually, with the workload's event trail in the failure message."""
    try:
        return await assert_eventually(predicate, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events: {await trail(client, wid)}") from exc


def state(client: Client, wid: str, ok: Callable[[WorkloadView], bool]) -> Callable[[], Awaitable[WorkloadView | None]]:
    async def check_view() -> WorkloadView | None:
        v = await client.view(wid)
        return v if v is not None and ok(v) else None

    return check_view


def leftovers(kube: dict[str, Any], wid: str) -> list[str]:
    """Jobs and pods of the workload on every cluster (raises while a cluster does not answer)."""
    out: list[str] = []
    sel = f"gpuorch.io/workload={wid}"
    for name, cc in kube.items():
        out += [f"job {j.metadata.name} on {name}" for j in cc.batch.list_namespaced_job(NS, label_selector=sel, _request_timeout=TIMEOUT).items]
        out += [f"pod {p.metadata.name} on {name}" for p in cc.core.list_namespaced_pod(NS, label_selector=sel, _request_timeout=TIMEOUT).items]
    return out


async def cancel_and_wait(client: Client, wid: str, timeout: float = 60) -> WorkloadView:
    await client.cancel(wid)
    try:
        return await client.wait(wid, timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{wid} not terminal {timeout}s after cancel; events: {await trail(client, wid)}") from exc


def assert_cancelled_and_gone(view: WorkloadView, kube: dict[str, Any]) -> None:
    assert view.status == "cancelled", f"{view.status}: {view.reason}"
    for a in view.attempts.values():
        assert a.cancel_confirmed, f"{a.attempt_id} ({a.status}) not confirmed gone"
    assert leftovers(kube, view.workload_id) == []


async def test_cancel_while_waiting_for_a_reachable_cluster(system: System, client: Client, kube: dict[str, Any]) -> None:
    system.fault("alpha", "partition")
    system.fault("beta", "partition")
    try:
        async def unreachable() -> bool:  # so that it is never routed to a cluster that stopped answering
            snaps = await client.snapshots()
            return set(snaps) == {"alpha", "beta"} and not any(s.reachable for s in snaps.values())

        await assert_eventually(unreachable, timeout=30)
        wid = await client.submit(train("cancel-waiting", steps=3))
        await eventually(client, wid, state(client, wid, lambda v: v.status == "waiting"), timeout=30)
        view = await cancel_and_wait(client, wid, timeout=30)
        assert view.attempts == {}, "a waiting workload has no attempt to stop"
    finally:
        system.fault("alpha", "heal")
        system.fault("beta", "heal")
    # once the clusters answer again nothing is routed or created for it
    await eventually(client, wid, lambda: leftovers(kube, wid) == [], timeout=30)
    assert_cancelled_and_gone(view, kube)
    kinds = [type_tag(e) for _, e in await client.events(wid)]
    assert "attempt-created" not in kinds and kinds[-1] == "cancelled", kinds


def pods_of(kube: dict[str, Any], cluster: str, wid: str) -> list[Any]:
    return list(kube[cluster].core.list_namespaced_pod(NS, label_selector=f"gpuorch.io/workload={wid}", _request_timeout=TIMEOUT).items)


async def test_cancel_while_routed_and_pending_behind_other_work(system: System, client: Client, kube: dict[str, Any]) -> None:
    # the blocker holds every GPU of alpha (2 nodes x 4); the second one is routed there and pends
    on_alpha = {"clusters": ["alpha"]}
    blocker = await client.submit(train("blocker", steps=600, resources={"gpus": 4, "workers": 2, "gpu_memory_gib": 80, "cpu": "4", "memory": "16Gi"}, requirements=on_alpha))
    try:
        await eventually(client, blocker, state(client, blocker, lambda v: any(a.status == "running" for a in v.attempts.values())), timeout=60)
        wid = await client.submit(train("cancel-pending", steps=3, requirements=on_alpha))

        def pending() -> bool:
            pods = pods_of(kube, "alpha", wid)
            assert pods, "no pod yet"
            assert all(p.status.phase == "Pending" and not p.spec.node_name for p in pods), [(p.status.phase, p.spec.node_name) for p in pods]
            return True

        await eventually(client, wid, pending, timeout=30)
        await eventually(client, wid, state(client, wid, lambda v: [a.status for a in v.attempts.values()] == ["created"]), timeout=15)
        view = await cancel_and_wait(client, wid)
        assert_cancelled_and_gone(view, kube)
        assert [a.cancel_confirmed for a in view.attempts.values()] == ["deleted"]
    finally:
        blocked = await cancel_and_wait(client, blocker)
    assert_cancelled_and_gone(blocked, kube)


async def test_cancel_while_staging_the_input(system: System, client: Client, kube: dict[str, Any]) -> None:
    # pinned to beta, the input lives on alpha-nfs: 30 TB at 1000 MB/s is 50 real seconds of copy
    ref = f"big-{uuid.uuid4().hex[:8]}@v1"
    system.ensure_dataset("alpha-nfs", ref)
    wid = await client.submit(train(
        "cancel-staging", steps=3, requirements={"clusters": ["beta"]},
        inputs=[{"ref": ref, "size_gb": 30000, "locations": ["alpha-nfs"]}],
        args=["--input", ref, "--steps", "3", "--step-seconds", "60"],
    ))

    def staging() -> bool:
        pods = pods_of(kube, "beta", wid)
        assert pods, "no pod yet"
        inits = {s.name: s for p in pods for s in p.status.init_container_statuses or []}
        assert "stage-0" in inits and inits["stage-0"].state.running, inits  # gpuorch's agent copying
        return True

    await eventually(client, wid, staging, timeout=30)
    view = await cancel_and_wait(client, wid)
    assert_cancelled_and_gone(view, kube)
    assert [a.status for a in view.attempts.values()] != ["running"] and "running" not in view.times
    cache = system.state_dir / "clusters" / "beta" / "claims" / "gpuorch" / "gpuorch-cache" / ref  # beta's cache claim
    assert cache.parent.is_dir() and not (cache / ".complete").exists(), "the copy was started and stopped, not finished"


async def test_cancel_of_a_lost_attempt_waits_for_confirmation(system: System, client: Client, kube: dict[str, Any]) -> None:
    # strict fencing and a 10 h lease (60 real seconds): no replacement while alpha is cut off
    wid = await client.submit(train("cancel-lost", steps=600, fencing="strict", lease="10h"))
    await eventually(client, wid, state(client, wid, lambda v: any(a.cluster == "alpha" and a.status == "running" for a in v.attempts.values())), timeout=60)
    system.fault("alpha", "partition")
    try:
        await eventually(client, wid, state(client, wid, lambda v: all(a.status == "lost" and a.fenced for a in v.attempts.values())), timeout=30)
        await client.cancel(wid)
        v = await eventually(client, wid, state(client, wid, lambda v: v.cancel_requested), timeout=30)
        assert v.status == "lost" and len(v.attempts) == 1, f"{v.status}: {v.reason}; {sorted(v.attempts)}"
        healed_at = time.time()
    finally:
        system.fault("alpha", "heal")
    view = await client.wait(wid, timeout=60)
    assert_cancelled_and_gone(view, kube)
    (a1,) = view.attempts.values()
    assert a1.cancel_confirmed == "deleted", "healed long before the lease ran out: the Job was deleted"
    events: list[tuple[int, Event]] = await client.events(wid)
    confirmed = next(s for s, e in events if isinstance(e, ev.CancelConfirmed))
    cancelled = next((s, e) for s, e in events if isinstance(e, ev.Cancelled))
    assert confirmed < cancelled[0], "cancelled only after the attempt was confirmed gone"
    assert cancelled[1].at >= healed_at, "not cancelled while the attempt could still be running"
    assert "route-requested" not in [type_tag(e) for _, e in events], "no replacement for a cancelled workload"
    assert check(events) == []


async def test_cancel_of_an_unknown_id_is_rejected_and_of_a_finished_workload_changes_nothing(system: System, client: Client) -> None:
    done = await client.submit(train("finished", steps=1))
    assert (await client.wait(done, timeout=120)).status == "completed"
    before = [type_tag(e) for _, e in await client.events(done)]
    await client.cancel(done)
    unknown = f"nosuch-{uuid.uuid4().hex[:10]}"
    ref = await client.cancel(unknown)  # handled after the first cancel: the dispatcher takes them in order

    async def rejected() -> ev.Rejected | None:
        return next((e for _, e in await client.events(ref) if isinstance(e, ev.Rejected)), None)

    r = await assert_eventually(rejected, timeout=30)
    assert "unknown workload" in r.reason and unknown in r.reason, r.reason
    assert r.claimed_workload_id == unknown
    assert await client.events(unknown) == []  # nothing filed under the id it named
    view = await client.view(done)
    assert view is not None and view.status == "completed" and not view.cancel_requested
    after = [type_tag(e) for _, e in await client.events(done)]
    # (the fencer may still record its Job as collected: nothing about the cancel, nothing terminal)
    assert after[: len(before)] == before and set(after[len(before):]) <= {"orphan-deleted"}, after


def failures(events: list[tuple[int, Event]]) -> tuple[list[float], list[float]]:
    failed = [e.at for _, e in events if isinstance(e, ev.Failed)]
    routes = [e.at for _, e in events if isinstance(e, ev.RouteRequested)]
    return failed, routes


def failing(name: str, backoff: str, budget: int) -> Any:
    return train(name, steps=5, retry={"backoff": backoff, "budget": budget},
                 args=["--input", "mnist@v1", "--steps", "5", "--step-seconds", "60", "--fail-at-step", "1", "--exit-code", "3"])


async def test_retry_backoff_grows_per_failed_attempt(system: System, client: Client) -> None:
    backoff = parse_duration("15m") / TIME_SCALE  # 1.5 real seconds, then 3
    wid = await client.submit(failing("backoff", "15m", budget=2))
    view = await client.wait(wid, timeout=120)
    assert view.status == "failed" and "budget" in view.reason, view.reason
    failed, routes = failures(await client.events(wid))
    assert len(failed) == 3 and len(routes) == 2, (failed, routes)
    waits = [r - f for f, r in zip(failed, routes, strict=False)]
    assert waits[0] >= backoff and waits[1] >= 2 * backoff, waits


async def test_cancel_during_retry_backoff_starts_no_replacement(system: System, client: Client, kube: dict[str, Any]) -> None:
    wid = await client.submit(failing("cancel-backoff", "10h", budget=2))  # 60 real seconds of backoff
    await eventually(client, wid, state(client, wid, lambda v: any(a.status == "failed" and a.cancel_confirmed for a in v.attempts.values())), timeout=60)
    view = await cancel_and_wait(client, wid, timeout=30)
    assert_cancelled_and_gone(view, kube)
    assert len(view.attempts) == 1
    assert "route-requested" not in [type_tag(e) for _, e in await client.events(wid)]


async def test_unknown_managed_job_is_deleted_as_an_orphan_after_its_grace(system: System, client: Client, kube: dict[str, Any]) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:10]}"
    attempt = f"{ghost}-a1"
    labels = {"gpuorch.io/managed": "true", "gpuorch.io/workload": ghost, "gpuorch.io/attempt": attempt, "gpuorch.io/epoch": "1"}
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": attempt, "namespace": NS, "labels": labels},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "example.org/sleep@sha256:" + "0" * 64, "command": [sys.executable, "-c", "import time; time.sleep(600)"]}],
        }}},
    }
    beta = kube["beta"]
    created = beta.batch.create_namespaced_job(NS, job, _request_timeout=TIMEOUT)
    created_at = created.metadata.creation_timestamp.timestamp()

    def gone() -> bool:
        assert beta.batch.list_namespaced_job(NS, label_selector=f"gpuorch.io/workload={ghost}", _request_timeout=TIMEOUT).items == [], "job still there"
        assert pods_of(kube, "beta", ghost) == [], "pod still there"
        return True

    await eventually(client, ghost, gone, timeout=30)

    async def recorded() -> ev.OrphanDeleted | None:
        return next((e for _, e in await client.events(ghost) if isinstance(e, ev.OrphanDeleted)), None)

    e = await assert_eventually(recorded, timeout=15)
    assert (e.attempt_id, e.cluster, e.job_name) == (attempt, "beta", attempt)
    assert "unknown" in e.reason, e.reason
    assert e.at - created_at >= ORPHAN_GRACE_UNKNOWN, "deleted before its grace period"
