"""One-line mutants of the production modules, to show that the simulation finds them (issue 29).

A mutant is (module, the exact original line, the replacement line) in a module the services run
and the simulation runs too: the services' cores, the router's admission rules
(`gpuorch_router.pipeline`), `gpuorch.liveness`; not a service shell (`*.service`), which the
simulation does not run yet (its shells are copies: issue 29, item 1). `applied(name)` reads the module's source, replaces that one line (it must occur exactly once, else the mutant is
refused with `MutantError`), compiles the result under the module's own file name and executes it
in the module's namespace: every function of the module is then the mutated source's, and every
reference to one of them from another loaded gpuorch module (`from module import f`) is pointed at
the new one. The module's classes keep their identity (isinstance, other modules' imports) and get
the new source's methods; other values keep theirs unless the line changed a plain constant. On
leaving the block the module's namespace, its classes and those references are restored. Nothing
is hand-written: the simulation runs the production code with one line changed.

    python -m gpuorch.dev.dst --mutant NAME               # search its first failing seed
    python -m gpuorch.dev.dst --mutants all               # every mutant: seed, invariant, schedules
    python -m gpuorch.dev.dst --seed S --trace --mutant NAME   # replay it

`seed` is the first seed (searching from 1) whose schedule breaks `invariant` with the mutant
applied, as last measured; tests/dst/test_mutations.py replays it, and `--mutants all` (run by
`make chaos`) searches again and says when the figure moved.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MutantError(ValueError):
    """A mutant that cannot be applied as written (its line is missing or not unique)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # dotted name of a production module
    original: str  # the line as it is in the source (compared without its indentation)
    replacement: str  # what it becomes (indented as the original)
    invariant: str  # what the simulation must see broken
    seed: int  # the first seed that breaks it (search from 1): the number of schedules it took
    what: str  # the bug, in words


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in [
        Mutant(
            "fencer-ignores-epoch", "gpuorch_fencer.core",
            "if e.epoch != rec.epoch:", "if False:",
            "no-stale-promotion", 75,
            "the fencer's promotion gate drops its epoch check: a fenced attempt's late success is promoted",
        ),
        Mutant(
            "fence-without-bump", "gpuorch_fencer.core",
            "new = replace(current, epoch=e.epoch + 1, current_attempt=None)",
            "new = replace(current, epoch=e.epoch, current_attempt=None)",
            "no-stale-promotion", 75,
            "fencing does not move the epoch: the fenced attempt's token stays valid",
        ),
        Mutant(
            "strict-as-fast", "gpuorch_fencer.core",
            'if e.policy == "fast":', 'if e.policy in ("fast", "strict"):',
            "replacement-after-fence", 27,
            "the fencer allows a strict replacement at the epoch bump, before the attempt is confirmed gone",
        ),
        Mutant(
            "replacement-before-fence", "gpuorch_dispatcher.core",
            'if latest is None or not _replacement_due(view, latest) or "replacement-allowed" not in latest.times:',
            "if latest is None or not _replacement_due(view, latest):",
            "replacement-after-fence", 27,
            "the dispatcher's reconcile requests a replacement without the fencer's replacement-allowed",
        ),
        Mutant(
            "absent-at-once", "gpuorch_dispatcher.core",
            "return cache_rv is not None and cache_rv >= created_rv", "return True",
            "absent-means-gone", 1,
            "the dispatcher takes a Job missing from its informer cache for gone at once (absent_for_sure)",
        ),
        Mutant(
            "admission-past-limit", "gpuorch_router.pipeline",
            "if n + 1 > limits.max_running:", "if n > limits.max_running:",
            "within-limits", 1,
            "admission holds only past the limit: one more workload is released than max_running allows",
        ),
        Mutant(
            "replacement-never-reevaluated", "gpuorch_router.core",
            "return wanted", "return None",
            "wait-reason-current", 8,
            "the router's re-evaluation skips a waiting replacement: it waits on a reason inventory disproved",
        ),
        Mutant(
            "claim-over-live-owner", "gpuorch_dispatcher.core",
            "if current is None or over(current.owner, current.generation):", "if True:",
            "one-owner", 1,
            "a dispatcher claims a workload whose owner's generation is not over",
        ),
        Mutant(
            "renew-after-end", "gpuorch_dispatcher.core",
            "generation = lease.generation + 1 if lease.ended else lease.generation",
            "generation = lease.generation",
            "one-owner", 2,
            "an instance renews the generation another dispatcher ended (and took its workloads)",
        ),
        Mutant(
            "fenced-not-replaced", "gpuorch_dispatcher.core",
            'return a.status in ("failed", "lost") or stale_success(a) or (a.fenced and not a.promoted)',
            'return a.status in ("failed", "lost") or stale_success(a)',
            "terminal-or-waiting", 37,
            "a lost attempt seen running after its fence is never replaced (the bug the simulation found)",
        ),
    ]
}


def mutated_source(source: str, original: str, replacement: str, where: str = "the module") -> tuple[str, int]:
    """`source` with the one line whose text (without indentation) is `original` replaced by
    `replacement` at the same indentation; and that line's number. Refused (`MutantError`) when
    no line or more than one line is `original`, or when the replacement is the original."""
    want = original.strip()
    if not want or "\n" in want or "\n" in replacement.strip():
        raise MutantError(f"{where}: a mutant changes exactly one line; got {original!r} -> {replacement!r}")
    if replacement.strip() == want:
        raise MutantError(f"{where}: the replacement of {want!r} is the same line")
    lines = source.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.strip() == want]
    if len(found) != 1:
        at = f" (lines {', '.join(str(i + 1) for i in found)})" if found else ""
        raise MutantError(f"{where}: the line {want!r} occurs {len(found)} times{at}; a mutant needs it exactly once")
    i = found[0]
    line = lines[i]
    indent = line[: len(line) - len(line.lstrip())]
    end = line[len(line.rstrip("\r\n")) :]
    lines[i] = indent + replacement.strip() + end
    return "".join(lines), i + 1


def _functions(ns: dict[str, Any], filename: str) -> dict[str, Any]:
    return {k: v for k, v in ns.items() if isinstance(v, types.FunctionType) and v.__code__.co_filename == filename}


def _class_members(cls: type, filename: str) -> dict[str, Any]:
    out = {}
    for k, v in vars(cls).items():
        f = v.__func__ if isinstance(v, staticmethod | classmethod) else v.fget if isinstance(v, property) else v
        if isinstance(f, types.FunctionType) and f.__code__.co_filename == filename:
            out[k] = v
    return out


def _changed_constant(old: object, new: object) -> bool:
    plain = (int, float, str, bytes, bool, type(None))
    return isinstance(old, plain) and isinstance(new, plain) and (type(old) is not type(new) or old != new)


@contextmanager
def mutated(module_name: str, original: str, replacement: str) -> Iterator[int]:
    """Run the block with `module_name` executed from its source with one line replaced (see the
    module doc); yields the line number. The module, its classes and the references to its
    functions from other loaded gpuorch modules are restored afterwards, whatever happens."""
    module = importlib.import_module(module_name)
    filename = module.__file__
    if filename is None:
        raise MutantError(f"{module_name}: no source file")
    source = Path(filename).read_text()
    new_source, lineno = mutated_source(source, original, replacement, f"{module_name} ({filename})")
    code = compile(new_source, filename, "exec")
    saved = dict(module.__dict__)
    classes = {v: dict(vars(v)) for v in saved.values() if isinstance(v, type) and v.__module__ == module_name}
    old_functions = _functions(saved, filename)
    patched: list[tuple[dict[str, Any], str, Any]] = []  # (namespace, name, old value)
    try:
        exec(code, module.__dict__)
        ns = module.__dict__
        # keep the classes themselves (isinstance, other modules' imports), with the new methods
        for cls in classes:
            new_cls = ns.get(cls.__name__)
            if isinstance(new_cls, type) and new_cls is not cls:
                for k, v in _class_members(new_cls, filename).items():
                    setattr(cls, k, v)
                ns[cls.__name__] = cls
        # other values keep their identity (aliases and tables built from the classes, state),
        # unless the mutated line changed a plain constant
        for k, v in saved.items():
            if k in ns and not isinstance(v, types.FunctionType | type) and not _changed_constant(v, ns[k]):
                ns[k] = v
        # other modules' references to the old functions now name the new ones
        swap = {id(f): (f, ns[k]) for k, f in old_functions.items() if ns.get(k) is not None and ns[k] is not f}
        for name, mod in list(sys.modules.items()):
            if mod is module or not name.startswith("gpuorch") or not isinstance(mod, types.ModuleType):
                continue
            d = mod.__dict__
            for k, v in list(d.items()):
                old_new = swap.get(id(v))
                if old_new is not None and old_new[0] is v:
                    patched.append((d, k, v))
                    d[k] = old_new[1]
        yield lineno
    finally:
        for d, k, v in patched:
            d[k] = v
        for cls, members in classes.items():
            for k in list(vars(cls)):
                if k not in members:
                    delattr(cls, k)
            for k, v in members.items():
                if k not in ("__dict__", "__weakref__") and vars(cls).get(k) is not v:
                    setattr(cls, k, v)
        module.__dict__.clear()
        module.__dict__.update(saved)


def refuse_unsimulated(module: str) -> None:
    """A mutant of code the simulation does not run could never be found: refused, saying why."""
    if module.startswith("gpuorch.dev"):
        raise MutantError(f"{module}: a mutant changes production code, not the simulation's own")
    if module.endswith(".service"):
        raise MutantError(
            f"{module}: the simulation does not run the service shells (gpuorch.dev.dst.shells copies them; "
            "issue 29 item 1): mutate the core rule the shell calls"
        )


@contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Apply the mutant `name` (None: none) for the duration of the block."""
    if name is None:
        yield
        return
    m = MUTANTS.get(name)
    if m is None:
        raise MutantError(f"no mutant {name!r} (mutants: {', '.join(sorted(MUTANTS))})")
    refuse_unsimulated(m.module)
    with mutated(m.module, m.original, m.replacement):
        yield
