"""The simulated world: heterogeneous clusters, data locations and datasets (a clusters file).

The file has the shape of `deploy/local/clusters.yaml` (node groups with `gpu: {model, memory_mib,
count}`, `pool`; a `registry:` entry exactly as inventory reads it), plus what only the simulator
needs: per cluster `background` (other tenants' load) and, at top level, `datasets` (the catalogue
the generator draws inputs from) and `generator` (overrides of `generator.GeneratorConfig`).
`deploy/sim/clusters.yaml` is the documented ten-cluster set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpuorch_proto import ClusterRegistryEntry


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int
    product: str
    memory_mib: int
    pool: str | None = None


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
            for k in range(int(g.get("count", 1))):
                nodes.append(NodeSpec(name=f"{g['name']}-{k}", gpus=int(gpu.get("count", 0)), product=str(gpu.get("model", "")),
                                      memory_mib=int(gpu.get("memory_mib", 0)), pool=g.get("pool")))
        entry = c.get("registry") or {}
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: clusters[{i}].registry: a mapping, as inventory reads it")
        # the simulator admits strictly in arrival order (`model.py`): the registry says so, for
        # inventory's waits (`shape_waits`) to follow that order
        queueing = entry.get("queueing", "fifo")
        if queueing != "fifo":
            raise ValueError(f"{where}: clusters[{i}].registry.queueing: {queueing!r}: the simulator admits strictly in "
                             "arrival order only (docs/simulation.md, Limits); leave it out, or write fifo")
        try:
            registry = msgspec.convert({**entry, "queueing": queueing}, ClusterRegistryEntry)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{where}: clusters[{i}].registry: {exc}") from exc
        bg = c.get("background") or {}
        if not isinstance(bg, dict):
            raise ValueError(f"{where}: clusters[{i}].background: the simulator takes a mapping (utilization, gpus, mean_seconds)")
        clusters.append(ClusterSpec(name=name, nodes=tuple(nodes), registry=registry, background=Background(**bg)))
    if not clusters:
        raise ValueError(f"{where}: no clusters")
    datasets = tuple(
        Dataset(name=d["name"], version=str(d.get("version", "v1")), size_gb=float(d["size_gb"]),
                locations=tuple(d.get("locations") or ()), weight=float(d.get("weight", 1.0)))
        for d in doc.get("datasets") or []
    )
    return World(clusters=tuple(clusters), datasets=datasets, generator=dict(doc.get("generator") or {}),
                 snapshot_interval=float(doc.get("snapshot_interval", 30.0)), learn=_flag(doc.get("learn", True), "learn", where))


def _flag(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {name}: expected true or false, got {value!r}")
    return value


def load_world(path: Path) -> World:
    return parse_world(yaml.safe_load(path.read_text()) or {}, str(path))
