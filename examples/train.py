#!/usr/bin/env python
"""The example trainer. It ships in the package as ``gpuorch.workloads.train`` so that workload
YAML can run ``python -m gpuorch.workloads.train`` from any working directory; this file is a
thin wrapper for running it by hand: ``python examples/train.py --help``."""

from gpuorch.workloads.train import main

if __name__ == "__main__":
    raise SystemExit(main())
