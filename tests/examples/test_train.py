"""The example trainer: a real program, run as the local kubelet runs it (a process, its own cwd)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuorch.workloads.dataset import input_env_var, make_dataset
from gpuorch.workloads.train import main

STEPS = ["--steps", "120", "--checkpoint-every", "40"]


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def run_process(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")} | env
    return subprocess.run(
        [sys.executable, "-m", "gpuorch.workloads.train", *args],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    d = {k: tmp_path / k for k in ("cwd", "out", "ckpt", "data")}
    d["cwd"].mkdir()
    return d


def test_runs_to_completion_and_writes_only_into_the_output_dir(dirs):
    data = make_dataset(dirs["data"], "imagenet@v3", samples=512, features=8, seed=3)
    before = files_under(dirs["data"])
    env = {
        "GPUORCH_OUTPUT_DIR": str(dirs["out"]),
        input_env_var("imagenet"): str(data),
        "GPUORCH_ATTEMPT_ID": "att-1",
        "GPUORCH_EPOCH": "3",
        "GPUORCH_TIME_SCALE": "3600",
    }
    proc = run_process(["--input", "imagenet@v3", "--steps", "50", "--step-seconds", "36"], env, dirs["cwd"])
    assert proc.returncode == 0, proc.stderr
    assert files_under(dirs["out"]) == {"model.npz", "metrics.json"}
    # next to it, the marker of its first step ("useful compute started", for gpuorch's timeline)
    marker = json.loads((dirs["out"].parent / f".{dirs['out'].name}.progress.json").read_text())
    assert marker["attempt_id"] == "att-1" and marker["step"] == 1 and marker["started_at"] > 0
    assert files_under(dirs["cwd"]) == set()  # nothing in the pod's working directory
    assert files_under(dirs["data"]) == before  # the input is read-only to it
    assert not dirs["ckpt"].exists()  # no checkpoint dir given: none written
    m = json.loads((dirs["out"] / "metrics.json").read_text())
    assert (m["steps"], m["resumed_from_step"], m["attempt_id"], m["epoch"]) == (50, None, "att-1", 3)
    assert m["input"]["ref"] == "imagenet@v3" and m["input"]["source"] == str(data)
    assert m["accuracy"] > 0.8 and m["loss"] < 0.6932  # it learnt something (chance is log 2)
    assert m["simulated_seconds"] == 50 * 36


def test_resume_from_a_checkpoint_gives_the_weights_of_an_uninterrupted_run(tmp_path: Path):
    full = {"GPUORCH_OUTPUT_DIR": str(tmp_path / "full"), "GPUORCH_CHECKPOINT_DIR": str(tmp_path / "ck-full")}
    assert main(STEPS, full) == 0

    first = {"GPUORCH_OUTPUT_DIR": str(tmp_path / "a1"), "GPUORCH_CHECKPOINT_DIR": str(tmp_path / "ck")}
    assert main([*STEPS, "--fail-at-step", "80", "--exit-code", "5"], first) == 5
    assert not (tmp_path / "a1").exists()  # a failed attempt publishes nothing
    with np.load(tmp_path / "ck" / "ckpt.npz") as ck:
        assert int(ck["step"]) == 80

    second = {
        "GPUORCH_OUTPUT_DIR": str(tmp_path / "a2"),
        "GPUORCH_CHECKPOINT_DIR": str(tmp_path / "ck2"),
        "GPUORCH_RESUME_FROM": str(tmp_path / "ck" / "ckpt.npz"),
    }
    assert main([*STEPS, "--fail-at-step", "80", "--exit-code", "5"], second) == 0  # resumed past it
    with np.load(tmp_path / "full" / "model.npz") as a, np.load(tmp_path / "a2" / "model.npz") as b:
        assert np.array_equal(a["w"], b["w"]) and a["b"] == b["b"]
        assert int(b["step"]) == 120
    m = json.loads((tmp_path / "a2" / "metrics.json").read_text())
    ref = json.loads((tmp_path / "full" / "metrics.json").read_text())
    assert m["resumed_from_step"] == 80 and m["steps"] == 120
    assert m["loss"] == ref["loss"] and m["accuracy"] == ref["accuracy"]


def test_resume_prints_the_step_and_refuses_other_data(dirs, tmp_path: Path):
    env = {"GPUORCH_OUTPUT_DIR": str(dirs["out"]), "GPUORCH_CHECKPOINT_DIR": str(dirs["ckpt"])}
    assert main(["--steps", "40", "--checkpoint-every", "40"], env) == 0
    resume = {**env, "GPUORCH_RESUME_FROM": str(dirs["ckpt"] / "ckpt.npz")}
    proc = run_process(["--steps", "60", "--checkpoint-every", "40"], resume, dirs["cwd"])
    assert proc.returncode == 0, proc.stderr
    assert "resumed step=40" in proc.stdout
    other = make_dataset(dirs["data"], "imagenet@v4", samples=512, features=16, seed=99)
    proc = run_process(["--steps", "60"], {**resume, "GPUORCH_INPUT_IMAGENET": str(other)}, dirs["cwd"])
    assert proc.returncode == 2
    assert "same data version" in proc.stderr


def test_fail_at_step_exits_with_the_code_after_checkpointing(dirs):
    env = {"GPUORCH_OUTPUT_DIR": str(dirs["out"]), "GPUORCH_CHECKPOINT_DIR": str(dirs["ckpt"])}
    proc = run_process([*STEPS, "--fail-at-step", "40", "--exit-code", "42"], env, dirs["cwd"])
    assert proc.returncode == 42
    assert "injected failure at step=40" in proc.stderr
    assert files_under(dirs["ckpt"]) == {"ckpt.npz"}
    assert not dirs["out"].exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing-dir", "does not exist"),
        ("no-npz", "data.npz is missing"),
        ("wrong-arrays", "must hold arrays X and y"),
        ("bad-shape", "y must have shape"),
        ("nan", "must be finite"),
        ("wrong-version", "but imagenet@v3 was requested"),
        ("missing-checkpoint", "checkpoint"),
        ("no-output-dir", "GPUORCH_OUTPUT_DIR"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(dirs, setup, message):
    d = dirs["data"] / "imagenet@v3"
    env = {"GPUORCH_OUTPUT_DIR": str(dirs["out"]), "GPUORCH_INPUT_IMAGENET": str(d)}
    if setup != "missing-dir":
        d.mkdir(parents=True)
    if setup == "wrong-arrays":
        np.savez(d / "data.npz", features=np.zeros((3, 2)))
    elif setup == "bad-shape":
        np.savez(d / "data.npz", X=np.zeros((3, 2)), y=np.zeros(4))
    elif setup == "nan":
        np.savez(d / "data.npz", X=np.full((3, 2), np.nan), y=np.zeros(3))
    elif setup == "wrong-version":
        make_dataset(dirs["data"], "imagenet@v2")
        env["GPUORCH_INPUT_IMAGENET"] = str(dirs["data"] / "imagenet@v2")
    elif setup == "missing-checkpoint":
        make_dataset(dirs["data"], "imagenet@v3")
        env["GPUORCH_RESUME_FROM"] = str(dirs["ckpt"] / "ckpt.npz")
    elif setup == "no-output-dir":
        make_dataset(dirs["data"], "imagenet@v3")
        del env["GPUORCH_OUTPUT_DIR"]
    proc = run_process(["--input", "imagenet@v3", "--steps", "5"], env, dirs["cwd"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "train: error:" in proc.stderr and message in proc.stderr
    assert not dirs["out"].exists()


def test_examples_wrapper_runs_the_same_trainer(dirs):
    wrapper = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}
    proc = subprocess.run(
        [sys.executable, str(wrapper), "--steps", "5"],
        env=full | {"GPUORCH_OUTPUT_DIR": str(dirs["out"])},
        cwd=dirs["cwd"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((dirs["out"] / "metrics.json").read_text())["steps"] == 5


def test_sigterm_checkpoints_and_exits_143(dirs):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")},
        "GPUORCH_OUTPUT_DIR": str(dirs["out"]),
        "GPUORCH_CHECKPOINT_DIR": str(dirs["ckpt"]),
        "GPUORCH_TIME_SCALE": "100",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuorch.workloads.train", "--steps", "100000", "--step-seconds", "1", "--checkpoint-every", "100000"],
        env=env, cwd=dirs["cwd"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the line printed once the handler is installed
            if line.startswith("training "):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    with np.load(dirs["ckpt"] / "ckpt.npz") as ck:
        assert 1 <= int(ck["step"]) < 100000  # the step in progress completed, then the checkpoint
    assert not dirs["out"].exists()
