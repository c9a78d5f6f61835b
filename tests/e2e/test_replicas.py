"""Replicas (issue 12 item 6): two routers, two dispatchers and two fencers run together.

About 30 workloads go through a system with two of each; one replica of each is killed with
SIGKILL while they are in flight. Every workload completes; the clusters saw exactly one Job per
attempt and one attempt per workload (the Jobs' own watch, through the official client, and the
event log agree); nothing is promoted twice; the invariants of `gpuorch.invariants` hold.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuorch.client import Client
from gpuorch.informer import Informer
from gpuorch.invariants import check
from gpuorch.kube import make_clients
from gpuorch.system import System, process_names
from gpuorch_proto import events as ev
from gpuorch_proto import k8s, type_tag
from tests.e2e.workloads import train
from tests.support.system import running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
N = 30


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A system with two routers, two dispatchers and two fencers (one inventory)."""
    with running(tmp_path_factory.mktemp("replicas"), HERE / "clusters.yaml", replicas=2,
                 env_extra={"GPUORCH_LOST_AFTER": "2", "GPUORCH_OWNER_TTL": "3"}) as s:  # fmt: skip
        yield s


class JobLog:
    """Every Job gpuorch created on a cluster, as the cluster's own watch reports it."""

    def __init__(self, system: System) -> None:
        self.lock = threading.Lock()
        self.uids: dict[tuple[str, str], set[str]] = defaultdict(set)  # (cluster, job name) -> uids seen
        self.labels: dict[tuple[str, str], dict[str, str]] = {}
        self.informers: list[Informer] = []
        for name, cc in make_clients(system.kubeconfig).items():
            inf = Informer(name, cc.batch.list_namespaced_job, namespace=k8s.NAMESPACE, label_selector=k8s.MANAGED_SELECTOR,
                           on_event=lambda kind, obj, c=name: self.seen(c, obj))  # fmt: skip
            self.informers.append(inf.start())

    def seen(self, cluster: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with self.lock:
            self.uids[(cluster, meta["name"])].add(meta["uid"])
            self.labels[(cluster, meta["name"])] = dict(meta.get("labels") or {})

    def present(self) -> dict[str, list[tuple[str, str]]]:
        """cluster -> (workload id, job name) of the Jobs still on it."""
        out: dict[str, list[tuple[str, str]]] = {}
        for inf in self.informers:
            out[inf.cluster] = [((j["metadata"].get("labels") or {}).get(k8s.LABEL_WORKLOAD, ""), j["metadata"]["name"]) for j in inf.items()]
        return out

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()


def test_process_names_of_a_replicated_system() -> None:
    assert process_names(1) == ["inventory", "router", "dispatcher", "fencer"]
    assert process_names(2) == ["inventory", "router", "router-1", "dispatcher", "dispatcher-1", "fencer", "fencer-1"]
    with pytest.raises(ValueError, match="replicas=0"):
        System(state_dir=Path("/nonexistent"), clusters_file=HERE / "clusters.yaml", replicas=0)


async def test_two_of_each_with_one_of_each_killed_mid_flight_no_duplicate_and_no_loss(system: System, client: Client) -> None:
    assert {"router-1", "dispatcher-1", "fencer-1"} <= set(system.procs), sorted(system.procs)
    jobs = JobLog(system)
    try:
        await assert_eventually(lambda: all(i.synced.is_set() for i in jobs.informers), timeout=30)
        gpus = {"gpus": 1, "gpu_memory_gib": 80, "cpu": "1", "memory": "4Gi"}
        wids = await asyncio.gather(*(client.submit(train(f"replica-{i}", steps=20, resources=gpus)) for i in range(N)))
        assert len(set(wids)) == N

        async def some_in_flight() -> bool:
            created = [w for w in wids if any(isinstance(e, ev.AttemptCreated) for _, e in await client.events(w))]
            return len(created) >= 8

        await assert_eventually(some_in_flight, timeout=120, interval=0.2)
        for victim in ("router-1", "dispatcher-1", "fencer-1"):  # one replica of each, mid-flight
            system.kill(victim)

        views = await asyncio.gather(*(client.wait(w, timeout=300) for w in wids))
        bad = [(v.workload_id, v.status, v.reason) for v in views if v.status != "completed"]
        assert not bad, bad

        events = await client.events()
        by_workload: dict[str, list[str]] = defaultdict(list)
        attempts: dict[str, set[str]] = defaultdict(set)
        for _, e in events:
            if e.workload_id in wids:
                by_workload[e.workload_id].append(type_tag(e))
                if isinstance(e, ev.AttemptCreated):
                    attempts[e.workload_id].add(e.attempt_id)
        for w in wids:
            kinds = by_workload[w]
            assert kinds.count("promoted") == 1, (w, kinds)
            assert kinds.count("completed") == 1, (w, kinds)
            assert kinds.count("routed") == 1 and kinds.count("attempt-created") == 1, (w, kinds)
            assert len(attempts[w]) == 1, (w, attempts[w])

        # the clusters: each attempt's Job was created once (one uid), for exactly the attempts in the log
        with jobs.lock:
            seen = {k: set(v) for k, v in jobs.uids.items()}
            labels = dict(jobs.labels)
        mine = {k: v for k, v in seen.items() if labels[k].get(k8s.LABEL_WORKLOAD) in wids}
        twice = {k: v for k, v in mine.items() if len(v) != 1}
        assert not twice, f"a Job created more than once: {twice}"
        on_clusters = sorted(labels[k][k8s.LABEL_ATTEMPT] for k in mine)
        in_log = sorted(a for w in wids for a in attempts[w])
        assert on_clusters == in_log, "one Job per attempt, and no Job the log does not know"

        async def no_jobs_left() -> bool:
            left = {c: [j for j in js if j[0] in wids] for c, js in jobs.present().items()}
            assert not any(left.values()), left
            return True

        await assert_eventually(no_jobs_left, timeout=60, interval=0.5)
        assert check(events, jobs=jobs.present()) == []
    finally:
        jobs.stop()


async def test_gpuorch_up_with_replicas_supervises_each_replica(tmp_path: Path) -> None:
    """`gpuorch up --replicas 2`: two of each replicated service, and a replica killed with -9 is
    restarted by the supervisor (recorded) like any service."""
    from tests.e2e.test_supervisor import gpuorch, pids, restart_of

    assert gpuorch(tmp_path / "bad", "up", "--replicas", "0").returncode == 2
    state = tmp_path / "up"
    out = gpuorch(state, "up", "--clusters", str(HERE / "clusters.yaml"), "--replicas", "2")
    assert out.returncode == 0, out.stderr + out.stdout
    try:
        running = pids(state)
        assert set(process_names(2)) <= set(running), sorted(running)
        old = running["fencer-1"]
        system = System.load(state)
        assert system.replicas == 2
        system.kill("fencer-1")
        await assert_eventually(lambda: restart_of(state, "fencer-1", old), timeout=60, interval=0.2)
        assert gpuorch(state, "restart", "router-1").returncode == 0, "a replica can be restarted by name"
    finally:
        gpuorch(state, "down", timeout=180)
        if (state / "system.json").exists():
            System.load(state).stop()
