"""Where a workload's pods may run: one rule for the router's node eligibility and the Job's constraints.

DESIGN §5.5: what the router counts as an eligible node, the emitted Job must accept, and nothing
else. So the node-label facts both sides read (label names, GPU-memory tolerance, accelerator-name
matching, sharing labels) are defined here once, and the constraints a Job carries are built here
by :func:`placement_for` from the same predicates the router's checks call. The router records the
result in its decision (``RoutingDecision.placement``) for the cluster it chose, resolved against
that cluster's snapshot (``accelerators: [L4]`` becomes ``In [NVIDIA-L4]``, the product names the
nodes really carry); the dispatcher copies it into the Job verbatim.

Shared GPUs (issue 27, defect 3): a pod gets ``nvidia.com/gpu`` devices, and what those are is read
from GPU Feature Discovery's labels by :func:`sharing_from_labels`: MIG slices under the ``single``
MIG strategy (the product renamed ``<model>-MIG-<profile>``), time-sliced or MPS-shared GPUs under
``nvidia.com/gpu.sharing-strategy``, whole GPUs otherwise (also under the ``mixed`` MIG strategy,
whose slices are ``nvidia.com/mig-<profile>`` resources that gpuorch does not request). One rule,
:func:`sharing_ok`: the mechanisms sharing a node's GPUs are exactly the one the workload names, and
none for whole GPUs; a MIG profile must be the node's. The Job carries the same rule as label tests.

Pure: no I/O. Kubernetes semantics of node selectors and ``matchExpressions`` (``In``, ``NotIn``,
``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``) are :mod:`gpuorch_proto.kubesem`'s, which the local
clusters' scheduler, inventory and the router's TAINTS check use too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
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
from .workload import Requirements, Resources, Sharing

__all__ = [
    "GPU_MEMORY_TOLERANCE",
    "GPU_RESOURCE",
    "GPU_SHARING_STRATEGIES",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_MIG_STRATEGY",
    "LABEL_POOL",
    "LABEL_SHARING_STRATEGY",
    "MIG_SINGLE",
    "NodeRequirement",
    "Placement",
    "accelerator_matches",
    "accepts",
    "gpu_memory_floor_mib",
    "gpu_memory_ok",
    "mig_profile",
    "placement_for",
    "product_model",
    "requirement_matches",
    "sharing_from_labels",
    "sharing_ok",
]

#: A node passes a GPU-memory minimum within this fraction: "80 GB" cards report 79.6-80 GiB.
GPU_MEMORY_TOLERANCE: Final = 0.02

#: The MIG strategy under which every ``nvidia.com/gpu`` of a node is a MIG slice (GFD's ``single``).
#: Under ``mixed`` the slices are ``nvidia.com/mig-<profile>`` resources and ``nvidia.com/gpu`` is
#: the GPUs left whole.
MIG_SINGLE: Final = "single"
#: Values of ``nvidia.com/gpu.sharing-strategy`` under which a GPU is shared (else ``none``).
GPU_SHARING_STRATEGIES: Final = ("mps", "time-slicing")
#: What the device plugin appends to a product name it shares: ``-MIG-<profile>``, ``-SHARED``.
_MIG_INFIX: Final = "-MIG-"
_SHARED_SUFFIX: Final = "-SHARED"

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


def _split_product(product: str) -> tuple[str, str | None]:
    """(model, MIG profile) of a GFD product name: ``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` is the
    model ``NVIDIA-A100-SXM4-40GB`` sliced ``1g.5gb``; ``NVIDIA-L4-SHARED`` is ``NVIDIA-L4``."""
    upper = product.upper()
    at = upper.rfind(_MIG_INFIX)
    if at > 0 and at + len(_MIG_INFIX) < len(product):
        return product[:at], product[at + len(_MIG_INFIX) :]
    if upper.endswith(_SHARED_SUFFIX) and len(product) > len(_SHARED_SUFFIX):
        return product[: -len(_SHARED_SUFFIX)], None
    return product, None


def product_model(product: str) -> str:
    """The GPU model a product name names, without what sharing appended to it."""
    return _split_product(product)[0]


def mig_profile(product: str | None) -> str | None:
    """The MIG profile in a product name GFD renamed under the ``single`` strategy, else None."""
    return _split_product(product)[1] if product else None


@lru_cache(maxsize=4096)
def accelerator_matches(wanted: str, product: str | None) -> bool:
    """`wanted` names `product` exactly (case-insensitive), or its GPU model as a run of its '-'
    tokens ("A100"). The model only: never a run into what sharing appended (``-MIG-1g.5gb``,
    ``-SHARED``); whether a shared GPU may serve the workload is :func:`sharing_ok`'s to say."""
    if not product:
        return False
    if wanted.lower() == product.lower():
        return True
    w, p = _tokens(wanted), _tokens(product_model(product))
    return bool(w) and any(p[i : i + len(w)] == w for i in range(len(p) - len(w) + 1))


def gpu_memory_floor_mib(gib: float) -> int:
    """The least ``nvidia.com/gpu.memory`` (MiB) that satisfies a minimum of `gib` GiB per GPU."""
    return math.ceil(gib * 1024 * (1 - GPU_MEMORY_TOLERANCE) - 1e-9)


def gpu_memory_ok(memory_mib: int, gib: float) -> bool:
    return memory_mib >= gpu_memory_floor_mib(gib)


def sharing_from_labels(labels: Mapping[str, str]) -> list[str]:
    """What shares the node's ``nvidia.com/gpu`` devices, from GFD's labels: ``"mig"`` and
    ``"mig:<profile>"`` (the ``single`` MIG strategy, the profile from the product name),
    ``"time-slicing"``, ``"mps"``. Empty: whole GPUs (also under the ``mixed`` MIG strategy)."""
    out: set[str] = set()
    if labels.get(LABEL_MIG_STRATEGY) == MIG_SINGLE:
        out.add("mig")
        profile = mig_profile(labels.get(LABEL_GPU_PRODUCT))
        if profile:
            out.add(f"mig:{profile}")
    strategy = labels.get(LABEL_SHARING_STRATEGY, "")
    if strategy in GPU_SHARING_STRATEGIES:
        out.add(strategy)
    return sorted(out)


def sharing_ok(sharing: Sharing | None, offered: Collection[str]) -> bool:
    """May a node whose GPUs are shared as `offered` (:func:`sharing_from_labels`) serve a workload
    asking for `sharing` (None: whole GPUs)?

    One rule: the mechanisms sharing the node's GPUs are exactly the one the workload names (none
    for whole GPUs), and a MIG profile asked for is the node's. A time-sliced MIG slice serves
    neither a MIG nor a time-slicing request: each gets less than it named.
    """
    mechanisms = {s for s in offered if ":" not in s}
    if sharing is None:
        return not mechanisms
    if mechanisms != {sharing.mechanism}:
        return False
    return sharing.mechanism != "mig" or not sharing.profile or f"mig:{sharing.profile}" in offered


def _sharing_requirements(sharing: Sharing | None) -> list[NodeRequirement]:
    """The label tests equivalent to ``sharing_ok(sharing, sharing_from_labels(labels))``, but for
    the MIG profile (a product-name test: :func:`placement_for`)."""
    mechanism = sharing.mechanism if sharing is not None else None
    mig = NodeRequirement(key=LABEL_MIG_STRATEGY, operator="In" if mechanism == "mig" else "NotIn", values=[MIG_SINGLE])
    if mechanism in GPU_SHARING_STRATEGIES:
        share = NodeRequirement(key=LABEL_SHARING_STRATEGY, operator="In", values=[mechanism])
    else:
        share = NodeRequirement(key=LABEL_SHARING_STRATEGY, operator="NotIn", values=list(GPU_SHARING_STRATEGIES))
    return [mig, share]


def _unmatched(wanted: list[str], profile: str | None) -> list[str]:
    """Product names for a cluster none of whose products fit: the router never chooses it, and no
    node of it carries these (such a product would have fitted). The names as written, sliced."""
    if not profile:
        return sorted(set(wanted))
    return sorted({f"{a}{_MIG_INFIX}{profile}" for a in wanted} or {f"GPU{_MIG_INFIX}{profile}"})


def placement_for(
    resources: Resources, requirements: Requirements, products: Iterable[str | None] | None = None
) -> Placement:
    """The Job's node constraints for a workload on a cluster whose nodes carry `products`.

    `products`: the GPU product names on the cluster (from its snapshot). With them,
    ``resources.accelerators`` is resolved to the products that :func:`accelerator_matches`
    accepts, and a MIG profile to the products sliced that way (:func:`mig_profile`), so the Job asks
    for exactly the nodes the router counted. Without them (no snapshot at hand) the names are used
    as written and the MIG profile is not constrained.
    """
    exprs: list[NodeRequirement] = []
    if requirements.pools:
        exprs.append(NodeRequirement(key=LABEL_POOL, operator="In", values=sorted(set(requirements.pools))))
    if resources.gpus > 0:
        wanted = list(resources.accelerators)
        sharing = resources.sharing
        profile = sharing.profile if sharing is not None and sharing.mechanism == "mig" else None
        values: list[str] | None = None
        if products is not None and (wanted or profile):
            names = {
                p
                for p in products
                if p
                and (not wanted or any(accelerator_matches(a, p) for a in wanted))
                and (not profile or mig_profile(p) == profile)
            }
            values = sorted(names) if names else _unmatched(wanted, profile)
        elif wanted:
            values = sorted(set(wanted))
        if values is not None:
            exprs.append(NodeRequirement(key=LABEL_GPU_PRODUCT, operator="In", values=values))
        if resources.gpu_memory_gib:
            floor = gpu_memory_floor_mib(resources.gpu_memory_gib)
            exprs.append(NodeRequirement(key=LABEL_GPU_MEMORY, operator="Gt", values=[str(floor - 1)]))
        exprs.extend(_sharing_requirements(sharing))
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
