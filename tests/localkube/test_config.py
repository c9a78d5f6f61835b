"""The default configuration models the seed's three clusters; kubeconfig contexts work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuorch_localkube import ClusterConfig, ConfigError, LocalClusters, load_config, parse_config
from gpuorch_localkube.config import REGISTRY_KEYS
from gpuorch_localkube.util import parse_duration

from .helpers import TIMEOUT, k8s, wait_for

DEFAULT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "clusters.yaml"


def test_default_config_models_the_seed_clusters() -> None:
    cfg = load_config(DEFAULT)
    assert cfg.time_scale == 600
    assert [c.name for c in cfg.clusters] == ["primary", "spare", "short"]
    raw = yaml.safe_load(DEFAULT.read_text())
    for c in raw["clusters"]:
        assert set(c["registry"]) == set(REGISTRY_KEYS), c["name"]
        assert c["registry"]["admission"] in ("none", "kueue", "kai", "volcano")
        assert all(set(q) == {"name", "owners"} for q in c["registry"]["queues"])
    primary, spare, short = cfg.clusters
    assert primary.registry == raw["clusters"][0]["registry"]  # kept verbatim
    assert "imagenet@v3" in primary.registry["datasets_cached"] and primary.registry["data_locations"] == ["primary-nfs"]
    assert {"prod", "scratch"} <= set(primary.registry["artifact_stores"])

    def gpus(c: ClusterConfig) -> int:
        return sum(g.count * g.gpu.count for g in c.nodes if g.gpu)

    # about 2 simulated hours of background work ahead on all of primary's GPUs
    queued_gpu_hours = sum(b.jobs * b.gpus_per_job * b.duration for b in primary.background) / 3600
    assert 1.5 <= queued_gpu_hours / gpus(primary) <= 2.5
    assert {g.gpu.memory_mib for g in primary.nodes if g.gpu} == {81920}
    # spare: idle 40 GB A100s, no dataset, a ~3 h copy of imagenet (1.35 TB) from primary-nfs
    assert not spare.background and not spare.registry["datasets_cached"]
    assert {g.gpu.memory_mib for g in spare.nodes if g.gpu} == {40960}
    copy_hours = 1.35e6 / spare.registry["bandwidth_mbps"]["primary-nfs"] / 3600
    assert 2.5 <= copy_hours <= 3.5
    assert "prod" in spare.registry["artifact_stores"]
    # short: experiments pool behind a taint, no prod
    assert "prod" not in short.registry["artifact_stores"] and "scratch" in short.registry["artifact_stores"]
    assert all(g.pool == "experiments" and any(t["key"] == "gpuorch.io/short-only" for t in g.taints) for g in short.nodes)


def test_config_errors_are_reported() -> None:
    with pytest.raises(ConfigError, match="clusters"):
        parse_config({"time_scale": 10})
    with pytest.raises(ConfigError, match="time_scale"):
        parse_config({"time_scale": 0, "clusters": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"clusters": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(ConfigError, match="duration"):
        parse_config({"clusters": [{"name": "a", "background": [{"name": "b", "duration": "soon"}]}]})
    assert parse_duration("1h30m") == 5400 and parse_duration("2h") == 7200 and parse_duration(90) == 90


def test_default_clusters_serve_one_kubeconfig_context_each(tmp_path: Path) -> None:
    with LocalClusters(DEFAULT, tmp_path / "state") as clusters:
        kc = clusters.write_kubeconfig(tmp_path / "kubeconfig")
        doc = yaml.safe_load(kc.read_text())
        assert [x["name"] for x in doc["contexts"]] == ["primary", "spare", "short"]
        ports = set()
        for name in clusters.names:
            server = next(x["cluster"]["server"] for x in doc["clusters"] if x["name"] == name)
            assert server.startswith("http://127.0.0.1:")
            ports.add(server)
            c = k8s(kc, name)
            nodes = c.core.list_node(_request_timeout=TIMEOUT).items
            assert nodes and all(n.metadata.labels["nvidia.com/gpu.product"] for n in nodes)
        assert len(ports) == 3
        short = k8s(kc, "short")
        taints = {(t.key, t.effect) for n in short.core.list_node(_request_timeout=TIMEOUT).items for t in n.spec.taints}
        assert taints == {("gpuorch.io/short-only", "NoSchedule")}
        primary = k8s(kc, "primary")
        # the background queue exists as real Jobs, and some of it is running
        wait_for(lambda: len(primary.batch.list_namespaced_job("tenants", _request_timeout=TIMEOUT).items) == 8)
        wait_for(lambda: [p for p in primary.core.list_namespaced_pod("tenants", _request_timeout=TIMEOUT).items
                          if p.status.phase == "Running"])
        pids = [p for c in clusters for p in c.pids()]
        assert pids
    from .helpers import pid_alive

    assert not [p for p in pids if pid_alive(p)]
