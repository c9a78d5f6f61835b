"""Placement policies compared by the simulator (docs/simulation.md, "Policies").

Every policy sees the same world: the snapshots inventory would publish (at most
`World.snapshot_interval` old), and the router's own hard-eligibility verdicts (no policy sends a
job where the router would reject it: a baseline that ignored eligibility would only look worse).

* `gpuorch`: the router, unchanged: `gpuorch_router.core.decide` (what the router service calls,
  through the replay's own `RoutingMemo`) over `SnapshotIndex`es of those snapshots.
* `emptiest`: the eligible cluster with the most free GPUs in its snapshot.
* `round-robin`: the next eligible cluster in name order after the previous pick.
* `random`: a seeded uniform choice among the eligible.
* `cost-only`: the lowest estimated cost: GPUs x declared run time on the cluster's slowest suitable
  GPU x price per GPU-hour.
* `data-locality`: where the input is (a local replica or a cached copy; among several, the most
  free GPUs); else the best link from a replica; no input: as `emptiest`.
* `clairvoyant`: knows every true run time and so the exact future of every queue (admission is
  strict FIFO, so later arrivals cannot change it); puts each job where its true completion time is
  earliest. A bound for greedy online placement, not a global optimum (it never delays one job to
  help a later one).

Ties are broken by cluster name. Pure: time and randomness are arguments.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .generator import SimJob
from .model import ClusterModel


@dataclass(frozen=True)
class Choice:
    cluster: int | None  # index into the world's clusters; None: not now (see `outcome`)
    outcome: str = "routed"  # routed | waiting | rejected
    reason: str = ""


class Context(Protocol):
    @property
    def models(self) -> Sequence[ClusterModel]: ...
    @property
    def rng(self) -> random.Random: ...

    def eligible(self, job: SimJob) -> tuple[tuple[int, ...], str]: ...
    def free_view(self, i: int) -> int: ...
    def decide(self, job: SimJob, now: float) -> Choice: ...
    def true_completion(self, job: SimJob, i: int, now: float) -> float: ...


Policy = Callable[[SimJob, Context, float], Choice]


def _among(job: SimJob, ctx: Context, key: Callable[[int], tuple[float, ...]]) -> Choice:
    elig, why = ctx.eligible(job)
    if not elig:
        return Choice(None, "rejected", why)
    return Choice(min(elig, key=lambda i: (*key(i), ctx.models[i].name)))


def gpuorch(job: SimJob, ctx: Context, now: float) -> Choice:
    return ctx.decide(job, now)


def emptiest(job: SimJob, ctx: Context, now: float) -> Choice:
    return _among(job, ctx, lambda i: (-ctx.free_view(i),))


class RoundRobin:
    def __init__(self) -> None:
        self.last = ""  # name of the previous pick

    def __call__(self, job: SimJob, ctx: Context, now: float) -> Choice:
        elig, why = ctx.eligible(job)
        if not elig:
            return Choice(None, "rejected", why)
        order = sorted(elig, key=lambda i: ctx.models[i].name)
        pick = next((i for i in order if ctx.models[i].name > self.last), order[0])
        self.last = ctx.models[pick].name
        return Choice(pick)


def random_choice(job: SimJob, ctx: Context, now: float) -> Choice:
    elig, why = ctx.eligible(job)
    if not elig:
        return Choice(None, "rejected", why)
    return Choice(ctx.rng.choice(sorted(elig, key=lambda i: ctx.models[i].name)))


def cost_only(job: SimJob, ctx: Context, now: float) -> Choice:
    def cost(i: int) -> tuple[float, ...]:
        m = ctx.models[i]
        suitable = m.suitable(*job.node_demand)
        return (job.gpus * job.declared_run / m.slowest_speed(suitable) * m.spec.registry.price_per_gpu_hour,)

    return _among(job, ctx, cost)


def data_locality(job: SimJob, ctx: Context, now: float) -> Choice:
    ds = job.dataset
    if ds is None:
        return emptiest(job, ctx, now)

    def key(i: int) -> tuple[float, ...]:
        m = ctx.models[i]
        here = ds.ref in m.cached or bool(m.local.intersection(ds.locations)) or m.cache_ready.get(ds.ref, float("inf")) <= now
        bw = max((m.spec.registry.bandwidth_mbps.get(loc, 0.0) for loc in ds.locations), default=0.0)
        return (0.0 if here else 1.0, 0.0 if here else -bw, -ctx.free_view(i))

    return _among(job, ctx, key)


def clairvoyant(job: SimJob, ctx: Context, now: float) -> Choice:
    return _among(job, ctx, lambda i: (ctx.true_completion(job, i, now),))


def make_policy(name: str) -> Policy:
    table: dict[str, Callable[[], Policy]] = {
        "gpuorch": lambda: gpuorch,
        "emptiest": lambda: emptiest,
        "round-robin": RoundRobin,
        "random": lambda: random_choice,
        "cost-only": lambda: cost_only,
        "data-locality": lambda: data_locality,
        "clairvoyant": lambda: clairvoyant,
    }
    if name not in table:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
    return table[name]()


POLICIES = ("gpuorch", "emptiest", "round-robin", "random", "cost-only", "data-locality", "clairvoyant")
