#!/usr/bin/env python
"""Write a small synthetic ``NAME@VERSION/data.npz`` into a data location directory.

    python examples/make_dataset.py --location .gpuorch/data/primary-nfs --dataset imagenet@v3

Thin wrapper around ``gpuorch.workloads.dataset`` (importable: ``make_dataset(location, ref)``)."""

from gpuorch.workloads.dataset import main

if __name__ == "__main__":
    raise SystemExit(main())
