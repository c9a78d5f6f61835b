"""Preemption only of checkpoint-safe work, end to end (issue 13, item 6): on one local cluster of
4 GPUs, an interruptible sweep trial and a non-interruptible job fill it; a priority-10 job
arrives, is queued there, and takes the interruptible one's GPUs. The victim is fenced, its Job
deleted and confirmed gone, and it resumes later from its checkpoint (step > 0), promoted once;
the non-interruptible one is never preempted. Real processes: NATS, the four services, a local
cluster serving the Kubernetes API, the example trainer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.system import System
from gpuorch_proto import events as ev
from gpuorch_proto import type_tag
from gpuorch_router.explain import render_waits
from tests.e2e.workloads import train
from tests.support.system import keys_at, one_node, registry, result_object, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

CLUSTERS = registry(
    one_node("solo", 4, stores=("prod", "scratch"), data_locations=["alpha-nfs"], bandwidth_mbps={"alpha-nfs": 2000}),
    datasets=[{"ref": "mnist@v1", "location": "alpha-nfs"}],
)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One cluster of 4 GPUs, so that two 2-GPU jobs fill it."""
    with running(tmp_path_factory.mktemp("e2e-preempt"), clusters=CLUSTERS, env_extra={"GPUORCH_LOST_AFTER": "2"}) as s:
        yield s


async def trail(client: Client, wid: str) -> str:
    return " ".join(f"{type_tag(e)}({getattr(e, 'attempt_id', '')})" for _, e in await client.events(wid))


async def running_with_checkpoint(system: System, client: Client, wid: str) -> None:
    async def ok() -> bool:
        v = await client.view(wid)
        a = v.latest_attempt if v is not None else None
        if a is None or a.status != "running":
            return False
        return bool(await keys_at(system, a.checkpoint_path))

    try:
        await assert_eventually(ok, timeout=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events: {await trail(client, wid)}") from exc


async def test_interruptible_work_is_preempted_resumes_from_its_checkpoint_and_the_rest_never(
    system: System, client: Client
) -> None:
    victim = await client.submit(train("sweep-trial", steps=240, priority=1, preemptible=True))
    steady = await client.submit(train("steady", steps=240, priority=0))  # not interruptible
    await running_with_checkpoint(system, client, victim)
    await running_with_checkpoint(system, client, steady)

    urgent = await client.submit(train("urgent", steps=10, priority=10))

    async def planned() -> ev.PreemptionPlanned:
        # the plan that names the victim, from the log: the view shows only the latest plan, and the
        # next one ("waiting for it to stop", no victims) may follow within one router round
        plans = [e for _, e in await client.events(urgent) if isinstance(e, ev.PreemptionPlanned)]
        named = [p for p in plans if p.victims]
        assert named, [(p.event_id, p.reason) for p in plans]
        return named[0]

    plan = await assert_eventually(planned, timeout=60)
    text = "\n".join(render_waits(plan))  # what `gpuorch explain` prints
    assert f"waiting for GPUs held by {victim} (priority 1, interruptible: will be preempted)" in text, text
    assert f"waiting for GPUs held by {steady} (priority 0, not interruptible: never preempted)" in text, text

    done = await client.wait(urgent, timeout=120)
    assert done.status == "completed", done.reason
    v = await client.wait(victim, timeout=180)
    assert v.status == "completed", f"{v.reason}; {await trail(client, victim)}"
    s = await client.wait(steady, timeout=180)
    assert s.status == "completed", s.reason

    events = await client.events(victim)
    first, *rest = sorted(v.attempts.values(), key=lambda a: a.number)
    fence = [e for _, e in events if isinstance(e, ev.FenceRequested) and e.attempt_id == first.attempt_id]
    assert fence and fence[0].reason.startswith(f"preempted by {urgent}"), await trail(client, victim)
    assert first.fenced and first.cancel_confirmed == "deleted"  # its Job removed and confirmed gone
    last = rest[-1]
    assert last.mode == "resume" and last.resume_from, last.mode_reason
    assert sum(isinstance(e, ev.Promoted) for _, e in events) == 1 and v.promoted_attempt == last.attempt_id
    metrics = json.loads(await result_object(system, v.result_path, "metrics.json"))
    assert metrics["resumed_from_step"] and metrics["resumed_from_step"] > 0 and metrics["steps"] == 240
    # the urgent job ran before the victim's replacement: the freed GPUs went to it
    u_run = min(a.times["running"] for a in done.attempts.values() if "running" in a.times)
    assert u_run < last.times["running"]

    steady_events = [e for _, e in await client.events(steady)]
    preempted = [
        e
        for e in steady_events
        if isinstance(e, ev.PreemptionRequested)
        or (isinstance(e, ev.FenceRequested) and e.reason.startswith("preempted"))
    ]
    assert preempted == [] and len(s.attempts) == 1, [type_tag(e) for e in steady_events]

    everything: list[tuple[int, ev.Base]] = []
    for wid in (victim, steady, urgent):
        everything += await client.events(wid)
    everything.sort(key=lambda x: x[0])
    assert check(everything, require_terminal=True) == []  # incl. preempted-only-interruptible, one promotion
