"""The workload's demand: the fields routing reads, parsed once per decision (reference).

:func:`parse_demand` turns a validated :class:`~gpuorch_proto.workload.Workload` (plus the routing
history and the checkpoint a replacement could resume) into a flat :class:`Demand`: GPUs per node
and placements needed for the gang's shape, CPU and memory per node, the node filters, registry
needs, the estimate's inputs and the preferences. Everything after this reads the demand, never
the workload (except ``placement_for``, which builds the Job's constraints from the spec as written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.units import parse_duration, parse_quantity
from gpuorch_proto.workload import DatasetInput, Requirements, Resources, Sharing, Toleration, Workload

from .history import RoutingHistory, key_label, workload_key

__all__ = ["Demand", "parse_demand"]


@dataclass(slots=True, eq=False)
class Demand:
    gpus: float
    workers: int
    same_node: bool
    fractional: bool
    per_worker: int  # whole devices per worker (a shared slice occupies one device)
    per_node: int  # devices one node must offer: per_worker, or the whole gang when same_node
    units: int  # placements needed: workers, or 1 when same_node
    cpu_node: float
    memory_node: float
    gpu_memory_mib: float | None
    accelerators: tuple[str, ...]
    sharing: Sharing | None
    pools: frozenset[str]
    selector: tuple[tuple[str, str], ...]
    tolerations: tuple[Toleration, ...]
    connections: tuple[str, ...]
    credentials: tuple[str, ...]
    allowed: frozenset[str]
    output_store: str
    checkpoint_store: str | None  # where the attempt writes checkpoints (must be reachable)
    resume: CheckpointRef | None  # the checkpoint a replacement could resume (a preference)
    portable: bool  # spec.checkpoint.portable
    inputs: tuple[DatasetInput, ...]
    image: str
    declared_run: float | None
    reference: str | None
    key: str  # what runs are learnt under (history.workload_key)
    key_label: str  # the key in words (history.key_label)
    owner: str
    pin: tuple[str, str] | None
    prefer_clusters: frozenset[str]
    prefer_pools: frozenset[str]
    time_weight: float
    cost_weight: float
    history: RoutingHistory | None
    resources: Resources  # as written: the Job's constraints are built from them (placement_for)
    requirements: Requirements


def checkpoint_store(wl: Workload) -> str | None:
    """The store the workload writes checkpoints to (None: it declares no checkpointing)."""
    ck = wl.spec.checkpoint
    return ck.store if (ck.store and ck.path) else None


def parse_demand(wl: Workload, history: RoutingHistory | None, resume: CheckpointRef | None) -> Demand:
    spec = wl.spec
    res, req, prefs = spec.resources, spec.requirements, spec.preferences
    gpus = float(res.gpus)
    workers = max(1, res.workers)
    per_worker = math.ceil(gpus) if gpus > 0 else 0
    cpu = parse_quantity(res.cpu)
    memory = parse_quantity(res.memory)
    pin: tuple[str, str] | None = None
    if spec.queue:
        agent, _, queue = spec.queue.partition("/")
        pin = (agent, queue)
    return Demand(
        gpus=gpus,
        workers=workers,
        same_node=res.same_node,
        fractional=gpus != int(gpus),
        per_worker=per_worker,
        per_node=per_worker * workers if res.same_node else per_worker,
        units=1 if res.same_node else workers,
        cpu_node=cpu * workers if res.same_node else cpu,
        memory_node=memory * workers if res.same_node else memory,
        gpu_memory_mib=res.gpu_memory_gib * 1024 if res.gpu_memory_gib else None,
        accelerators=tuple(res.accelerators),
        sharing=res.sharing,
        pools=frozenset(req.pools),
        selector=tuple(sorted(req.node_selector.items())),
        tolerations=tuple(req.tolerations),
        connections=tuple(sorted(set(req.connections))),
        credentials=tuple(sorted(set(req.credentials))),
        allowed=frozenset(req.clusters),
        output_store=spec.output.store,
        checkpoint_store=checkpoint_store(wl),
        resume=resume,
        portable=spec.checkpoint.portable,
        inputs=tuple(spec.inputs),
        image=spec.image,
        declared_run=parse_duration(spec.expected_runtime) if spec.expected_runtime else None,
        reference=spec.reference_accelerator,
        key=workload_key(wl),
        key_label=key_label(wl),
        owner=wl.metadata.owner,
        pin=pin,
        prefer_clusters=frozenset(prefs.clusters),
        prefer_pools=frozenset(prefs.pools),
        time_weight=prefs.time_weight,
        cost_weight=prefs.cost_weight,
        history=history,
        resources=res,
        requirements=req,
    )
