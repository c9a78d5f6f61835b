"""Example workloads that run under gpuorch: a small, real numpy trainer and its datasets.

They live in the package (not only in ``examples/``) so that workload YAML can say
``command: [python, -m, gpuorch.workloads.train, ...]`` and run wherever gpuorch is installed,
whatever the pod's working directory. ``examples/train.py`` and ``examples/make_dataset.py``
are thin wrappers for people reading the examples. numpy is needed (the ``examples`` extra).
"""
