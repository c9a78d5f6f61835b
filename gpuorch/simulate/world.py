"""The simulated world: heterogeneous clusters, data locations and datasets (a clusters file).

The file has the shape of `deploy/local/clusters.yaml` (node groups with `gpu: {model, memory_mib,
count}`, `pool`; a `registry:` entry exactly as inventory reads it), plus what only the simulator
needs: per cluster `background` (other tenants' load) and, at top level, `datasets` (the catalogue
the generator draws inputs from) and `generator` (overrides of `generator.GeneratorConfig`).
`deploy/sim/clusters.yaml` is the documented ten-cluster set.

A node list read by a trace mapping (`trace.read_nodes`) builds the clusters instead
(`world_from_nodes`): its nodes, grouped as the mapping says, each cluster with the mapping's
`nodes.registry` entry, or the registry and background of the clusters file's cluster of the same
name when one is given (its datasets and generator too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpuorch_proto import ClusterRegistryEntry

from .trace import NodeRow


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int
    product: str
    memory_mib: int
    pool: str | None = None
    sharing: tuple[str, ...] = ()  # how its GPUs are shared (NodeInfo.sharing); `gpus` counts shared devices
    cpu: float | None = None  # cores (None: not known, not checked)
    memory: float | None = None  # host memory, bytes


@dataclass(frozen=True)
class Background:
    """Other tenants' work submitted straight to this cluster's queue (never routed).

    Poisson arrivals sized so that `utilization` of the cluster's GPUs is busy on average;
    each job takes `gpus` GPUs on one node for an exponential time of mean `mean_seconds`.
    """

    utilization: float = 0.0
    gpus: int = 8
    mean_seconds: float = 4 * 3600.0


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    registry: ClusterRegistryEntry
    background: Background = Background()

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


@dataclass(frozen=True)
class Dataset:
    name: str
    version: str
    size_gb: float
    locations: tuple[str, ...]
    weight: float = 1.0  # popularity

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class World:
    clusters: tuple[ClusterSpec, ...]
    datasets: tuple[Dataset, ...] = ()
    generator: dict[str, Any] = field(default_factory=dict)
    snapshot_interval: float = 30.0  # inventory's publishing period: a snapshot is at most this old
    learn: bool = True  # the router learns run times etc. from the jobs it has seen complete (engine)

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)


def parse_world(doc: dict[str, Any], where: str = "clusters file") -> World:
    clusters: list[ClusterSpec] = []
    for i, c in enumerate(doc.get("clusters") or []):
        name = c.get("name")
        if not name:
            raise ValueError(f"{where}: clusters[{i}].name is missing")
        nodes: list[NodeSpec] = []
        for g in c.get("nodes") or []:
            gpu = g.get("gpu") or {}
            sharing = g.get("sharing") or []
            sharing = (sharing,) if isinstance(sharing, str) else tuple(sharing)
            for k in range(int(g.get("count", 1))):
                nodes.append(NodeSpec(name=f"{g['name']}-{k}", gpus=int(gpu.get("count", 0)), product=str(gpu.get("model", "")),
                                      memory_mib=int(gpu.get("memory_mib", 0)), pool=g.get("pool"), sharing=sharing))
        clusters.append(ClusterSpec(name=name, nodes=tuple(nodes), registry=_registry(c.get("registry"), f"{where}: clusters[{i}]"),
                                    background=_background(c.get("background"), f"{where}: clusters[{i}]")))
    if not clusters:
        raise ValueError(f"{where}: no clusters")
    datasets = tuple(
        Dataset(name=d["name"], version=str(d.get("version", "v1")), size_gb=float(d["size_gb"]),
                locations=tuple(d.get("locations") or ()), weight=float(d.get("weight", 1.0)))
        for d in doc.get("datasets") or []
    )
    return World(clusters=tuple(clusters), datasets=datasets, generator=dict(doc.get("generator") or {}),
                 snapshot_interval=float(doc.get("snapshot_interval", 30.0)), learn=_flag(doc.get("learn", True), "learn", where))


def _registry(entry: object, where: str) -> ClusterRegistryEntry:
    entry = entry or {}
    if not isinstance(entry, dict):
        raise ValueError(f"{where}.registry: a mapping, as inventory reads it")
    # the simulator admits strictly in arrival order (`model.py`): the registry says so, for
    # inventory's waits (`shape_waits`) to follow that order
    queueing = entry.get("queueing", "fifo")
    if queueing != "fifo":
        raise ValueError(f"{where}.registry.queueing: {queueing!r}: the simulator admits strictly in "
                         "arrival order only (docs/simulation.md, Limits); leave it out, or write fifo")
    try:
        return msgspec.convert({**entry, "queueing": queueing}, ClusterRegistryEntry)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{where}.registry: {exc}") from exc


def _background(bg: object, where: str) -> Background:
    bg = bg or {}
    if not isinstance(bg, dict):
        raise ValueError(f"{where}.background: the simulator takes a mapping (utilization, gpus, mean_seconds)")
    return Background(**bg)


def world_from_nodes(nodes: Sequence[NodeRow], registry: Mapping[str, object], where: str, base: World | None = None) -> World:
    """Clusters from a node list (in order of first appearance): each with `registry` (the
    mapping's `nodes.registry`), or the registry and background of `base`'s cluster of that name;
    `base`'s datasets, generator, snapshot interval and learning."""
    grouped: dict[str, list[NodeSpec]] = {}
    for n in nodes:
        grouped.setdefault(n.cluster, []).append(NodeSpec(name=n.name, gpus=n.gpus, product=n.product, memory_mib=n.memory_mib,
                                                          pool=n.pool, sharing=n.sharing, cpu=n.cpu, memory=n.memory))
    known = {c.name: c for c in base.clusters} if base is not None else {}
    default = _registry(dict(registry), f"{where}: nodes")
    clusters = tuple(
        ClusterSpec(name=name, nodes=tuple(ns), registry=known[name].registry if name in known else default,
                    background=known[name].background if name in known else Background())
        for name, ns in grouped.items()
    )
    if base is None:
        return World(clusters=clusters)
    return World(clusters=clusters, datasets=base.datasets, generator=dict(base.generator),
                 snapshot_interval=base.snapshot_interval, learn=base.learn)


def _flag(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {name}: expected true or false, got {value!r}")
    return value


def load_world(path: Path) -> World:
    return parse_world(yaml.safe_load(path.read_text()) or {}, str(path))
