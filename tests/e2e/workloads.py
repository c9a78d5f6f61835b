"""Workloads for the end-to-end tests (built through the same YAML loader users use)."""

from __future__ import annotations

from typing import Any

from gpuorch_proto import Workload, workload_from_obj

DIGEST = "example.org/gpuorch/train@sha256:" + "5e" * 32


def train(name: str = "e2e", steps: int = 40, step_seconds: float = 60, fencing: str = "strict", **spec: Any) -> Workload:
    """A real training run: `steps` x `step_seconds` simulated seconds (600x faster in real time)."""
    body: dict[str, Any] = {
        "image": DIGEST,
        "command": ["python", "-m", "gpuorch.workloads.train"],
        "args": ["--input", "mnist@v1", "--steps", str(steps), "--step-seconds", str(step_seconds), "--checkpoint-every", "5"],
        "inputs": [{"ref": "mnist@v1", "size_gb": 10, "locations": ["alpha-nfs"]}],
        "resources": {"gpus": 2, "gpu_memory_gib": 80, "cpu": "4", "memory": "16Gi"},
        "expected_runtime": f"{int(steps * step_seconds)}s",
        "reference_accelerator": "NVIDIA-A100-SXM4-80GB",
        "checkpoint": {"path": "ckpt", "portable": True, "store": "prod"},
        "output": {"store": "prod"},
        "fencing": fencing,
        "lease": "10m",
    }
    body.update(spec)
    return workload_from_obj({"metadata": {"name": name, "owner": "tests"}, "spec": body})
