"""The local clusters' import graph: no cycle, and nothing of the orchestrator but gpuorch_proto.kubesem.

Every import counts: module level, inside functions, and under `if TYPE_CHECKING:` (a cycle that
only the type checker follows is still two modules that cannot be understood one without the
other). Controllers depend on the `Protocol`s of `gpuorch_localkube.api`, not on `core` or on each
other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import gpuorch_localkube

PACKAGE = "gpuorch_localkube"
PROJECT = ("gpuorch", "gpuorch_proto", "gpuorch_router", "gpuorch_dispatcher", "gpuorch_fencer", "gpuorch_inventory")
ALLOWED_PROJECT_IMPORTS = {"gpuorch_proto.kubesem"}
CONTROLLERS = ("scheduler", "jobcontroller", "kubelet", "background", "events")


def _modules() -> dict[str, Path]:
    root = Path(gpuorch_localkube.__file__).parent
    out = {}
    for path in sorted(root.glob("*.py")):
        name = PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"
        out[name] = path
    return out


def imports_of(module: str, source: str, known: Iterable[str]) -> set[str]:
    """Absolute names of every module `source` imports (relative imports resolved)."""
    known = set(known)
    package = module if module == PACKAGE else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}".strip(".") if node.module else base
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
    return out


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: imports_of(m, p.read_text(), mods) for m, p in mods.items()}


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of the graph (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if m not in edges:
                continue
            if state.get(m) == 1:
                return [*stack[stack.index(m):], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    g = graph()
    internal = {m: {i for i in imps if i in g and i != PACKAGE} for m, imps in g.items()}
    cycle = find_cycle(internal)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_kubesem_from_the_orchestrator() -> None:
    bad = {
        (m, i) for m, imps in graph().items() for i in imps
        if i.split(".")[0] in PROJECT and i not in ALLOWED_PROJECT_IMPORTS
    }
    assert not bad, f"gpuorch_localkube imports orchestrator code: {sorted(bad)}"


def test_controllers_depend_on_the_interface_not_on_core_or_each_other() -> None:
    g = graph()
    controllers = {f"{PACKAGE}.{c}" for c in CONTROLLERS}
    for c in controllers:
        bad = g[c] & (controllers | {f"{PACKAGE}.core", f"{PACKAGE}.cluster", f"{PACKAGE}.apiserver"})
        assert not bad, f"{c} imports {sorted(bad)}"


def test_the_checks_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import X\ndef f():\n    from ..gpuorch_router import y\n"
    found = imports_of(f"{PACKAGE}.scheduler", src, [f"{PACKAGE}.core"])
    assert f"{PACKAGE}.core" in found, "TYPE_CHECKING imports count"
    assert "gpuorch_router" in found, "function-level imports count"
