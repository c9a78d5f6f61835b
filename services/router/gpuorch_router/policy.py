"""The router's routing policy (DESIGN §5): the public entry points, over the modules that make it.

A reader takes the policy one module at a time; together they are the plain reference:

| module | what |
|---|---|
| :mod:`gpuorch_router.index` | a snapshot prepared for routing: node classes, registry facts as sets |
| :mod:`gpuorch_router.demand` | the workload's routing-relevant fields, parsed once |
| :mod:`gpuorch_router.checks` | hard eligibility: every check with a reason code and its numbers |
| :mod:`gpuorch_router.estimate` | time to result and cost of an eligible cluster, with each term |
| :mod:`gpuorch_router.decision` | verdicts, outcome and the decision record; ``route`` (reference) |
| :mod:`gpuorch_router.fastpath` | ``RoutingMemo``: the same records, memoised, caches owned by the caller |

Functional core: no I/O, no clock, no logging, no module-level mutable state. ``route`` here is
the reference (a fresh evaluation every call); the router service, the simulations and the bench
route through a :class:`RoutingMemo` they own, which gives equal records
(``tests/router/test_fastpath.py``). The same inputs always give the same decision (ties are broken
by cluster name). Documented in full in ``docs/routing.md``.
"""

from __future__ import annotations

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.kubesem import tolerates
from gpuorch_proto.placement import GPU_MEMORY_TOLERANCE
from gpuorch_proto.workload import Workload

from . import checks
from .decision import route
from .estimate import (
    DEFAULT_IMAGE_PULL_SECONDS,
    DEFAULT_OUTPUT_TRANSFER_SECONDS,
    DEFAULT_RUN_SECONDS,
    MEAN_JOB_SECONDS,
    PREFERRED_CLUSTER_FACTOR,
    PREFERRED_POOL_FACTOR,
    RELATIVE_SPEED,
    RESUME_FACTOR,
    relative_speed,
)
from .fastpath import RoutingMemo
from .history import MeasuredTimeline, RoutingHistory, update_history
from .index import VOLATILE_LABELS, NodeClass, SnapshotIndex, installed_gpus

__all__ = [
    "DEFAULT_IMAGE_PULL_SECONDS",
    "DEFAULT_OUTPUT_TRANSFER_SECONDS",
    "DEFAULT_RUN_SECONDS",
    "GPU_MEMORY_TOLERANCE",
    "MEAN_JOB_SECONDS",
    "PREFERRED_CLUSTER_FACTOR",
    "PREFERRED_POOL_FACTOR",
    "RELATIVE_SPEED",
    "RESUME_FACTOR",
    "VOLATILE_LABELS",
    "MeasuredTimeline",
    "NodeClass",
    "RoutingHistory",
    "RoutingMemo",
    "SnapshotIndex",
    "build_index",
    "eligible_nodes",
    "installed_gpus",
    "relative_speed",
    "route",
    "tolerates",
    "update_history",
]


def build_index(snapshot: ClusterSnapshot, previous: SnapshotIndex | None = None) -> SnapshotIndex:
    """A new index of `snapshot` (a :class:`RoutingMemo` keeps them by snapshot identity); with the
    cluster's `previous` index, its unchanged parts are shared (the same index either way)."""
    return SnapshotIndex(snapshot, previous)


def eligible_nodes(workload: Workload, snapshot: ClusterSnapshot | SnapshotIndex) -> frozenset[str]:
    """The nodes the checks count as suitable for `workload` on this cluster (none when they fail).

    The set the Job's constraints (``RoutingDecision.placement``) must accept, and no other: the
    placement property test compares the two over random nodes and workloads.
    """
    idx = snapshot if isinstance(snapshot, SnapshotIndex) else SnapshotIndex(snapshot)
    return checks.eligible_nodes(workload, idx)
