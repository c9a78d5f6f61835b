"""Builders for simulator tests: small worlds and traces written out by hand."""

from __future__ import annotations

from typing import Any

from gpuorch.simulate.generator import IMAGE_DIGESTS, GeneratorConfig, SimJob, generate
from gpuorch.simulate.trace import TraceJob
from gpuorch.simulate.world import World, parse_world

#: exact: no run-time error, no memory/accelerator needs, no inputs
EXACT = GeneratorConfig(memory_gib=((0.0, 1.0),), accelerators=(("", 1.0),), no_input=1.0, prod_store=0.0,
                        declared_sigma=0.0, model_sigma=0.0)


def cluster(name: str, *, nodes: int = 1, gpus: int = 8, model: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920,
            price: float = 2.0, startup: float = 60.0, local: list[str] | None = None,
            bandwidth: dict[str, float] | None = None, background: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": [{"name": f"{name}-n", "count": nodes, "pool": "train", "gpu": {"model": model, "memory_mib": memory_mib, "count": gpus}}],
        "background": background or {},
        "registry": {"price_per_gpu_hour": price, "artifact_stores": ["prod", "scratch"], "images_cached": list(IMAGE_DIGESTS),
                     "data_locations": local or [], "bandwidth_mbps": bandwidth or {}, "startup_seconds": startup,
                     "queues": [{"name": "default", "owners": ["*"]}]},
    }


def world(*clusters: dict[str, Any], datasets: list[dict[str, Any]] | None = None, interval: float = 0.0) -> World:
    return parse_world({"clusters": list(clusters), "datasets": datasets or [], "snapshot_interval": interval})


def jobs(rows: list[tuple[float, float, int]], w: World, cfg: GeneratorConfig = EXACT, seed: int = 0) -> list[SimJob]:
    """(submit s, run s on an A100, GPUs) -> jobs with generated attributes."""
    return [generate(TraceJob(f"j{i}", s, d, g, "t"), i, seed, w.datasets, cfg) for i, (s, d, g) in enumerate(rows)]
