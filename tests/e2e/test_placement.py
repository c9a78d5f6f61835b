"""An attempt the cluster's scheduler refuses is failed with the scheduler's reason and re-routed (issue 9, defect 3).

The router and the Job agree by construction (tests/router/test_placement_rule.py); what is left is
a cluster that changes after the decision. Here inventory is stopped, so the router still holds a
fresh-looking snapshot of `alpha`, while every node of `alpha` gets a taint the workload does not
tolerate. The router promises `alpha`; its scheduler refuses the pods for a reason no waiting can
change; the dispatcher records that, fails the attempt after the grace (1 s here) and the
replacement goes to `beta`, where it completes: nothing waits for ever, and status tells the truth.
"""

from __future__ import annotations

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.kube import make_clients
from gpuorch.system import System
from gpuorch_proto import events as ev
from tests.e2e.test_cancel import eventually, state
from tests.e2e.workloads import train

pytestmark = pytest.mark.e2e

TAINT = {"key": "gpuorch.io/maintenance", "value": "drain", "effect": "NoSchedule"}


E2E_ENV = {"GPUORCH_UNSCHEDULABLE_AFTER": "1"}  # the grace before an unplaceable attempt fails


async def test_pods_no_node_accepts_fail_the_attempt_with_the_schedulers_reason_and_reroute(system: System, client: Client) -> None:
    kube = make_clients(system.kubeconfig)
    alpha = kube["alpha"]
    # the data lives on alpha, so alpha is where the router sends this (beta needs an 8000 s copy)
    wl = train("placement", steps=10, inputs=[{"ref": "mnist@v1", "size_gb": 1000, "locations": ["alpha-nfs"]}])
    system.kill("inventory")  # the router keeps its last (fresh) snapshot of alpha
    nodes = [n.metadata.name for n in alpha.core.list_node().items]
    for name in nodes:
        alpha.core.patch_node(name, {"spec": {"taints": [TAINT]}})
    try:
        wid = await client.submit(wl)
        v = await eventually(client, wid, state(client, wid, lambda v: any(a.placement_failed for a in v.attempts.values())), timeout=60)
        first = min(v.attempts.values(), key=lambda a: a.number)
        assert first.cluster == "alpha", v.reason
        assert first.placement_failed and "untolerated taint" in first.reason and "gpuorch.io/maintenance" in first.reason, first.reason
        assert "unschedulable" in first.times and "running" not in first.times
        v = await eventually(client, wid, state(client, wid, lambda v: v.terminal), timeout=120)
        assert v.status == "completed", v.reason
        assert {a.cluster for a in v.attempts.values() if a.promoted} == {"beta"}
        trail = await client.events(wid)
        events = [e for _, e in trail]
        routes = [e for e in events if isinstance(e, ev.RouteRequested)]
        assert routes and routes[0].exclude == ["alpha"], routes
        assert [e for e in events if isinstance(e, ev.Unschedulable) and e.permanent], "the refusal was recorded"
        assert check(trail) == []
    finally:
        for name in nodes:
            alpha.core.patch_node(name, {"spec": {"taints": []}})
        system.restart("inventory")
