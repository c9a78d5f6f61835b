"""Mutation checks: a deliberate bug in a core is found by the simulation within its default
schedule count (the count `make chaos` runs), and the seed it reports replays the violation.

Each search stops at the first seed that shows the mutant's invariant broken, so a test costs a
few dozen schedules, not ten thousand; the bound is the default count itself.
"""

from __future__ import annotations

import pytest

from gpuorch.dev.dst.__main__ import DEFAULT_SCHEDULES, main
from gpuorch.dev.dst.mutants import MUTANTS, applied
from gpuorch.dev.dst.sim import run


def first_seed(mutant: str, invariant: str, limit: int = DEFAULT_SCHEDULES) -> int | None:
    with applied(mutant):
        for seed in range(1, limit + 1):
            if any(v.invariant == invariant for v in run(seed).violations):
                return seed
    return None


@pytest.mark.parametrize("mutant", sorted(MUTANTS), ids=lambda m: m)
def test_the_simulation_finds_the_mutant_and_its_seed_replays_it(mutant: str, capsys: pytest.CaptureFixture[str]) -> None:
    invariant = MUTANTS[mutant][3]
    seed = first_seed(mutant, invariant)
    assert seed is not None, f"{mutant}: no schedule of {DEFAULT_SCHEDULES} broke {invariant}"

    # the seed reproduces it exactly: the same steps, the same violation, twice
    with applied(mutant):
        a, b = run(seed, trace=True), run(seed, trace=True)
    assert a.trace == b.trace
    assert [v for v in a.violations if v.invariant == invariant] == [v for v in b.violations if v.invariant == invariant] != []
    assert any(line.startswith(f"VIOLATION {invariant} ") for line in a.trace or [])

    # the mutant is the cause: the real cores on the same schedule keep the invariant
    assert not [v for v in run(seed).violations if v.invariant == invariant]
    assert MUTANTS[mutant][0].__dict__[MUTANTS[mutant][1]] is not MUTANTS[mutant][2]  # restored

    # and the command line prints that seed with the command that replays it
    assert main(["--schedules", str(seed), "--mutant", mutant, "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith(f"{invariant}:"))
    assert str(seed) in line.split("seeds", 1)[1].replace(",", " ").split()
    assert f"--seed {seed} --trace --mutant {mutant}" in out
