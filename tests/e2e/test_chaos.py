"""A seeded, bounded randomized fault schedule; the invariant checker must find nothing."""

from __future__ import annotations

import pytest

from gpuorch.dev.chaos import run_schedule
from gpuorch.system import System

pytestmark = pytest.mark.e2e


async def test_seeded_fault_schedule_keeps_every_invariant(system: System) -> None:
    faults, violations, _figures = await run_schedule(system, seed=11, n_workloads=3, n_faults=3, horizon=12.0)
    assert sum(faults.values()) == 3, faults
    assert violations == [], violations
