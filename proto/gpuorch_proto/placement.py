"""Where a workload's pods may run: one rule for the router's node eligibility and the Job's constraints.

DESIGN §5.5: what the router counts as an eligible node, the emitted Job must accept, and nothing
else. So the node-label facts both sides read (label names, GPU-memory tolerance, accelerator-name
matching, sharing labels) are defined here once, and the constraints a Job carries are built here
by :func:`placement_for` from the same predicates the router's checks call. The router records the
result in its decision (``RoutingDecision.placement``) for the cluster it chose, resolved against
that cluster's snapshot (``accelerators: [L4]`` becomes ``In [NVIDIA-L4]``, the product names the
nodes really carry); the dispatcher copies it into the Job verbatim.

Pure: no I/O. Kubernetes semantics of node selectors and ``matchExpressions`` (``In``, ``NotIn``,
``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``) are :mod:`gpuorch_proto.kubesem`'s, which the local
clusters' scheduler, inventory and the router's TAINTS check use too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Final, Literal

import msgspec

from . import kubesem
from .k8s import (
    GPU_RESOURCE,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_MIG_STRATEGY,
    LABEL_POOL,
    LABEL_SHARING_STRATEGY,
)
from .workload import Requirements, Resources

__all__ = [
    "GPU_MEMORY_TOLERANCE",
    "GPU_RESOURCE",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_MIG_STRATEGY",
    "LABEL_POOL",
    "LABEL_SHARING_STRATEGY",
    "NodeRequirement",
    "Placement",
    "accelerator_matches",
    "accepts",
    "gpu_memory_floor_mib",
    "gpu_memory_ok",
    "placement_for",
    "requirement_matches",
    "sharing_from_labels",
]

#: A node passes a GPU-memory minimum within this fraction: "80 GB" cards report 79.6-80 GiB.
GPU_MEMORY_TOLERANCE: Final = 0.02

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


class NodeRequirement(msgspec.Struct, frozen=True, kw_only=True):
    """One ``matchExpressions`` entry of required node affinity (Kubernetes NodeSelectorRequirement)."""

    key: str
    operator: Operator
    values: list[str] = []


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """The node constraints of a workload's pods on one cluster (all must hold: AND).

    ``node_selector`` is what the workload wrote (``requirements.node_selector``), unchanged;
    ``match_expressions`` is what gpuorch derives (pools, GPU model, GPU memory, sharing).
    Tolerations and resources come from the workload itself.
    """

    node_selector: dict[str, str] = {}
    match_expressions: list[NodeRequirement] = []


# ---- the predicates the router's checks call ---------------------------------------------------


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in text.upper().replace("_", "-").replace(" ", "-").split("-") if t)


@lru_cache(maxsize=4096)
def accelerator_matches(wanted: str, product: str | None) -> bool:
    """`wanted` names `product` exactly (case-insensitive) or as a run of its '-' tokens ("A100")."""
    if not product:
        return False
    if wanted.lower() == product.lower():
        return True
    w, p = _tokens(wanted), _tokens(product)
    return bool(w) and any(p[i : i + len(w)] == w for i in range(len(p) - len(w) + 1))


def gpu_memory_floor_mib(gib: float) -> int:
    """The least ``nvidia.com/gpu.memory`` (MiB) that satisfies a minimum of `gib` GiB per GPU."""
    return math.ceil(gib * 1024 * (1 - GPU_MEMORY_TOLERANCE) - 1e-9)


def gpu_memory_ok(memory_mib: int, gib: float) -> bool:
    return memory_mib >= gpu_memory_floor_mib(gib)


def sharing_from_labels(labels: Mapping[str, str]) -> list[str]:
    """The GPU sharing mechanisms a node offers, from GFD's labels."""
    out: set[str] = set()
    if labels.get(LABEL_MIG_STRATEGY, "none") not in ("", "none"):
        out.add("mig")
    strategy = labels.get(LABEL_SHARING_STRATEGY, "")
    if strategy in ("time-slicing", "mps"):
        out.add(strategy)
    return sorted(out)


def _sharing_requirements(mechanism: str) -> list[NodeRequirement]:
    """The label test equivalent to ``mechanism in sharing_from_labels(labels)``."""
    if mechanism == "mig":
        return [
            NodeRequirement(key=LABEL_MIG_STRATEGY, operator="Exists"),
            NodeRequirement(key=LABEL_MIG_STRATEGY, operator="NotIn", values=["", "none"]),
        ]
    return [NodeRequirement(key=LABEL_SHARING_STRATEGY, operator="In", values=[mechanism])]


def placement_for(
    resources: Resources, requirements: Requirements, products: Iterable[str | None] | None = None
) -> Placement:
    """The Job's node constraints for a workload on a cluster whose nodes carry `products`.

    `products`: the GPU product names on the cluster (from its snapshot). With them,
    ``resources.accelerators`` is resolved to the products that :func:`accelerator_matches`
    accepts, so the Job asks for exactly the nodes the router counted. Without them (no snapshot
    at hand) the names are used as written.
    """
    exprs: list[NodeRequirement] = []
    if requirements.pools:
        exprs.append(NodeRequirement(key=LABEL_POOL, operator="In", values=sorted(set(requirements.pools))))
    if resources.gpus > 0:
        if resources.accelerators:
            wanted = list(resources.accelerators)
            if products is not None:
                names = {p for p in products if p and any(accelerator_matches(a, p) for a in wanted)}
                # none here: the router never chooses such a cluster; ask for the names as written
                values = sorted(names) if names else sorted(set(wanted))
            else:
                values = sorted(set(wanted))
            exprs.append(NodeRequirement(key=LABEL_GPU_PRODUCT, operator="In", values=values))
        if resources.gpu_memory_gib:
            floor = gpu_memory_floor_mib(resources.gpu_memory_gib)
            exprs.append(NodeRequirement(key=LABEL_GPU_MEMORY, operator="Gt", values=[str(floor - 1)]))
        if resources.sharing is not None:
            exprs.extend(_sharing_requirements(resources.sharing.mechanism))
    return Placement(node_selector=dict(requirements.node_selector), match_expressions=exprs)


# ---- Kubernetes semantics of the constraints ---------------------------------------------------


def requirement_matches(req: NodeRequirement, labels: Mapping[str, str]) -> bool:
    """One of the Job's node requirements against a node's labels (`kubesem`, Kubernetes' rule)."""
    return kubesem.requirement_matches(req.key, req.operator, req.values, labels)


def accepts(placement: Placement, labels: Mapping[str, str]) -> bool:
    """Do a node's labels satisfy the placement (node selector AND every expression)?"""
    return kubesem.node_selector_matches(placement.node_selector, labels) and all(
        requirement_matches(r, labels) for r in placement.match_expressions
    )
