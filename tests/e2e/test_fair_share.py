"""Fair share across all clusters, end to end (issue 13, item 5; docs/pipelines.md, "Fair share").

Two local clusters of 4 GPUs each (8 in all), the admission policy of
`examples/pipelines/fair-share.yaml` with its limit scaled to these 8 GPUs, a real nats-server with
the generated permissions, the four services, and two client identities that may each submit only
as their own owner (`vision` as vision-team, `nlp` as nlp-team). Owner vision-team submits a sweep
of 1-GPU trials first, and holds all 8 GPUs; nlp-team then submits 2-GPU jobs. Each owner wants
more than the clusters hold. Over the contended run (from the first submit until the first owner
has nothing left waiting) the two get GPU-seconds within 10 % of each other.

The same two owners, the same work, on a queue with the same limit and no `fair_share`: first come,
first served, nlp-team gets (almost) nothing until vision-team's sweep has all started. So the
measure can fail.

Each owner's GPU-seconds are taken from the lifecycle events by the router's own accounting
(`fairshare.uses_of`, `resource_seconds`: running -> finished or confirmed gone, the workload's
requested GPUs), clipped to the contended run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from gpuorch.client import Client
from gpuorch.projection import Projection, WorkloadView
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj
from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_router import fairshare
from tests.support.system import one_node, registry, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipelines" / "fair-share.yaml"
GPUS = 8  # both clusters together
SCALE = 600  # simulated seconds per real second (the clusters' time_scale)
RUN = 4800  # each job's simulated run time: 8 real seconds (long against start-up noise on a loaded machine)
TRIALS = 32  # vision-team: 32 1-GPU trials (32 GPU-runs, four times what the clusters hold)
JOBS = 16  # nlp-team: 16 2-GPU jobs (also 32 GPU-runs)
OWNERS = {"vision": "vision-team", "nlp": "nlp-team"}  # client identity -> the one owner it may submit as

CLUSTERS = registry(one_node("east", 4), one_node("west", 4), time_scale=SCALE, admission_policy="policy.yaml")


def policy() -> AdmissionPolicy:
    """The example's policy, its limits scaled to the 8 GPUs here (so that work waits in the gate,
    where fair share decides, not in a cluster's queue), and a `fifo` queue that is the same
    without fair share."""
    p = load_policy_yaml(EXAMPLE.read_text())
    research = p.queue("research")
    assert research is not None and research.fair_share is not None
    fs = research.fair_share
    assert fairshare.weight(fs, OWNERS["vision"]) == fairshare.weight(fs, OWNERS["nlp"]), "the example's weights are equal"
    limits = msgspec.structs.replace(research.limits, max_gpus=GPUS)
    fair = msgspec.structs.replace(research, limits=limits)
    fifo = msgspec.structs.replace(fair, name="fifo", fair_share=None)
    organisation = msgspec.structs.replace(p.organisation, max_gpus=2 * GPUS)  # the queues' limits bind
    return msgspec.structs.replace(p, organisation=organisation, queues=[*(q for q in p.queues if q.name != "research"), fair, fifo])


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(
        tmp_path_factory.mktemp("e2e-fair"), clusters=CLUSTERS, policy=msgspec.to_builtins(policy()),
        clients={i: [o] for i, o in OWNERS.items()}, env_extra={"GPUORCH_LOST_AFTER": "2"},
    ) as s:  # fmt: skip
        yield s


# Each job sleeps its run time (simulated seconds / the clusters' time scale) and writes its result.
WORK = (
    "import os, pathlib, time; time.sleep(float(os.environ['RUN_SECONDS']) / float(os.environ['GPUORCH_TIME_SCALE'])); "
    "d = pathlib.Path(os.environ['GPUORCH_OUTPUT_DIR']); d.mkdir(parents=True, exist_ok=True); (d / 'done').write_text('ok')"
)


def job(name: str, owner: str, queue: str, gpus: int, **spec: object) -> Workload:
    return workload_from_obj({
        "metadata": {"name": name, "owner": owner},
        "spec": {
            "image": "example.org/gpuorch/train@sha256:" + "5e" * 32,
            "command": ["python", "-c", WORK],
            "env": {"RUN_SECONDS": str(RUN)},
            "resources": {"gpus": gpus, "gpu_memory_gib": 80, "cpu": "1", "memory": "1Gi"},
            "expected_runtime": f"{RUN}s",
            "output": {"store": "prod"},
            "policy_queue": queue,
            **spec,
        },
    })  # fmt: skip


def sweep(queue: str) -> Workload:
    """vision-team's sweep: TRIALS 1-GPU trials of one pipeline, no limit of its own."""
    return job(f"sweep-{queue}", OWNERS["vision"], queue, 1, sweep={"grid": {"seed": list(range(TRIALS))}})


@dataclass
class Live:
    """Every event of the stream folded as it arrives (one consumer, not a replay per poll)."""

    projection: Projection

    def workloads(self, owner: str, queue: str) -> list[WorkloadView]:
        """The owner's workloads in the queue that run (a pipeline's trials, not the pipeline)."""
        return [
            v
            for v in self.projection.workloads.values()
            if v.workload is not None and v.workload.metadata.owner == owner
            and v.workload.spec.policy_queue == queue and not v.children and v.workload.spec.sweep is None
        ]  # fmt: skip


@contextlib.asynccontextmanager
async def live(client: Client) -> AsyncIterator[Live]:
    out = Live(Projection())

    async def fold() -> None:
        async for seq, e in client.follow():
            out.projection.apply(e, seq)

    task = asyncio.create_task(fold())
    try:
        yield out
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def started(v: WorkloadView) -> float | None:
    """When the workload's first attempt began running (None: not yet)."""
    times = [a.times["running"] for a in v.attempts.values() if "running" in a.times]
    return min(times) if times else None


def gpu_seconds(views: list[WorkloadView], policy: AdmissionPolicy, since: float, until: float) -> dict[str, float]:
    """Each owner's GPU-seconds inside `(since, until]`, as the router's fair share counts use
    (`fairshare.uses_of`: every attempt from `running` to finished or confirmed gone, the
    workload's requested GPUs; `resource_seconds` over that window). Every attempt counted must
    have ended: a running one would add what it is committed to."""
    out: dict[str, float] = {}
    for u in fairshare.uses_of(views, policy):
        assert u.end is not None, f"an attempt of {u.owner} has not ended"
        out[u.owner] = out.get(u.owner, 0.0) + fairshare.resource_seconds(u, until - since, 0.0, until).gpus
    return out


@dataclass
class Run:
    gpu_seconds: dict[str, float]  # each owner's, over the contended run
    contended: float  # seconds, from the first submit until the first owner has nothing left waiting
    first_to_run_out: str
    clusters: dict[str, set[str]]  # where each owner's work ran

    @property
    def spread(self) -> float:
        a, b = self.gpu_seconds.values()
        return abs(a - b) / max(a, b)

    def __str__(self) -> str:
        used = ", ".join(f"{o} {g:.1f}" for o, g in self.gpu_seconds.items())
        return f"GPU-seconds {used} ({self.spread:.1%} apart) over {self.contended:.1f} s; {self.first_to_run_out} ran out first"


async def contend(system: System, queue: str) -> Run:
    """vision-team submits its sweep; once its work has taken every GPU, nlp-team submits its
    jobs. When the first owner has nothing left waiting, everything left is cancelled; once all
    of it has ended, each owner's GPU-seconds over the contended run."""
    s = system.settings
    counts = {OWNERS["vision"]: TRIALS, OWNERS["nlp"]: JOBS}
    async with (
        Client(s.nats_url, s.names, creds=system.creds("vision")) as vision,
        Client(s.nats_url, s.names, creds=system.creds("nlp")) as nlp,
        live(vision) as seen,
    ):
        pipeline = await vision.submit(sweep(queue))

        def started_gpus(owner: str) -> float:
            return sum(fairshare.demand_of(v.workload).gpus for v in seen.workloads(owner, queue) if v.workload and started(v))

        await assert_eventually(lambda: started_gpus(OWNERS["vision"]) >= GPUS, timeout=90, interval=0.2,
                                message=lambda: f"vision-team's started work holds {started_gpus(OWNERS['vision'])} GPUs")  # fmt: skip
        jobs = [await nlp.submit(job(f"nlp-{queue}-{i:02d}", OWNERS["nlp"], queue, 2)) for i in range(JOBS)]

        def ran_out() -> str | None:
            """The first owner all of whose workloads have started: nothing left waiting."""
            for owner, n in counts.items():
                views = seen.workloads(owner, queue)
                if len(views) == n and all(started(v) is not None for v in views):
                    return owner
            return None

        first = await assert_eventually(ran_out, timeout=240, interval=0.2,
                                        message=lambda: f"started: { {o: sum(started(v) is not None for v in seen.workloads(o, queue)) for o in counts} }")  # fmt: skip
        assert first is not None
        t_end = max(started(v) or 0.0 for v in seen.workloads(first, queue))
        await vision.cancel(pipeline, "the contended run is over")
        for wid in jobs:
            await nlp.cancel(wid, "the contended run is over")

        def everything_ended() -> list[WorkloadView]:
            views = [v for o in counts for v in seen.workloads(o, queue)]
            unended = [v.workload_id for v in views if not v.terminal or any(a.live for a in v.attempts.values())]
            assert not unended, f"not ended yet: {unended}"
            return views

        views = await assert_eventually(everything_ended, timeout=120, interval=0.2)
        t0 = seen.projection.workloads[pipeline].times["submitted"]
        used = gpu_seconds(views, policy(), t0, t_end)
        clusters = {o: {a.cluster for v in views if v.workload.metadata.owner == o for a in v.attempts.values()} for o in counts}  # type: ignore[union-attr]
        return Run({o: used.get(o, 0.0) for o in counts}, t_end - t0, first, clusters)


async def test_equal_weights_get_gpu_seconds_within_10_percent_across_both_clusters(system: System) -> None:
    run = await contend(system, "research")
    print(f"fair share: {run}")
    assert run.contended > 4 * RUN / SCALE, run  # several generations of jobs, not one
    assert all(c == {"east", "west"} for c in run.clusters.values()), run.clusters  # one share over both clusters
    assert run.spread <= 0.10, str(run)


async def test_without_fair_share_the_same_run_is_not_fair(system: System) -> None:
    """The same run first come, first served: nlp-team waits until vision-team's sweep has all
    started, so the measure above fails by far."""
    run = await contend(system, "fifo")
    print(f"first come, first served: {run}")
    assert run.first_to_run_out == OWNERS["vision"], str(run)
    assert run.spread > 0.5, str(run)
