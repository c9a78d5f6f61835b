"""What the example trainer reports about its work (gpuorch.workloads.meter; docs/activity.md):
its progress (steps, samples, compute vs input wait) through the progress channel, and, where a
local cluster asks for it, its device use; and gpuorch's agent uploading each new progress."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuorch.objectstore import open_store
from gpuorch.observe.progress import parse_work, work_path
from gpuorch.workloads.meter import write_work
from gpuorch_proto import podpath
from gpuorch_proto.storage import PROGRESS, StoreConfig, pod_store_env

REPO = Path(__file__).resolve().parents[2]


def train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}
    full.update({"GPUORCH_OUTPUT_DIR": str(tmp_path / "out"), "GPUORCH_ATTEMPT_ID": "w-a1", "GPUORCH_TIME_SCALE": "100"})
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpuorch.workloads.train", *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_data_bound_run_reports_its_wait_and_its_device_use(tmp_path: Path) -> None:
    device = tmp_path / "devices" / "main.json"
    device.parent.mkdir()
    proc = train(tmp_path, "--steps", "20", "--step-seconds", "2", "--input-wait-seconds", "6", "--batch-size", "32",
                 "--gpu-memory-mib", "4096", env={"GPUORCH_GPU_REPORT": str(device)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    work = parse_work(work_path(tmp_path / "out").read_bytes())
    assert work is not None and work["done"] is True and work["attempt_id"] == "w-a1"
    assert (work["steps"], work["samples"], work["step"], work["device"]) == (20, 640, 20, "gpu")
    # 0.02 s real computing and 0.06 s waiting per step: a quarter of its time on the device
    share = work["compute_seconds"] / (work["compute_seconds"] + work["input_wait_seconds"])
    assert 0.15 < share < 0.35, work
    assert work["first_step_at"] < work["last_step_at"]
    used = json.loads(device.read_text())
    assert used["busy_seconds"] == pytest.approx(work["compute_seconds"]) and used["busy_since"] is None
    assert used["fb_used_mib"] == 0  # released at the end
    own = json.loads((tmp_path / "out" / "metrics.json").read_text())["work"]
    assert own["steps"] == 20 and own["activity"] == pytest.approx(share)
    assert own["steps_per_second"] == pytest.approx(20 / (work["last_step_at"] - work["first_step_at"]))


def test_a_cpu_program_leaves_its_gpus_untouched_but_reports_its_work(tmp_path: Path) -> None:
    device = tmp_path / "main.json"
    proc = train(tmp_path, "--steps", "5", "--device", "cpu", env={"GPUORCH_GPU_REPORT": str(device)})
    assert proc.returncode == 0, proc.stderr
    assert not device.exists()
    work = parse_work(work_path(tmp_path / "out").read_bytes())
    assert work is not None and work["device"] == "cpu" and work["steps"] == 5 and work["input_wait_seconds"] == 0


@pytest.mark.parametrize("data", [b"", b"[]", b'{"steps": "3"}', b"{not json", b'{"steps": true, "samples": 1}'])
def test_what_is_not_a_progress_document_is_none(data: bytes) -> None:
    assert parse_work(data) is None


def start_agent(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuorch.workloads.agent", "sync", "--store", "prod", "--prefix",
                             "w/attempts/w-a1", "--interval", "0.1"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


async def test_the_agent_uploads_each_new_progress_and_the_last_at_its_end(tmp_path: Path) -> None:
    root = tmp_path / "pod"
    root.mkdir()
    config = StoreConfig(url=(tmp_path / "store").resolve().as_uri())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")}
    env[podpath.POD_ROOT] = str(root)
    env.update({str(e["name"]): str(e["value"]) for e in pod_store_env("prod", config, None) if "value" in e})
    store = open_store("prod", config, {})
    agent = start_agent(env)
    try:
        out = podpath.local(podpath.OUT, env)

        async def uploaded(steps: int) -> None:
            deadline = time.monotonic() + 60
            while True:
                work = parse_work(await store.get(f"w/attempts/w-a1/{PROGRESS}"))
                if work is not None and work["steps"] == steps:
                    return
                assert time.monotonic() < deadline, f"progress with {steps} steps not uploaded: {work}"
                await asyncio.sleep(0.05)

        base = {"attempt_id": "w-a1", "samples": 0, "compute_seconds": 0.0, "input_wait_seconds": 0.0}
        write_work(out, {**base, "steps": 1})
        await uploaded(1)
        write_work(out, {**base, "steps": 7})
        await uploaded(7)
        write_work(out, {**base, "steps": 9, "done": True})
        agent.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(agent.communicate, timeout=60)
        assert agent.returncode == 0, err
        await uploaded(9)  # the final pass has it
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate(timeout=30)
