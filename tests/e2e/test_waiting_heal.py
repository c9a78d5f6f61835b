"""Issue 9, defect 4: the only eligible cluster is partitioned, its attempt lost, then healed.

The dispatcher asks for attempt 2 excluding the cluster where attempt 1 was lost; nothing else can
run the workload, so it waits. Once the cluster is back, the exclusion ends and the workload runs
there and completes (before the fix it stayed `waiting` until the router restarted).
"""

from __future__ import annotations

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.system import System
from gpuorch_proto import type_tag
from tests.e2e.test_faults import running_on
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e


async def test_only_eligible_cluster_partitioned_lost_then_healed_completes(system: System, client: Client) -> None:
    wid = await client.submit(train("only-alpha", steps=120, requirements={"clusters": ["alpha"]}))
    await running_on(system, client, wid, "alpha", with_checkpoint=True)
    system.fault("alpha", "partition")
    try:
        async def waiting_for_attempt_2() -> str:
            v = await client.view(wid)
            assert v is not None and 2 in v.route_requested, v and (v.status, v.route_requested)
            assert v.status == "waiting" and v.decision is not None, (v.status, v.reason)
            alpha = next(x for x in v.decision.verdicts if x.cluster == "alpha")
            assert not alpha.eligible
            return v.reason

        reason = await assert_eventually(waiting_for_attempt_2, timeout=60)
        assert "alpha" in reason, reason
    finally:
        system.fault("alpha", "heal")
    try:
        view = await client.wait(wid, timeout=90)
    except TimeoutError:
        trail = " ".join(f"{type_tag(e)}({getattr(e, 'attempt_number', '')})" for _, e in await client.events(wid))
        v = await client.view(wid)
        raise AssertionError(f"not completed after the heal: {v and v.status}: {v and v.reason}; events: {trail}") from None
    assert view.status == "completed", view.reason
    second = next(a for a in view.attempts.values() if a.number == 2)
    assert second.cluster == "alpha" and view.promoted_attempt == second.attempt_id
    assert check(await client.events(wid)) == []
