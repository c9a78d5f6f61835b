"""The security mutation campaign's own checks, cheap enough for `make test` (the campaign itself
is `make mutants`): every attack test is the target of a mutant (or says why it is not), every
mutant names real code and real tests, the permission mutants change the config the embedded
system writes (and nats-server still takes it), and without the variable nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuorch.dev.security_mutants.mutants import MUTANTS, NOT_A_PROTECTION, applied, process_of
from gpuorch.runtime.natsembed import find_nats_server
from gpuorch.security import bundle, generate
from gpuorch.system import SECURITY_MUTANT_ENV, service_argv
from gpuorch_proto import Names
from tests.security import test_attacks, test_workload_input

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MUTANTS = sorted(
    n for n, m in MUTANTS.items() if any(p[0] == "gpuorch.security.bundle" for p in m.patches)
)


def attack_tests() -> set[str]:
    """The node ids of every attack test, parametrized ones one per parameter."""
    out = set()
    for module in (test_attacks, test_workload_input):
        where = f"tests/security/{Path(module.__file__ or '').name}::"
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not callable(fn):
                continue
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            out |= {f"{where}{name}[{v}]" for m in marks for v in m.args[1]} if marks else {where + name}
    return out


def test_every_attack_test_is_the_target_of_a_mutant_or_says_why_not() -> None:
    targets = {t for m in MUTANTS.values() for t in m.tests}
    tests = attack_tests()
    assert targets - tests == set(), "a mutant names a test that does not exist"
    assert set(NOT_A_PROTECTION) <= tests
    assert tests - targets - set(NOT_A_PROTECTION) == set(), "an attack test no mutant shows can fail"


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_mutant_patches_real_code_only_in_its_processes_and_restores_it(name: str) -> None:
    import importlib

    mutant = MUTANTS[name]
    assert mutant.processes and mutant.tests and mutant.removes

    def current() -> list[object]:
        out = []
        for module, attr, _ in mutant.patches:
            owner: object = importlib.import_module(module)
            for part in attr.split("."):
                owner = getattr(owner, part)
            out.append(owner)
        return out

    before = current()
    elsewhere = next(
        p for p in ("tests", "router", "dispatcher", "fencer", "inventory") if p not in mutant.processes
    )
    with applied(name, elsewhere) as patched:
        assert patched == [] and current() == before
    with applied(name, mutant.processes[0]) as patched:
        assert len(patched) == len(mutant.patches)
        assert all(a is not b for a, b in zip(current(), before, strict=True))
    assert current() == before


def test_an_unknown_mutant_is_an_error_not_a_run_without_one() -> None:
    with pytest.raises(KeyError), applied("no-such-mutant", "tests"):
        pass


def _written(tmp: Path, mutant: str | None) -> tuple[str, dict[str, int]]:
    with applied(mutant, "tests"):
        b = generate(
            tmp,
            Names("gpuorch"),
            clients={"client": ["*"], "mallory": ["team-x"]},
            clusters=["alpha", "beta"],
        )
    modes = {p.name: p.stat().st_mode & 0o777 for p in [b.dir / "creds", *(b.dir / "creds").iterdir()]}
    return b.config.read_text(), modes


@pytest.mark.parametrize("name", CONFIG_MUTANTS)
def test_a_permission_mutant_changes_what_the_system_writes_and_the_server_takes_it(
    name: str, tmp_path: Path
) -> None:
    config, modes = _written(tmp_path / "plain", None)
    mutated, mutated_modes = _written(tmp_path / "mutated", name)
    assert (json.loads(mutated), mutated_modes) != (json.loads(config), modes)
    checked = subprocess.run([find_nats_server(), "-t", "-c", str(tmp_path / "mutated" / bundle.CONFIG_NAME)],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stderr


def test_without_the_variable_the_services_start_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECURITY_MUTANT_ENV, raising=False)
    assert service_argv("gpuorch_router") == [sys.executable, "-m", "gpuorch_router"]
    monkeypatch.setenv(SECURITY_MUTANT_ENV, "cancel-by-anyone")
    assert service_argv("gpuorch_router") == [
        sys.executable,
        "-m",
        "gpuorch.dev.security_mutants.launch",
        "gpuorch_router",
    ]
    assert [process_of(m) for m in ("gpuorch_router", "gpuorch_fencer", "pytest")] == [
        "router",
        "fencer",
        "tests",
    ]


def test_the_launcher_runs_the_module_with_the_mutant_applied() -> None:
    env = {**os.environ, SECURITY_MUTANT_ENV: "anonymous-allowed"}
    argv = [sys.executable, "-m", "gpuorch.dev.security_mutants.launch", "json.tool"]
    ran = subprocess.run(
        argv, input='{"a": 1}', capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False
    )
    assert ran.returncode == 0 and json.loads(ran.stdout) == {"a": 1}, ran.stderr
    assert (
        "security mutant anonymous-allowed: gpuorch.security.bundle:server_config patched in tests"
        in ran.stderr
    )
