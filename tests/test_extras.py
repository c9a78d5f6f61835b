"""The web view's and the charts' libraries are an optional extra (`pip install 'gpuorch[web]'`) that
the service image does not install: everything else imports and runs without them, and the
commands that need them say so instead of failing with a traceback (gpuorch.extras).

"Without them" is a child process in which they cannot be imported: a `sitecustomize` on its
`PYTHONPATH` sets `sys.modules[name] = None` for each, which makes `import name` raise
`ModuleNotFoundError` as if it were not installed (and `importlib.util.find_spec` say None)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpuorch import extras
from gpuorch.cli import build_parser, needs_web_extra

ROOT = Path(__file__).resolve().parent.parent
GPUORCH = Path(sys.executable).with_name("gpuorch")
#: The modules that import the extra's libraries when imported (all others import them, if at all,
#: in the function that needs them). The contract *web-extra-apart* in .importlinter keeps them
#: out of what the services import.
NEED_THE_EXTRA = {"gpuorch.observe.web", "gpuorch.observe.plots", "gpuorch.observe.browse"}
#: Every service's entry module (`python -m ...` in deploy/base), the topology Job's included.
ENTRIES = ["gpuorch_router.__main__", "gpuorch_dispatcher.__main__", "gpuorch_fencer.__main__",
           "gpuorch_inventory.__main__", "gpuorch.security.topology"]  # fmt: skip


@pytest.fixture
def without_extra(tmp_path: Path) -> dict[str, str]:
    """The environment of a child process in which the web extra's modules cannot be imported."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nfor name in " + repr(extras.WEB) + ":\n    sys.modules[name] = None\n"
    )
    path = [str(site), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_extra_is_what_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [r.split("==")[0].lower() for r in project["optional-dependencies"]["web"]]
    assert declared == list(extras.WEB)
    required = {r.split("==")[0].lower() for r in project["dependencies"]}
    assert not required & set(extras.WEB), "the service image installs `dependencies`: none of the extra there"


# A child process lists every module of gpuorch, imports each (but the few that need the extra,
# which must fail as not installed), and prints what failed.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
need, entries = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
names = list(entries)
for root in ("gpuorch", "gpuorch_proto", "gpuorch_router", "gpuorch_dispatcher", "gpuorch_fencer", "gpuorch_inventory"):
    pkg = importlib.import_module(root)
    names += [root] + [m.name for m in pkgutil.walk_packages(pkg.__path__, root + ".") if not m.name.endswith("__main__")]
failed, blocked = {}, {}
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        (blocked if name in need else failed)[name] = f"{err.name}: {err}"
    except Exception as err:
        failed[name] = repr(err)
print(json.dumps({"names": len(names), "failed": failed, "blocked": sorted(blocked),
                  "leaked": [m for m in json.loads(sys.argv[3]) if sys.modules.get(m) is not None]}))
"""


def test_everything_but_the_web_view_and_the_charts_imports_without_the_extra(without_extra: dict[str, str]) -> None:
    out = _run([sys.executable, "-c", IMPORT_ALL, json.dumps(sorted(NEED_THE_EXTRA)), json.dumps(ENTRIES),
                json.dumps(list(extras.WEB))], without_extra)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["names"] > 100, got  # every package was walked (147 modules today)
    assert got["failed"] == {}, "these import the web extra at import time: " + json.dumps(got["failed"], indent=1)
    assert got["blocked"] == sorted(NEED_THE_EXTRA), "the extra was not blocked, or a module no longer needs it"
    assert got["leaked"] == []


def test_the_services_entry_modules_do_not_load_the_extra_even_when_installed() -> None:
    code = ("import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
            f"print(sorted(n for n in {extras.WEB!r} if n in sys.modules))")  # fmt: skip
    out = _run([sys.executable, "-c", code, *ENTRIES], dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_commands_without_the_extra_run(without_extra: dict[str, str], tmp_path: Path) -> None:
    out = _run([str(GPUORCH), "settings"], without_extra)
    assert out.returncode == 0, out.stderr
    assert "GPUORCH_WEB_BASE_PATH" in out.stdout
    trace = tmp_path / "trace.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\na,0,600,1\nb,60,300,2\nc,120,900,1\n")
    out = _run([str(GPUORCH), "simulate", "--trace", str(trace), "--policy", "gpuorch", "-o", "json"], without_extra)
    assert out.returncode == 0, out.stderr
    assert '"gpuorch"' in out.stdout and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [["web", "--port", "0"], ["report", "--plot", "charts"], ["simulate", "--trace", "trace.csv", "--plot", "charts"]],
    ids=["web", "report --plot", "simulate --plot"],
)
def test_a_command_that_needs_the_extra_says_how_to_install_it(
    args: list[str], without_extra: dict[str, str], tmp_path: Path
) -> None:
    out = _run([str(GPUORCH), *args], without_extra, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pip install 'gpuorch[web]'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert f"gpuorch {args[0]}" in out.stderr
    assert not (tmp_path / "charts").exists(), "nothing done before the check"


@pytest.mark.parametrize(
    ("argv", "what"),
    [(["web"], "gpuorch web"), (["report", "--plot", "d"], "gpuorch report --plot"), (["report"], None),
     (["simulate", "--trace", "t.csv", "--plot", "d"], "gpuorch simulate --plot"), (["simulate", "--trace", "t.csv"], None),
     (["list"], None), (["settings"], None)],
)  # fmt: skip
def test_which_commands_need_the_extra(argv: list[str], what: str | None) -> None:
    assert needs_web_extra(build_parser().parse_args(argv)) == what


def test_missing_names_what_cannot_be_imported() -> None:
    assert extras.missing(["json", "gpuorch_no_such_module"]) == ["gpuorch_no_such_module"]
    assert "pip install 'gpuorch[web]'" in extras.hint("gpuorch web", ["starlette"])
