"""Every setting is read through `gpuorch.config` (Settings / Tuning), and documented there once.

A knob read with `os.environ.get` somewhere in a service drifts: its default, its parsing and
its documentation live apart from everyone else's. The scan below fails on any such read in the
control plane; the allowlist names the few places that legitimately touch the environment and why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuorch.backoff import BackoffPolicy
from gpuorch.config import SettingError, Settings, Tuning
from gpuorch.supervisor import policy_from_env
from gpuorch_dispatcher import core as dispatcher_core
from gpuorch_fencer import core as fencer_core

ROOT = Path(__file__).resolve().parent.parent
CONTROL_PLANE = [ROOT / "services", ROOT / "gpuorch", ROOT / "proto"]
ALLOWED = {
    "gpuorch/config.py": "the one parser of the environment",
    "gpuorch/system.py": "passes the environment through to the processes it starts",
    "gpuorch/supervisor.py": "passes the environment through to the processes it restarts",
    "gpuorch/runtime/telemetry.py": "OTEL_* are OpenTelemetry's own variables, read by its conventions",
    "gpuorch/runtime/natsembed.py": "which nats-server the embedded system and the tests start (not a service setting)",
    "gpuorch/workloads/train.py": "runs inside a Job: reads what the dispatcher put in the pod's env",
    "gpuorch/workloads/stage.py": "runs inside a Job: reads what the dispatcher put in the pod's env",
    "gpuorch/workloads/dataset.py": "runs inside a Job",
    "gpuorch/workloads/agent.py": "runs inside a Job (gpuorch's agent): reads the stores and ids the Job put in the pod's env",
}


def _environment_reads(path: Path) -> list[int]:
    """Lines that read the process environment: os.environ[...], os.environ.get, os.getenv."""
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
    return sorted(lines)


def test_no_service_reads_the_environment_itself() -> None:
    offenders = []
    for base in CONTROL_PLANE:
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED or "/dev/" in rel:  # developer tools set up environments for what they start
                continue
            offenders += [f"{rel}:{line}" for line in _environment_reads(path)]
    assert not offenders, "read these through gpuorch.config.Tuning / Settings instead: " + ", ".join(offenders)


def test_the_scan_sees_an_environment_read(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import os\nX = os.environ.get('GPUORCH_X', '1')\nY = os.getenv('Z')\n")
    assert _environment_reads(f) == [2, 3]


def test_knobs_parse_and_bad_values_name_the_variable() -> None:
    t = Tuning.from_env({"GPUORCH_LOST_AFTER": "7.5", "GPUORCH_DISPATCH_CONCURRENCY": "8", "GPUORCH_DISPATCHER_ID": "b"})
    assert (t.lost_after, t.dispatch_concurrency, t.dispatcher_id) == (7.5, 8, "b")
    assert Tuning.from_env({}) == Tuning()
    with pytest.raises(SettingError, match=r"GPUORCH_LOST_AFTER='soon': not a number"):
        Tuning.from_env({"GPUORCH_LOST_AFTER": "soon"})
    with pytest.raises(SettingError, match=r"GPUORCH_KUBE_THREADS='2.5': not an integer"):
        Tuning.from_env({"GPUORCH_KUBE_THREADS": "2.5"})
    with pytest.raises(SettingError, match=r"GPUORCH_OWNER_TTL='0': must be > 0"):
        Tuning.from_env({"GPUORCH_OWNER_TTL": "0"})
    # a probe slower than half of LOST_AFTER could not see a heal before the loss (issue 27)
    with pytest.raises(SettingError, match=r"GPUORCH_PROBE_INTERVAL=1.5: must be at most half of GPUORCH_LOST_AFTER \(2\)"):
        Tuning.from_env({"GPUORCH_LOST_AFTER": "2", "GPUORCH_PROBE_INTERVAL": "1.5"})
    assert Tuning.from_env({"GPUORCH_LOST_AFTER": "2", "GPUORCH_PROBE_INTERVAL": "1"}).probe_interval == 1.0


def test_settings_carry_tuning_to_child_processes() -> None:
    s = Settings.from_env({"GPUORCH_FENCE_INTERVAL": "0.25", "GPUORCH_STATE_DIR": "/tmp/x"})
    env = s.to_env()
    assert env["GPUORCH_FENCE_INTERVAL"] == "0.25"
    assert Settings.from_env(env).tuning == s.tuning
    assert "GPUORCH_LOST_AFTER" not in env  # defaults are not spelled out


def test_for_service_stops_with_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUORCH_INVENTORY_INTERVAL", "-1")
    with pytest.raises(SystemExit, match=r"^inventory: GPUORCH_INVENTORY_INTERVAL='-1': must be > 0"):
        Settings.for_service("inventory")


def test_defaults_agree_with_the_cores_and_the_supervisor() -> None:
    t = Tuning()
    assert t.unschedulable_after == dispatcher_core.UNSCHEDULABLE_GRACE
    assert (t.orphan_grace, t.orphan_grace_unknown) == (fencer_core.ORPHAN_GRACE, fencer_core.ORPHAN_GRACE_UNKNOWN)
    assert (t.requeue_factor, t.requeue_after, t.requeue_max) == (
        dispatcher_core.REQUEUE_FACTOR, dispatcher_core.REQUEUE_FLOOR, dispatcher_core.REQUEUE_MAX)
    d = BackoffPolicy()
    assert policy_from_env({}) == d
    assert policy_from_env({"GPUORCH_RESTART_MAX": "5"}).cap == 5.0


def test_every_knob_is_in_the_operations_guide() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = [var for var, _default, _doc in Tuning.table() if var not in doc]
    assert not missing, f"docs/operations.md does not mention {missing}"
