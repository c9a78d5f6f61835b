"""The functional core stays pure: decision modules import no I/O library, even indirectly."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PURE = [
    "gpuorch_proto",
    "gpuorch_proto.kubesem",
    "gpuorch_router.policy",
    "gpuorch_router.index",
    "gpuorch_router.demand",
    "gpuorch_router.checks",
    "gpuorch_router.estimate",
    "gpuorch_router.decision",
    "gpuorch_router.fastpath",
    "gpuorch_proto.resume",
    "gpuorch_router.explain",
    "gpuorch_router.history",
    "gpuorch_router.core",
    "gpuorch_router.fairshare",
    "gpuorch_router.preempt",
    "gpuorch_router.queues",
    "gpuorch_dispatcher.core",
    "gpuorch_fencer.core",
    "gpuorch_inventory.core",
    "gpuorch.projection",
    "gpuorch.compaction",
    "gpuorch.views",
    "gpuorch.invariants",
    "gpuorch.backoff",
    "gpuorch.liveness",
    "gpuorch.observe.browse",
    "gpuorch.observe.dag",
    "gpuorch.observe.capacity",
    "gpuorch.dev.dst.sim",
    "gpuorch.dev.dst.mutants",
    "gpuorch.dev.dst.__main__",
]
FORBIDDEN = {"nats", "kubernetes", "asyncio", "structlog", "opentelemetry", "urllib3", "subprocess", "socket"}
PROJECT = ("gpuorch", "gpuorch_proto", "gpuorch_router", "gpuorch_dispatcher", "gpuorch_fencer", "gpuorch_inventory", "gpuorch_localkube")


def _find(module: str) -> object | None:
    try:
        return importlib.util.find_spec(module)
    except (ModuleNotFoundError, AttributeError):  # `pkg.mod.Name`: a name, not a module
        return None


def _file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


def _imports(module: str) -> set[str]:
    path = _file(module)
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []  # imports for type checkers only never run
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
                out.add(target)
                for a in node.names:  # `from . import core` imports a submodule
                    if _find(f"{target}.{a.name}") is not None:
                        out.add(f"{target}.{a.name}")
            elif node.module:
                out.add(node.module)
    return out


def _closure(module: str) -> dict[str, str]:
    """Every module reachable from `module` through project imports -> who imported it."""
    seen: dict[str, str] = {module: ""}
    todo = [module]
    while todo:
        m = todo.pop()
        for imp in _imports(m):
            if imp.split(".")[0] in PROJECT and imp not in seen and _find(imp) is not None:
                seen[imp] = m
                todo.append(imp)
            elif imp.split(".")[0] not in PROJECT and imp not in seen:
                seen[imp] = m
    return seen


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    reached = _closure(module)
    bad = {m: by for m, by in reached.items() if m.split(".")[0] in FORBIDDEN}
    assert not bad, f"{module} reaches I/O modules: " + ", ".join(f"{m} (via {by})" for m, by in bad.items())


def test_the_check_can_fail() -> None:
    reached = _closure("gpuorch_dispatcher.service")
    assert any(m.split(".")[0] == "kubernetes" for m in reached)
