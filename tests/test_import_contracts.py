"""Package boundaries (`.importlinter`) are kept, and the check is able to fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
