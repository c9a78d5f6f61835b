"""Toleration and node-selector matching is one function (`gpuorch_proto.kubesem`): the router's
TAINTS / NODE_SELECTOR checks, inventory's pending-pod placement and the Job's placement rule agree
with it on a grid of tolerations x taints and selectors x labels (the local clusters' scheduler
calls it too, and `test_placement_rule.py` holds the router's node set to that scheduler's)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpuorch_inventory.core import _fits_node, _parse_node, _parse_pod
from gpuorch_proto import kubesem
from gpuorch_proto.inventory import Taint
from gpuorch_proto.placement import NodeRequirement, Placement, accepts
from gpuorch_proto.workload import Toleration
from gpuorch_router.policy import SnapshotIndex, eligible_nodes
from tests.inventory.builders import make_node as kube_node
from tests.inventory.builders import make_pod
from tests.support.builders import make_node, make_snapshot, make_workload

TAINTS = [
    Taint(key="team", value="vision", effect="NoSchedule"),
    Taint(key="team", value="", effect="NoExecute"),
    Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),
    Taint(key="spot", value="true", effect="PreferNoSchedule"),
]
TOLERATIONS: list[dict[str, str]] = [
    {},
    {"key": "team", "value": "vision"},
    {"key": "team", "operator": "Exists"},
    {"key": "team", "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
    {"key": "team", "value": "vision", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "team", "value": ""},
]


def _tol(d: dict[str, str]) -> Toleration:
    return Toleration(key=d.get("key"), operator=d.get("operator", "Equal"), value=d.get("value"), effect=d.get("effect"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("tol", "taint"), list(itertools.product(TOLERATIONS, TAINTS)))
def test_router_and_inventory_tolerate_as_kubernetes_does(tol: dict[str, str], taint: Taint) -> None:
    tols = [tol] if tol else []
    blocked = bool(kubesem.blocking_taints(tols, [taint]))
    # router: the TAINTS check counts the node suitable exactly when nothing blocks
    node = make_node("n0", taints=[taint])
    wl = make_workload(tolerations=[_tol(t) for t in tols])
    assert (eligible_nodes(wl, SnapshotIndex(make_snapshot("c", nodes=[node]))) == {"n0"}) is not blocked
    # inventory: a pending pod with these tolerations fits the node exactly when nothing blocks
    kn = kube_node("n0", taints=[{"key": taint.key, "value": taint.value or "", "effect": taint.effect}])
    pod = make_pod("p", gpus=1, tolerations=tols)
    assert _fits_node(_parse_pod(pod), _parse_node(kn)) is not blocked


SELECTORS: list[dict[str, str]] = [{}, {"zone": "a"}, {"zone": "b"}, {"zone": "a", "rack": "1"}, {"rack": ""}]
LABELS: list[dict[str, str]] = [{}, {"zone": "a"}, {"zone": "a", "rack": "1"}, {"rack": ""}]


@pytest.mark.parametrize(("selector", "labels"), list(itertools.product(SELECTORS, LABELS)))
def test_node_selectors_match_as_kubernetes_does(selector: dict[str, str], labels: dict[str, str]) -> None:
    want = kubesem.node_selector_matches(selector, labels)
    node = make_node("n0", labels=labels)
    wl = make_workload(node_selector=selector)
    assert (eligible_nodes(wl, SnapshotIndex(make_snapshot("c", nodes=[node]))) == {"n0"}) is want
    assert _fits_node(_parse_pod(make_pod("p", gpus=1, node_selector=selector)), _parse_node(kube_node("n0", labels=labels))) is want
    assert accepts(Placement(node_selector=selector), labels) is want


@pytest.mark.parametrize(
    ("op", "values", "labels"),
    [
        (op, values, labels)
        for op in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
        for values in (["a"], ["10"], ["a", "b"])
        for labels in ({}, {"k": "a"}, {"k": "11"}, {"k": "9"})
    ],
)
def test_the_jobs_requirements_match_as_kubernetes_does(op: Any, values: list[str], labels: dict[str, str]) -> None:
    req = NodeRequirement(key="k", operator=op, values=values)
    assert accepts(Placement(match_expressions=[req]), labels) is kubesem.requirement_matches("k", op, values, labels)
