"""No router module keeps mutable state at module level: caches belong to an object the caller owns.

The fast path's memos are attributes of a `RoutingMemo` (the router, the simulations and the bench
each construct one). This test reads every module of `gpuorch_router` and refuses:

* a module-level name bound to a mutable container (a dict/list/set display or comprehension, or
  a call such as ``dict()``, ``defaultdict()``, ``deque()``, ``itertools.count()``) unless it is
  annotated ``Final`` and the module never mutates it (item assignment, ``del``, augmented
  assignment, or a mutating method such as ``append``, ``clear``, ``update``, ``pop``);
* ``global`` statements;
* ``functools.lru_cache`` / ``functools.cache`` anywhere (a cache hidden in a function object).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuorch_router

ROUTER = Path(gpuorch_router.__file__).parent
MODULES = sorted(p for p in ROUTER.glob("*.py"))
CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "count", "WeakValueDictionary", "WeakKeyDictionary"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard", "remove", "sort", "reverse", "appendleft", "__setitem__", "__delitem__"}
CACHES = {"lru_cache", "cache"}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mutable(value: ast.AST | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    return isinstance(value, ast.Call) and _name(value.func) in CONTAINER_CALLS


def _final(annotation: ast.AST | None) -> bool:
    if annotation is None:
        return False
    head = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return _name(head) == "Final"


def problems(source: str, where: str = "<module>") -> list[str]:
    """What this module's source keeps as module-level mutable state."""
    tree = ast.parse(source)
    out: list[str] = []
    containers: dict[str, bool] = {}  # module-level name -> annotated Final
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and _mutable(stmt.value):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    containers[t.id] = t.id == "__all__"  # the export list: a constant, unless mutated
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and _mutable(stmt.value):
            containers[stmt.target.id] = _final(stmt.annotation)
    for name, final in containers.items():
        if not final:
            out.append(f"{where}: module-level mutable {name!r} (not Final)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out.append(f"{where}:{node.lineno}: global {', '.join(node.names)}")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if _name(target) in CACHES:
                    out.append(f"{where}:{node.lineno}: @{_name(target)} on {node.name} (a hidden module-level cache)")
        target: ast.AST | None = None
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                base = t.value if isinstance(t, ast.Subscript) else (t if isinstance(node, ast.AugAssign) else None)
                if isinstance(base, ast.Name) and base.id in containers:
                    out.append(f"{where}:{node.lineno}: mutates module-level {base.id!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            target = node.func.value
            if isinstance(target, ast.Name) and target.id in containers:
                out.append(f"{where}:{node.lineno}: {target.id}.{node.func.attr}() mutates module-level state")
    return out


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_router_module_keeps_no_mutable_state(path: Path) -> None:
    assert problems(path.read_text(), path.name) == []


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("_MEMO: dict[int, int] = {}\ndef f(k):\n    _MEMO[k] = 1\n", id="annotated-dict-mutated"),
        pytest.param("from typing import Final\n_SEEN: Final = set()\ndef f(k):\n    _SEEN.add(k)\n", id="final-set-added-to"),
        pytest.param("_WORLDS = []\n", id="module-list"),
        pytest.param("import itertools\n_IDS = itertools.count(1)\n", id="id-counter"),
        pytest.param("from functools import lru_cache\n@lru_cache(maxsize=8)\ndef f(x):\n    return x\n", id="lru-cache"),
        pytest.param("import functools\n@functools.cache\ndef f(x):\n    return x\n", id="functools-cache"),
        pytest.param("N = 0\ndef f():\n    global N\n    N += 1\n", id="global"),
    ],
)
def test_the_check_finds_module_state(source: str) -> None:
    assert problems(source)


def test_a_final_constant_table_is_allowed() -> None:
    assert problems("from typing import Final, Mapping\nSPEED: Final[Mapping[str, float]] = {'A100': 1.0}\n") == []
