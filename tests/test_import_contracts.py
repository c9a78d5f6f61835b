"""Package boundaries (`.importlinter`) are kept, and the check is able to fail."""

from __future__ import annotations

import configparser
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import gpuorch

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_package_boundaries_hold() -> None:
    out = _lint(ROOT / ".importlinter")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KEPT" in out.stdout and "BROKEN" not in out.stdout


def test_a_crossed_boundary_is_reported(tmp_path: Path) -> None:
    """The same tool on a contract the code does break (the router uses the contract): exit 1, naming the import."""
    cfg = tmp_path / "broken.ini"
    cfg.write_text(
        "[importlinter]\nroot_packages =\n    gpuorch_proto\n    gpuorch_router\n\n"
        "[importlinter:contract:x]\nname = router without the contract\ntype = forbidden\n"
        "source_modules =\n    gpuorch_router\nforbidden_modules =\n    gpuorch_proto\n"
    )
    out = _lint(cfg)
    assert out.returncode == 1, out.stdout
    assert "gpuorch_router" in out.stdout and "gpuorch_proto" in out.stdout and "BROKEN" in out.stdout


def _layers() -> list[list[str]]:
    """The modules of each layer of the *layers* contract, top first (`a : b` and `a | b` share one)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    lines = [x.strip() for x in cfg["importlinter:contract:layers"]["layers"].splitlines() if x.strip()]
    return [[m.strip() for m in re.split(r"[|:]", line)] for line in lines]


#: Not in a layer: the root package's `__init__` and the `observe` package's (its modules are in
#: different layers), and the code that runs inside a Job (its own contract, *in-job-code*).
OUTSIDE_THE_LAYERS = {"gpuorch", "gpuorch.observe"}
IN_JOBS = "gpuorch.workloads"


def test_every_module_of_gpuorch_is_in_a_layer() -> None:
    """A new module is placed in a layer (or its package is), so the layers check it."""
    listed = [m for layer in _layers() for m in layer]
    modules = ["gpuorch", *(m.name for m in pkgutil.walk_packages(gpuorch.__path__, "gpuorch."))]
    placed = [*listed, IN_JOBS]
    loose = [m for m in modules if m not in OUTSIDE_THE_LAYERS and not any(m == x or m.startswith(x + ".") for x in placed)]
    assert loose == [], f"place these in a layer of .importlinter's layers contract: {loose}"
    assert _layers()[0] == ["gpuorch.dev"] and _layers()[-1] == ["gpuorch_proto"]


def test_a_layer_importing_one_above_it_is_reported(tmp_path: Path) -> None:
    """The layers of .importlinter with the fold placed above the services (the dispatcher's core
    reads the projection): broken, naming the import."""
    layers = _layers()
    fold = next(layer for layer in layers if "gpuorch.projection" in layer)
    layers.remove(fold)
    layers.insert(0, fold)
    cfg = tmp_path / "upside-down.ini"
    cfg.write_text(
        "[importlinter]\nroot_packages =\n    gpuorch\n    gpuorch_proto\n    gpuorch_router\n    gpuorch_dispatcher\n"
        "    gpuorch_fencer\n    gpuorch_inventory\n\n[importlinter:contract:x]\nname = fold on top\ntype = layers\nlayers =\n"
        + "".join(f"    {' : '.join(layer)}\n" for layer in layers)
    )
    out = _lint(cfg)
    assert out.returncode == 1, out.stdout
    assert "BROKEN" in out.stdout and "gpuorch_dispatcher.core" in out.stdout and "gpuorch.projection" in out.stdout


def test_a_lazy_import_of_the_web_view_is_seen(tmp_path: Path) -> None:
    """The check reads imports inside functions too: `observe.commands` imports the web view only
    in `run_web`, and a contract forbidding it is broken."""
    cfg = tmp_path / "lazy.ini"
    cfg.write_text(
        "[importlinter]\nroot_packages =\n    gpuorch\n\n[importlinter:contract:x]\nname = commands without web\n"
        "type = forbidden\nsource_modules =\n    gpuorch.observe.commands\nforbidden_modules =\n    gpuorch.observe.web\n"
    )
    out = _lint(cfg)
    assert out.returncode == 1, out.stdout
    assert "gpuorch.observe.commands -> gpuorch.observe.web" in out.stdout
