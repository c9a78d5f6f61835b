"""localkube: embedded local clusters that serve a subset of the Kubernetes API and run each pod's
command as a real local process. See docs/local-clusters.md.

    from gpuorch_localkube import LocalClusters
    with LocalClusters("deploy/local/clusters.yaml", "/tmp/lk") as clusters:
        clusters.write_kubeconfig("/tmp/lk/kubeconfig")
        clusters["primary"].partition()
"""

from typing import TYPE_CHECKING, Any

from .config import (
    BackgroundLoad,
    ClusterConfig,
    ConfigError,
    GpuSpec,
    LocalClustersConfig,
    NodeGroup,
    load_config,
    parse_cluster,
    parse_config,
)

__all__ = [
    "BackgroundLoad",
    "ClusterConfig",
    "ConfigError",
    "GpuSpec",
    "LocalCluster",
    "LocalClusters",
    "LocalClustersConfig",
    "NodeGroup",
    "kubeconfig_dict",
    "load_config",
    "parse_cluster",
    "parse_config",
    "write_kubeconfig",
]


if TYPE_CHECKING:
    from .cluster import LocalCluster, LocalClusters, kubeconfig_dict, write_kubeconfig

_CLUSTER = {"LocalCluster", "LocalClusters", "kubeconfig_dict", "write_kubeconfig"}


def __getattr__(name: str) -> Any:
    """The serving parts (`cluster`: the asyncio API server) load on first use, so that the
    pure parts (the scheduler's rules, the config) import without an I/O library: the
    deterministic simulation uses them (tests/dst: it loads no I/O library)."""
    if name in _CLUSTER:
        from . import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
