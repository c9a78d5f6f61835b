"""localkube: embedded local clusters that serve a subset of the Kubernetes API and run each pod's
command as a real local process. See docs/local-clusters.md.

    from gpuorch_localkube import LocalClusters
    with LocalClusters("deploy/local/clusters.yaml", "/tmp/lk") as clusters:
        clusters.write_kubeconfig("/tmp/lk/kubeconfig")
        clusters["primary"].partition()
"""

from .cluster import LocalCluster, LocalClusters, kubeconfig_dict, write_kubeconfig
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
