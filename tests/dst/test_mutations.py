"""Mutation checks in production code (issue 29): each mutant is one line of a module the services
run, changed (`gpuorch.dev.dst.mutants`); the simulation must find it, and the seed recorded for it
replays the violation.

Per mutant: its recorded seed, run with the mutated module, breaks the mutant's invariant (twice
the same trace: the seed replays it); the same seed with the real module keeps that invariant; the
module is itself again afterwards; the command line replays it. The search of every mutant from
seed 1 up to 10,000 schedules is `make chaos`'s (`python -m gpuorch.dev.dst --mutants all`), not here:
the recorded seed is the number of schedules that search took.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from gpuorch.dev.dst.__main__ import DEFAULT_SCHEDULES, main
from gpuorch.dev.dst.mutants import MUTANTS, MutantError, applied, mutated, mutated_source, refuse_unsimulated
from gpuorch.dev.dst.sim import run


def _functions(module_name: str) -> dict[str, object]:
    module = importlib.import_module(module_name)
    return {k: v for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module_name}


def test_there_are_at_least_six_mutants_each_found_within_the_bound() -> None:
    assert len(MUTANTS) >= 6
    assert {m.invariant for m in MUTANTS.values()} >= {"no-stale-promotion", "replacement-after-fence", "absent-means-gone", "within-limits"}
    for m in MUTANTS.values():
        assert 1 <= m.seed <= DEFAULT_SCHEDULES, m.name
        refuse_unsimulated(m.module)  # production code the simulation runs


@pytest.mark.parametrize("name", sorted(MUTANTS), ids=lambda m: m)
def test_the_recorded_seed_replays_the_mutant_and_the_real_code_passes_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    m = MUTANTS[name]
    before = _functions(m.module)
    with applied(name):
        changed = [k for k, f in _functions(m.module).items() if f is not before.get(k)]
        a, b = run(m.seed, trace=True), run(m.seed, trace=True)
    assert changed, "the module's functions are the mutated source's while it is applied"
    hits = [v for v in a.violations if v.invariant == m.invariant]
    assert hits, f"{name}: seed {m.seed} no longer breaks {m.invariant}; search again: python -m gpuorch.dev.dst --mutant {name}"
    assert a.trace == b.trace and hits == [v for v in b.violations if v.invariant == m.invariant]
    assert any(line.startswith(f"VIOLATION {m.invariant} ") for line in a.trace or [])

    # the mutant is the cause: the real module, on the same schedule, keeps the invariant
    assert _functions(m.module) == before, "the module is restored"
    assert not [v for v in run(m.seed).violations if v.invariant == m.invariant]

    # and the replay command says so
    assert main(["--seed", str(m.seed), "--trace", "--mutant", name]) == 1
    assert f"VIOLATION {m.invariant} " in capsys.readouterr().out


def test_the_search_reports_seed_invariant_and_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    name = min(MUTANTS, key=lambda n: (MUTANTS[n].seed, n))
    m = MUTANTS[name]
    assert main(["--mutant", name, "--schedules", str(m.seed), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"found: {m.invariant} at seed {m.seed}, after {m.seed} schedules" in out
    assert f"--seed {m.seed} --trace --mutant {name}" in out
    assert "mutants found: 1 of 1" in out


def test_the_mutated_function_is_the_one_production_calls() -> None:
    """While `absent-at-once` is applied the dispatcher core's own function (which the dispatcher
    service calls as `core.absent_for_sure`) answers otherwise; a name imported from a mutated module
    by another module (`gpuorch_router.core`'s `Gate`, a class: kept, with the new methods) follows."""
    from gpuorch.views import AttemptView
    from gpuorch_dispatcher import core as dcore
    from gpuorch_router import core as rcore
    from gpuorch_router import pipeline

    a = AttemptView(attempt_id="w-a1", number=1, cluster="c", epoch=1)
    assert dcore.absent_for_sure(a, created_rv=5, cache_rv=4, complete_at=0.0) is False
    original = dcore.absent_for_sure
    with applied("absent-at-once"):
        assert dcore.absent_for_sure is not original
        assert dcore.absent_for_sure(a, created_rv=5, cache_rv=4, complete_at=0.0) is True
    assert dcore.absent_for_sure is original
    step = pipeline.Gate.step
    with applied("admission-past-limit"):
        assert rcore.Gate is pipeline.Gate and pipeline.Gate.step is not step
    assert pipeline.Gate.step is step


def test_a_mutant_whose_line_is_not_there_once_is_refused() -> None:
    from gpuorch_dispatcher import core as dcore

    before = _functions("gpuorch_dispatcher.core")
    with pytest.raises(MutantError, match="occurs 0 times"), mutated("gpuorch_dispatcher.core", "return maybe_gone(a)", "return True"):
        pass
    with pytest.raises(MutantError, match=r"occurs \d+ times \(lines "), mutated("gpuorch_dispatcher.core", "return []", "return None"):
        pass
    with pytest.raises(MutantError, match="same line"), mutated("gpuorch_dispatcher.core", "if False:", "if False:"):
        pass
    with pytest.raises(MutantError, match="no mutant 'nope'"), applied("nope"):
        pass
    with pytest.raises(MutantError, match="does not run the service shells"):
        refuse_unsimulated("gpuorch_dispatcher.service")
    with pytest.raises(MutantError, match="not the simulation's own"):
        refuse_unsimulated("gpuorch.dev.dst.shells")
    assert _functions("gpuorch_dispatcher.core") == before and dcore.absent_for_sure is before["absent_for_sure"]


def test_mutated_source_keeps_the_indentation_and_changes_one_line() -> None:
    src = "def f(x):\n    if x > 1:\n        return 1\n    return 0\n"
    new, line = mutated_source(src, "if x > 1:", "if x >= 1:")
    assert line == 2 and new == src.replace("if x > 1:", "if x >= 1:")
    assert sum(a != b for a, b in zip(src.splitlines(), new.splitlines(), strict=True)) == 1
