"""A queue's GPU-hour budget on the running system, at time scale 600 (docs/pipelines.md, "Budget").

One local cluster of 2 GPUs at 600 simulated seconds per real second, an admission policy whose
`metered` queue has a budget of 1 GPU-hour per 3 h (simulated: 18 real seconds), a real nats-server
and the four services. Workload `a` (1 GPU) runs one simulated hour (6 real seconds): 1 GPU-hour
of the workload's own clock. `b` (1 GPU, expected 30 min: ~0.5 GPU-hours) is submitted once `a`
has completed: it is held by the budget, with the numbers in `gpuorch explain`, and released
once the window has slid past half of `a`'s hour (15 real seconds after `a` stopped running).

Unscaled (before the budget counted one unit), `a` had spent 6 real seconds, 0.002 GPU-hours,
and `b` was released at once.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj
from gpuorch_proto import events as ev
from tests.support.system import one_node, registry, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

SCALE = 600  # simulated seconds per real second (the cluster's time_scale)
WINDOW = 3 * 3600  # the budget's window, simulated: 18 real seconds
USED = 3600  # a's simulated run time: 6 real seconds, 1 GPU-hour on 1 GPU
EXPECTED = 1800  # b's expected run time: 0.5 GPU-hours on 1 GPU

CLUSTERS = registry(one_node("solo", 2, cpu="16", memory="64Gi"), time_scale=SCALE, admission_policy="policy.yaml")

POLICY = {
    "queues": [
        {"name": "default"},
        {"name": "metered", "owners": ["*"], "budget": {"gpu_hours": 1, "window": f"{WINDOW}s"}},
    ],
    "default_queue": "default",
}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("e2e-budget"), clusters=CLUSTERS, policy=POLICY, env_extra={"GPUORCH_LOST_AFTER": "2"}) as s:
        yield s


# The job sleeps its run time (simulated seconds / the cluster's time scale) and writes its result.
WORK = (
    "import os, pathlib, time; time.sleep(float(os.environ['RUN_SECONDS']) / float(os.environ['GPUORCH_TIME_SCALE'])); "
    "d = pathlib.Path(os.environ['GPUORCH_OUTPUT_DIR']); d.mkdir(parents=True, exist_ok=True); (d / 'done').write_text('ok')"
)


def job(name: str, run: int, expected: int) -> Workload:
    return workload_from_obj({
        "metadata": {"name": name, "owner": "team-a"},
        "spec": {
            "image": "example.org/gpuorch/train@sha256:" + "5e" * 32,
            "command": ["python", "-c", WORK],
            "env": {"RUN_SECONDS": str(run)},
            "resources": {"gpus": 1, "gpu_memory_gib": 80, "cpu": "1", "memory": "1Gi"},
            "expected_runtime": f"{expected}s",
            "output": {"store": "prod"},
            "policy_queue": "metered",
        },
    })  # fmt: skip


def gpuorch(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "gpuorch"
    return subprocess.run(
        [str(cli), "--state", str(system.state_dir), *args], capture_output=True, text=True, timeout=60
    )


async def test_a_spent_budget_holds_work_with_the_reason_and_releases_it_as_the_window_slides(
    system: System, client: Client
) -> None:
    a = await client.submit(job("a", USED, EXPECTED))  # nothing spent yet: 0 + 0.5 fits 1
    assert (await client.wait(a, timeout=90)).status == "completed"
    ran = [e for _, e in await client.events(a) if isinstance(e, ev.Running | ev.Succeeded)]
    start, end = ran[0].at, ran[-1].at
    assert isinstance(ran[-1], ev.Succeeded) and end - start >= 0.6 * USED / SCALE, ran
    spent = (end - start) * SCALE / 3600  # a's GPU-hours by the router's accounting, simulated
    assert spent > 0.55, spent  # with b's 0.5, past the budget of 1

    b = await client.submit(job("b", 60, EXPECTED))

    async def held() -> ev.Held:
        got = [e for _, e in await client.events(b) if isinstance(e, ev.Held | ev.Released)]
        assert got, "no verdict on b yet"
        assert isinstance(got[0], ev.Held), f"b was released at once: {got[0].reason}"
        return got[0]

    h = await assert_eventually(held, timeout=10, interval=0.2)
    assert h.holds[0].kind == "budget" and h.holds[0].used == pytest.approx(spent, abs=0.05), h.holds
    assert h.reason.startswith("held: queue metered spent ") and h.reason.endswith(
        " of 1 GPU-hours in the last 3h, needs ~0.5"
    ), h.reason
    system.save()
    out = gpuorch(system, "explain", b)
    assert out.returncode == 0, out.stderr
    assert f"{b}: held — held: queue metered spent" in out.stdout and "queue metered: budget" in out.stdout, (
        out.stdout
    )

    # released once no more than 0.5 GPU-hours of a is inside the window: its last 3 real seconds
    v = await client.wait(b, timeout=60)
    assert v.status == "completed", v.reason
    released = next(e for _, e in await client.events(b) if isinstance(e, ev.Released))
    print(
        f"budget: a ran {end - start:.1f} s ({spent:.2f} GPU-hours), b held at +{h.at - end:.1f} s and released at +{released.at - end:.1f} s after a stopped"
    )
    slid = WINDOW / SCALE - (1 - EXPECTED / 3600) * 3600 / SCALE  # 18 - 3 = 15 s after a stopped
    assert released.at >= end + slid - 0.5, (released.at - end, slid)
    assert released.at <= end + slid + 15, (released.at - end, slid)
