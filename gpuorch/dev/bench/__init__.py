"""Benchmarks: ``python -m gpuorch.dev.bench`` runs every bench in :data:`BENCHES` and prints one table.

A bench is a callable ``run(quick: bool) -> list[Row]`` named by ``"module:function"``; add yours
to :data:`BENCHES` (imported lazily, so one bench's imports never slow another).
"""

from __future__ import annotations

BENCHES: list[str] = [
    "gpuorch.dev.bench.routing:run",
    "gpuorch.dev.bench.faults:run",
    "gpuorch.dev.bench.shell:run",
    "gpuorch.dev.bench.throughput:run",
    "gpuorch.dev.bench.restart:run",
    "gpuorch.dev.bench.pending:run",
    "gpuorch.dev.bench.localkube:run",
    "gpuorch.dev.bench.storage:run",
    "gpuorch.dev.bench.replay:run",
]
