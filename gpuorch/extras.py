"""Optional extras: what `pip install 'gpuorch[web]'` adds, and the message when it is missing.

The service image installs gpuorch without extras (deploy/Dockerfile), so no service carries the
web view's or the charts' libraries. The commands that need them (`gpuorch web`,
`gpuorch report --plot`, `gpuorch simulate --plot`) ask `missing` first and print `hint` rather
than fail with a traceback half-way. `.importlinter` (*web-extra-apart*) keeps every import of
these libraries out of the modules the services import.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

#: The `web` extra's import names, as pyproject.toml's `[project.optional-dependencies] web` lists
#: their distributions (tests/test_extras.py keeps the two equal).
WEB = ("matplotlib", "starlette", "uvicorn", "jinja2", "sortedcontainers")


def missing(modules: Iterable[str] = WEB) -> list[str]:
    """The modules of `modules` that cannot be imported here (not installed, or blocked)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, or a module without a spec
            found = False
        if not found:
            out.append(name)
    return out


def hint(what: str, gone: Iterable[str], extra: str = "web") -> str:
    """What to tell whoever ran `what` without the extra."""
    return (
        f"{what} needs the optional '{extra}' extra, which is not installed here "
        f"(missing: {', '.join(gone)}): pip install 'gpuorch[{extra}]'"
    )
