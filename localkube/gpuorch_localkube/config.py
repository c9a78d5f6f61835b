"""Configuration of local clusters (deploy/local/clusters.yaml); see docs/local-clusters.md."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .dcgm import DcgmConfig
from .quantity import QuantityError, parse_quantity
from .util import DNS1123_SUBDOMAIN, parse_duration

__all__ = [
    "BackgroundLoad",
    "ClusterConfig",
    "ConfigError",
    "GpuSpec",
    "LocalClustersConfig",
    "NodeGroup",
    "load_config",
    "parse_cluster",
    "parse_config",
]

REGISTRY_KEYS = (
    "price_per_gpu_hour",
    "artifact_stores",
    "connections",
    "datasets_cached",
    "images_cached",
    "bandwidth_mbps",
    "admission",
    "queues",
    "startup_seconds",
    "data_locations",
    "metrics",
)
JOB_CLOCKS = ("simulated", "real")


class ConfigError(ValueError):
    """The cluster configuration is not valid."""


@dataclass(frozen=True)
class GpuSpec:
    model: str
    memory_mib: int
    count: int


@dataclass(frozen=True)
class NodeGroup:
    name: str
    count: int = 1
    gpu: GpuSpec | None = None
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    pool: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


@dataclass(frozen=True)
class BackgroundLoad:
    """Other tenants' load: keep `jobs` Jobs of `gpus_per_job` GPUs submitted, each running `duration`."""

    name: str
    gpus_per_job: int
    jobs: int
    duration: float  # simulated seconds
    namespace: str = "tenants"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    priority: int = 0


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    nodes: list[NodeGroup]
    background: list[BackgroundLoad] = field(default_factory=list)
    registry: dict[str, Any] = field(default_factory=dict)  # ignored by localkube, kept verbatim
    time_scale: float = 1.0
    job_clock: str = "simulated"
    port: int = 0
    watch_history: int = 5000
    priority_classes: dict[str, int] = field(default_factory=dict)
    scheduler_names: tuple[str, ...] = ("default-scheduler",)
    #: the dcgm-exporter it serves through its API server's service proxy (None: none, as on a
    #: cluster without the GPU Operator's exporter); gpuorch_localkube.dcgm
    dcgm_exporter: DcgmConfig | None = field(default_factory=DcgmConfig)

    def to_seconds(self, simulated: float) -> float:
        """Real seconds for a simulated duration."""
        return simulated / self.time_scale

    def job_clock_seconds(self, seconds: float) -> float:
        """Real seconds for activeDeadlineSeconds / ttlSecondsAfterFinished."""
        return seconds / self.time_scale if self.job_clock == "simulated" else seconds


@dataclass(frozen=True)
class LocalClustersConfig:
    time_scale: float
    clusters: list[ClusterConfig]
    raw: dict[str, Any] = field(default_factory=dict)

    def cluster(self, name: str) -> ClusterConfig:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _positive_number(value: Any, where: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: expected a number, got {value!r}") from e
    if out <= 0:
        raise ConfigError(f"{where}: must be > 0")
    return out


def _int(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    try:
        out = int(value)
    except ValueError as e:
        raise ConfigError(f"{where}: expected an integer, got {value!r}") from e
    if out < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}")
    return out


def _quantity(value: Any, where: str) -> str:
    text = str(value)
    try:
        parse_quantity(value)
    except QuantityError as e:
        raise ConfigError(f"{where}: {e}") from e
    return text


def _taint(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, str):  # "key=value:Effect" or "key:Effect"
        kv, _, effect = value.rpartition(":")
        key, _, val = kv.partition("=")
        value = {"key": key, "value": val, "effect": effect}
    if not isinstance(value, Mapping) or "key" not in value:
        raise ConfigError(f"{where}: a taint needs a key")
    effect = str(value.get("effect", "NoSchedule"))
    if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ConfigError(f"{where}: effect must be NoSchedule, PreferNoSchedule or NoExecute")
    out = {"key": str(value["key"]), "effect": effect}
    if value.get("value") not in (None, ""):
        out["value"] = str(value["value"])
    return out


def _node_group(raw: Any, where: str) -> NodeGroup:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    name = str(raw.get("name", ""))
    if not DNS1123_SUBDOMAIN.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a valid node name prefix")
    gpu = None
    if raw.get("gpu"):
        g = raw["gpu"]
        if not isinstance(g, Mapping):
            raise ConfigError(f"{where}.gpu: expected a mapping")
        gpu = GpuSpec(
            model=str(g.get("model", "NVIDIA-A100-SXM4-80GB")),
            memory_mib=_int(g.get("memory_mib", 81920), f"{where}.gpu.memory_mib", 1),
            count=_int(g.get("count", 8), f"{where}.gpu.count"),
        )
    return NodeGroup(
        name=name,
        count=_int(raw.get("count", 1), f"{where}.count"),
        gpu=gpu,
        cpu=_quantity(raw.get("cpu", "32"), f"{where}.cpu"),
        memory=_quantity(raw.get("memory", "256Gi"), f"{where}.memory"),
        pods=_int(raw.get("pods", 110), f"{where}.pods", 1),
        pool=str(raw["pool"]) if raw.get("pool") is not None else None,
        labels=_str_map(raw.get("labels"), f"{where}.labels"),
        taints=[_taint(t, f"{where}.taints[{i}]") for i, t in enumerate(raw.get("taints") or [])],
    )


def _background(raw: Any, where: str) -> BackgroundLoad:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    name = str(raw.get("name", ""))
    if not DNS1123_SUBDOMAIN.match(name) or len(name) > 40:
        raise ConfigError(f"{where}.name: {name!r} must be a DNS-1123 name of at most 40 characters")
    try:
        duration = parse_duration(raw.get("duration", "1h"))
    except ValueError as e:
        raise ConfigError(f"{where}.duration: {e}") from e
    tolerations = raw.get("tolerations") or []
    if not isinstance(tolerations, list):
        raise ConfigError(f"{where}.tolerations: expected a list")
    return BackgroundLoad(
        name=name,
        namespace=str(raw.get("namespace", "tenants")),
        gpus_per_job=_int(raw.get("gpus_per_job", 1), f"{where}.gpus_per_job"),
        jobs=_int(raw.get("jobs", 1), f"{where}.jobs"),
        duration=duration,
        node_selector=_str_map(raw.get("node_selector"), f"{where}.node_selector"),
        tolerations=[dict(t) for t in tolerations],
        priority=_int(raw.get("priority", 0), f"{where}.priority", -(2**31)),
    )


def parse_background(raw: Any, where: str = "background") -> list[BackgroundLoad]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list")
    out = [_background(b, f"{where}[{i}]") for i, b in enumerate(raw)]
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: names must be unique")
    return out


def _dcgm(raw: Any, where: str) -> DcgmConfig | None:
    """`dcgm_exporter:` false (none), true or absent (the GPU Operator's defaults), or a mapping
    of `DcgmConfig`'s fields."""
    if raw is None or raw is True:
        return DcgmConfig()
    if raw is False:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected true, false or a mapping (namespace, service, port, port_name, collect_interval)")
    known = {"namespace", "service", "port", "port_name", "collect_interval"}
    extra = sorted(set(raw) - known)
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} (known: {', '.join(sorted(known))})")
    base = DcgmConfig()
    for key in ("namespace", "service", "port_name"):
        if key in raw and not DNS1123_SUBDOMAIN.match(str(raw[key])):
            raise ConfigError(f"{where}.{key}: {raw[key]!r} is not a DNS-1123 name")
    return DcgmConfig(
        namespace=str(raw.get("namespace", base.namespace)),
        service=str(raw.get("service", base.service)),
        port=_int(raw.get("port", base.port), f"{where}.port", 1),
        port_name=str(raw.get("port_name", base.port_name)),
        collect_interval=_positive_number(raw.get("collect_interval", base.collect_interval), f"{where}.collect_interval"),
    )


def parse_cluster(
    raw: Mapping[str, Any], *, time_scale: float = 1.0, job_clock: str = "simulated", where: str = "cluster"
) -> ClusterConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    name = str(raw.get("name", ""))
    if not DNS1123_SUBDOMAIN.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a valid cluster name (DNS-1123)")
    nodes_raw = raw.get("nodes") or []
    if not isinstance(nodes_raw, list):
        raise ConfigError(f"{where}.nodes: expected a list of node groups")
    nodes = [_node_group(n, f"{where}.nodes[{i}]") for i, n in enumerate(nodes_raw)]
    all_names = [n for g in nodes for n in g.node_names()]
    if len(set(all_names)) != len(all_names):
        raise ConfigError(f"{where}.nodes: node names are not unique")
    registry = raw.get("registry") or {}
    if not isinstance(registry, Mapping):
        raise ConfigError(f"{where}.registry: expected a mapping")
    scale = _positive_number(raw.get("time_scale", time_scale), f"{where}.time_scale")
    clock = str(raw.get("job_clock", job_clock))
    if clock not in JOB_CLOCKS:
        raise ConfigError(f"{where}.job_clock: must be one of {JOB_CLOCKS}")
    pcs = raw.get("priority_classes") or {}
    if not isinstance(pcs, Mapping):
        raise ConfigError(f"{where}.priority_classes: expected a mapping name -> integer")
    sched = raw.get("scheduler_names") or ["default-scheduler"]
    return ClusterConfig(
        name=name,
        nodes=nodes,
        background=parse_background(raw.get("background"), f"{where}.background"),
        registry=copy.deepcopy(dict(registry)),
        time_scale=scale,
        job_clock=clock,
        port=_int(raw.get("port", 0), f"{where}.port"),
        watch_history=_int(raw.get("watch_history", 5000), f"{where}.watch_history", 1),
        priority_classes={str(k): _int(v, f"{where}.priority_classes.{k}", -(2**31)) for k, v in pcs.items()},
        scheduler_names=tuple(str(s) for s in sched),
        dcgm_exporter=_dcgm(raw.get("dcgm_exporter"), f"{where}.dcgm_exporter"),
    )


def parse_config(raw: Mapping[str, Any]) -> LocalClustersConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("the configuration must be a mapping with `clusters:`")
    scale = _positive_number(raw.get("time_scale", 1.0), "time_scale")
    clock = str(raw.get("job_clock", "simulated"))
    if clock not in JOB_CLOCKS:
        raise ConfigError(f"job_clock: must be one of {JOB_CLOCKS}")
    clusters_raw = raw.get("clusters") or []
    if not isinstance(clusters_raw, list) or not clusters_raw:
        raise ConfigError("clusters: expected a non-empty list")
    clusters = [
        parse_cluster(c, time_scale=scale, job_clock=clock, where=f"clusters[{i}]") for i, c in enumerate(clusters_raw)
    ]
    names = [c.name for c in clusters]
    if len(set(names)) != len(names):
        raise ConfigError("clusters: names must be unique")
    return LocalClustersConfig(time_scale=scale, clusters=clusters, raw=copy.deepcopy(dict(raw)))


def load_config(path: str | Path) -> LocalClustersConfig:
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    return parse_config(raw or {})
