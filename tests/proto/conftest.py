from __future__ import annotations

import pytest

from gpuorch_proto import Workload, load_workload_yaml

VALID_YAML = """
apiVersion: gpuorch/v1
kind: Workload
metadata:
  name: train-llm
  owner: team-a
spec:
  image: registry.example/team/train@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
  command: ["python", "train.py"]
  resources:
    gpus: 8
    gpu_memory_gib: 80
    cpu: "32"
    memory: 256Gi
    workers: 2
  inputs:
    - ref: tokens@v3
      size_gb: 120
  expected_runtime: 4h
  checkpoint:
    path: ckpt
    interval: 30m
"""


@pytest.fixture
def valid_workload() -> Workload:
    return load_workload_yaml(VALID_YAML)
