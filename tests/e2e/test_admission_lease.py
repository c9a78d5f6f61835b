"""Admission leadership by lease (issue 29, item 4; docs/operations.md *Admission leadership*).

Two routers (and two dispatchers and fencers) on the seed's clusters and admission policy, a real
nats-server with the production permissions. A 200-trial sweep under a limit of 8 runs; mid-sweep
the router that holds the admission lease (read from the `admission` bucket) is killed with
SIGKILL and not restarted. The other takes the lease (a later term, its own `admission-term` in
the log) and releases the rest. From the event log: never more than 8 trials released and not
finished at once (nor attempts running), the limit reached before and after the kill; every trial
completes; the invariants hold.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuorch.client import Client
from gpuorch.invariants import check
from gpuorch.runtime import bus
from gpuorch.system import System
from gpuorch_proto import (
    ADMISSION_LEADER_KEY,
    AdmissionLease,
    decode_admission_lease,
    workload_from_obj,
    workload_to_builtins,
)
from gpuorch_proto import events as ev
from tests.e2e.test_pipelines import family, most_at_once, stage_ids, sweep
from tests.support.system import running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 8
TTL = 1.5  # seconds (GPUORCH_ADMISSION_TTL): renewed every 0.5 s, taken over within about 2 s of a death


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("lease"), ROOT / "deploy" / "local" / "clusters.yaml", replicas=2,
                 env_extra={"GPUORCH_ADMISSION_TTL": str(TTL), "GPUORCH_OWNER_TTL": "3", "GPUORCH_LOST_AFTER": "2"}) as s:  # fmt: skip
        yield s


@pytest.fixture
async def bucket(system: System) -> AsyncIterator[object]:
    """The admission bucket, read as the admin (no client identity may read a bucket)."""
    s = system.settings_as("admin")
    nc = await bus.connect_as(s, "test-admission-lease")
    try:
        yield await nc.jetstream().key_value(s.names.kv_admission)
    finally:
        await nc.close()


async def leader(bucket: object) -> AdmissionLease:
    entry = await bucket.get(ADMISSION_LEADER_KEY)  # type: ignore[attr-defined]
    return decode_admission_lease(entry.value)


def process_of(instance: str) -> str:
    """The embedded system's process name of router replica `instance`."""
    return "router" if instance == "0" else f"router-{instance}"


async def test_the_admission_leader_killed_mid_sweep_the_other_router_takes_over_within_the_limit(
    system: System, client: Client, bucket: object
) -> None:
    began = time.monotonic()
    doc = workload_to_builtins(sweep())
    doc["spec"]["limits"] = {"max_running": LIMIT}
    pid = await client.submit(workload_from_obj(doc))

    async def done(n: int) -> int:
        p, _ = await family(client, pid)
        k = sum(1 for v in p.workloads.values() if v.pipeline == pid and v.status == "completed")
        assert k >= n, k
        return k

    await assert_eventually(lambda: done(40), timeout=300, interval=0.5)
    first = await leader(bucket)
    victim = process_of(first.instance)
    assert victim in system.procs, (victim, sorted(system.procs))
    system.kill(victim)  # SIGKILL: no resignation, its lease has to run out
    killed_at = time.monotonic()

    async def taken_over() -> AdmissionLease:
        now = await leader(bucket)
        assert now.instance != first.instance and now.term > first.term, now
        return now

    second = await assert_eventually(taken_over, timeout=60, interval=0.1)
    took = time.monotonic() - killed_at
    final = await client.wait(pid, timeout=900)
    wall = time.monotonic() - began

    p, _ = await family(client, pid)
    trials = stage_ids(p, pid)
    assert len(trials) == 200
    finished = [w for w in trials.values() if (v := p.get(w)) is not None and v.status == "completed"]
    assert final.status == "completed" and len(finished) == 200, (final.status, final.reason, len(finished))

    log = await client.events()
    ids = set(trials.values())
    markers = [(seq, e) for seq, e in log if isinstance(e, ev.AdmissionTerm)]
    assert {e.instance for _, e in markers} >= {first.instance, second.instance}, markers
    their = next(seq for seq, e in markers if e.instance == second.instance and e.term == second.term)
    after = [seq for seq, e in log if isinstance(e, ev.Released) and e.workload_id in ids and seq > their]
    assert after, "the survivor released trials in its term"
    most_released, most_running = most_at_once(log, ids)
    assert most_released == LIMIT, most_released  # reached, and never passed
    assert 1 <= most_running <= LIMIT, most_running
    assert most_at_once(log, ids, until=their)[0] == LIMIT, "the limit was reached before the takeover too"
    assert check(log) == [], "the invariants"
    print(f"\nadmission lease e2e: 200 trials, limit {LIMIT}, leader router {first.instance} (term {first.term}) killed, "
          f"router {second.instance} took term {second.term} {took:.1f} s later; wall {wall:.1f} s")  # fmt: skip
