"""One simulated schedule: a world drawn from a seed, the four services' real cores, faults, a check.

``run(seed)`` draws everything from one ``random.Random(seed)``: the clusters (names, node groups,
GPU models and memory labels as GPU Feature Discovery reports them, pools, taints, registry
entries), the workloads (shape, constraints, fencing policy, lease, retry budget, run time, failure
rate), the client's actions (submits, a re-sent submit, cancels), the faults (partitions, slow
APIs, node loss, capacity changes, service crashes) and the interleaving of every step. The same
seed gives the same steps, the same log and the same verdict.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuorch.invariants import Violation, check, check_limits, check_manifests, check_waits
from gpuorch.projection import Projection
from gpuorch_proto import ClusterRegistryEntry, Workload, workload_from_obj, workload_id_for
from gpuorch_proto import events as ev
from gpuorch_proto.inventory import QueueRegistry
from gpuorch_proto.k8s import LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT, LABEL_POOL, LABEL_WORKLOAD
from gpuorch_proto.policy import DEFAULT_QUEUE, AdmissionPolicy, QueuePolicy
from gpuorch_proto.storage import Manifest
from gpuorch_proto.validate import validate_workload
from gpuorch_proto.workload import Limits

from .checks import check_owners
from .cluster import SimCluster, SimNode
from .runtime import Gen, Sleep, Task
from .shells import DispatcherSim, FencerSim, InventorySim, RouterSim, Service, consumers_for
from .world import EPOCH0, World

DIGEST = "example.org/gpuorch/train@sha256:" + "d5" * 32
GPU_MODELS = [
    ("NVIDIA-A100-SXM4-80GB", 81920),
    ("NVIDIA-A100-SXM4-40GB", 40960),
    ("NVIDIA-H100-80GB-HBM3", 81559),
    ("NVIDIA-L4", 23034),
    ("Tesla-T4", 15360),
    ("NVIDIA-A10G", 23028),
]
CLUSTER_NAMES = ["alpha", "beta", "gamma", "eu-west-1", "us-east-2", "onprem-a", "lab", "spot-pool"]
SERVICES = ["router", "dispatcher-0", "dispatcher-1", "fencer", "inventory"]
FAULT_KINDS = ("partition", "slow-api", "node-loss", "capacity", "crash")
STALL_P = 0.25  # schedules in which a dispatcher stalls (its process stopped, a long pause) for 2-15 s
FAULT_END = 45.0  # virtual seconds after the start: every fault is healed by then
HORIZON = 900.0  # virtual seconds: a schedule that has not settled by then is judged as it is
MAX_STEPS = 60_000
LIMITS_P = 0.3  # schedules whose admission policy has a limit (drawn apart: the seed's world stays as it was)
CACHE_LAG_P = 0.5  # schedules whose dispatchers' Job caches see a create late (0.2-2 s; drawn apart too)


@dataclass
class Plan:
    """What happens to the world, at virtual seconds after the start."""

    at: float
    kind: str  # submit | resubmit | cancel | partition | heal | slow-api | fast-api | node-loss | capacity | crash | restart | stall
    target: str = ""
    arg: Any = None


@dataclass
class Result:
    seed: int
    violations: list[Violation]
    faults: Counter[str]
    steps: int
    virtual_seconds: float
    events: int
    workloads: int
    settled: bool
    trace: list[str] | None = None
    loop_errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- world


def make_clusters(rng: random.Random) -> tuple[dict[str, SimCluster], dict[str, ClusterRegistryEntry]]:
    names = sorted(rng.sample(CLUSTER_NAMES, rng.choice([2, 2, 3])))
    clusters: dict[str, SimCluster] = {}
    registry: dict[str, ClusterRegistryEntry] = {}
    for name in names:
        nodes: dict[str, SimNode] = {}
        for g in range(rng.choice([1, 1, 2])):
            model, mib = rng.choice(GPU_MODELS)
            gpus = rng.choice([1, 2, 4, 4, 8])
            pool = rng.choice(["train", "train", "infer"])
            taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}] if rng.random() < 0.15 else []
            for i in range(rng.choice([1, 1, 2, 3])):
                n = f"{name}-g{g}-{i}"
                labels = {
                    "kubernetes.io/hostname": n, LABEL_POOL: pool, LABEL_GPU_PRODUCT: model,
                    LABEL_GPU_MEMORY: str(mib), LABEL_GPU_COUNT: str(gpus),
                }
                nodes[n] = SimNode(n, labels, gpus, taints=list(taints))
        clusters[name] = SimCluster(name, nodes, startup=rng.uniform(0.5, 3.0))
        stores = ["prod", "scratch"] if rng.random() < 0.85 else ["scratch"]
        registry[name] = ClusterRegistryEntry(
            price_per_gpu_hour=round(rng.uniform(1.0, 4.0), 2),
            artifact_stores=stores,
            checkpoint_stores=stores,
            connections=["wandb"] if rng.random() < 0.8 else [],
            data_locations=[f"{name}-nfs"],
            bandwidth_mbps={f"{o}-nfs": 1000.0 for o in names if o != name},
            queues=[QueueRegistry(name="default")],
            startup_seconds=round(rng.uniform(5, 60)),
        )
    return clusters, registry


def make_workload(i: int, rng: random.Random, clusters: dict[str, SimCluster], registry: dict[str, ClusterRegistryEntry]) -> Workload:
    """Mostly shaped to fit some node of some cluster (as teams do), sometimes anything at all."""
    seconds = round(rng.uniform(3, 30), 1)
    home = rng.choice(sorted(clusters))
    nodes = sorted(clusters[home].nodes.values(), key=lambda n: n.name)
    fit = nodes[rng.randrange(len(nodes))] if nodes and rng.random() < 0.85 else None
    res: dict[str, Any] = {"cpu": "2", "memory": "8Gi"}
    req: dict[str, Any] = {}
    stores = registry[home].artifact_stores
    if fit is not None:
        res["gpus"] = rng.choice([g for g in (1, 2, 4, 8) if g <= fit.gpus])
        mib = int(fit.labels[LABEL_GPU_MEMORY])
        mem = rng.choice([None, None, *(m for m in (16, 40, 80) if m * 1024 * 0.98 <= mib)])
        model = fit.labels[LABEL_GPU_PRODUCT]
        acc = rng.choice([None, None, next(t for t in ("A100", "H100", "L4", "T4", "A10G") if t in model)])
        if rng.random() < 0.3:
            req["pools"] = [fit.labels[LABEL_POOL]]
        if fit.taints or rng.random() < 0.2:
            req["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
        if "wandb" in registry[home].connections and rng.random() < 0.2:
            req["connections"] = ["wandb"]
        if rng.random() < 0.15 and fit.gpus >= 2 * res["gpus"]:
            res["workers"] = 2
    else:
        res["gpus"] = rng.choice([1, 2, 4, 8])
        mem = rng.choice([None, 16, 40, 80])
        acc = rng.choice([None, "A100", "H100", "L4"])
        if rng.random() < 0.5:
            req["pools"] = [rng.choice(["train", "infer"])]
        if rng.random() < 0.3:
            res["workers"] = 2
    if mem:
        res["gpu_memory_gib"] = mem
    if acc:
        res["accelerators"] = [acc]
    store = rng.choice(stores)
    obj = {
        "metadata": {"name": f"sim-{i}", "owner": rng.choice(["ml", "research"])},
        "spec": {
            "image": DIGEST,
            "command": ["python", "-m", "train"],
            "env": {"SIM_SECONDS": f"{seconds:g}", "SIM_FAIL": str(rng.choice([0, 0, 0, 0.2, 0.5]))},
            "inputs": [{"ref": f"data{i}@v1", "size_gb": rng.choice([1, 10]), "locations": [f"{home}-nfs"]}],
            "resources": res,
            "requirements": req,
            "expected_runtime": f"{seconds:g}s",
            "checkpoint": {"path": "ckpt", "portable": rng.random() < 0.6, "store": store},
            "output": {"store": store},
            "fencing": rng.choice(["strict", "fast"]),
            "lease": rng.choice(["10s", "20s", "40s"]),
            "retry": {"budget": rng.choice([1, 2, 3]), "backoff": rng.choice(["1s", "2s", "5s"])},
            # preemption (issue 13): half the workloads are interruptible work of priority 0, a quarter
            # have priority 5 and may preempt them (by index: the world's random draws stay as they were)
            "preemptible": i % 4 in (0, 1),
            "priority": 5 if i % 4 == 2 else 0,
        },
    }
    wl = workload_from_obj(obj)
    assert not validate_workload(wl), validate_workload(wl)
    return wl


def make_plan(rng: random.Random, clusters: dict[str, SimCluster], n_workloads: int, faults: int) -> list[Plan]:
    plan = [Plan(round(rng.uniform(0, 15), 3), "submit", str(i)) for i in range(n_workloads)]
    if rng.random() < 0.15:
        plan.append(Plan(round(rng.uniform(0, 30), 3), "resubmit", str(rng.randrange(n_workloads))))
    for i in range(n_workloads):
        if rng.random() < 0.2:
            plan.append(Plan(round(rng.uniform(0, 45), 3), "cancel", str(i)))
    names = sorted(clusters)
    for _ in range(faults):
        kind = rng.choice(FAULT_KINDS)
        t = round(rng.uniform(1, FAULT_END - 15), 3)
        c = rng.choice(names)
        if kind == "partition":
            away = rng.uniform(0.5, 2.5) if rng.random() < 0.25 else rng.uniform(4, 40)
            plan += [Plan(t, "partition", c), Plan(min(FAULT_END, t + away), "heal", c)]
        elif kind == "slow-api":
            plan += [Plan(t, "slow-api", c, rng.choice([0.5, 2.0, 6.0])), Plan(min(FAULT_END, t + rng.uniform(2, 20)), "fast-api", c)]
        elif kind == "node-loss":
            node = rng.choice(sorted(clusters[c].nodes)) if clusters[c].nodes else ""
            plan.append(Plan(t, "node-loss", c, node))
            if rng.random() < 0.6:
                plan.append(Plan(min(FAULT_END, t + rng.uniform(3, 30)), "capacity", c, node))
        elif kind == "capacity":
            plan.append(Plan(t, "capacity", c, ""))
        else:
            svc = rng.choice(SERVICES)
            plan += [Plan(t, "crash", svc), Plan(t + rng.choice([0.0, 0.5, 3.0, 10.0]), "restart", svc)]
    plan.sort(key=lambda p: p.at)  # stable: equal times keep the order drawn
    return plan


def admission_policy(rng: random.Random) -> AdmissionPolicy:
    """The policy the router admits by: in `LIMITS_P` of the schedules a `max_running` of 1 or 2
    for the organisation or the default queue (the workloads beyond it are held until one ends)."""
    if rng.random() >= LIMITS_P:
        return AdmissionPolicy()
    limits = Limits(max_running=rng.choice([1, 2]))
    if rng.random() < 0.5:
        return AdmissionPolicy(organisation=limits)
    return AdmissionPolicy(queues=[QueuePolicy(name=DEFAULT_QUEUE, limits=limits)])


# ---------------------------------------------------------------------------------------- engine


Mutation = Callable[[], Any]


class Simulation:
    def __init__(self, seed: int, *, trace: bool = False, workloads: int | None = None, faults: int | None = None) -> None:
        self.seed = seed
        rng = random.Random(seed)
        self.rng = random.Random(rng.getrandbits(64))  # the interleaving
        gen = random.Random(rng.getrandbits(64))  # the world
        clusters, registry = make_clusters(gen)
        self.w = World(random.Random(rng.getrandbits(64)), clusters, registry, trace=[] if trace else None)
        for c in clusters.values():
            c.checkpoints = self.w.checkpoints
        n = workloads if workloads is not None else gen.choice([1, 2, 2, 3, 4])
        self.workloads = [make_workload(i, gen, clusters, registry) for i in range(n)]
        self.keys = [f"sim-{seed}-{i}" for i in range(n)]
        self.wids = [workload_id_for(k, wl.metadata.name) for k, wl in zip(self.keys, self.workloads, strict=True)]
        self.plan = make_plan(gen, clusters, n, faults if faults is not None else gen.choice([0, 1, 2, 3, 4, 5]))
        stalls = random.Random(f"stall-{seed}")  # its own draws: the seed's other faults stay as they were
        if (faults is None or faults > 0) and stalls.random() < STALL_P:
            at, svc = round(stalls.uniform(1, FAULT_END - 15), 3), stalls.choice(["dispatcher-0", "dispatcher-1"])
            self.plan.append(Plan(at, "stall", svc, round(stalls.uniform(2, 15), 3)))
            self.plan.sort(key=lambda p: p.at)
        self.w.policy = admission_policy(random.Random(f"admission-{seed}"))  # own draws: the world stays as it was
        lags = random.Random(f"cache-{seed}")
        self.w.cache_lag = round(lags.uniform(0.2, 2.0), 3) if lags.random() < CACHE_LAG_P else 0.0
        self.consumers = consumers_for(self.w)
        self.tasks: list[Task] = []
        self.services: dict[str, Service] = {}
        self.faults: Counter[str] = Counter()
        self.projection = Projection()
        self.folded = 0
        self.steps = 0
        self.spare_nodes = 0
        self.wait_violations: dict[tuple[str, str], Violation] = {}
        self.healed = False
        self.healed_at = 0.0

    # --- services --------------------------------------------------------------------------
    def boot(self, name: str) -> None:
        w, c = self.w, self.consumers
        svc: Service
        if name == "router":
            svc = RouterSim(w, name, c["router"])
        elif name.startswith("dispatcher-"):
            svc = DispatcherSim(w, name, name.rsplit("-", 1)[1], {**c["dispatcher"], **c[name]})
        elif name == "fencer":
            svc = FencerSim(w, name, c["fencer"])
        else:
            svc = InventorySim(w, name)
        self.services[name] = svc
        svc.spawn("start", svc.start())
        w.log("sim", f"start {name}")

    def crash(self, name: str) -> None:
        svc = self.services.pop(name, None)
        if svc is None:
            return
        svc.alive = False
        for t in svc.tasks:
            t.alive = False
            t.gen.close()
        svc.tasks.clear()
        for group in self.consumers.values():
            for cons in group.values():
                cons.release(svc, self.w.now)
        if isinstance(svc, RouterSim):
            self.w.inv.consumers.remove(svc.inv)

    # --- the client and the faults -------------------------------------------------------------
    def chaos(self) -> Gen:
        w = self.w
        for p in self.plan:
            yield Sleep(EPOCH0 + p.at)
            cl = w.clusters.get(p.target)
            w.log("chaos", f"{p.kind} {p.target} {p.arg if p.arg is not None else ''}".rstrip())
            if p.kind == "submit":
                i = int(p.target)
                w.publish(ev.Submit(workload=self.workloads[i], idempotency_key=self.keys[i]), "client")
            elif p.kind == "resubmit":  # the same workload again, past JetStream's de-duplication
                i = int(p.target)
                w.publish(ev.Submit(event_id=f"resend-{self.keys[i]}", workload_id=self.wids[i], workload=self.workloads[i], idempotency_key=self.keys[i]), "client")
            elif p.kind == "cancel":
                w.publish(ev.Cancel(event_id=f"cancel-{self.wids[int(p.target)]}", workload_id=self.wids[int(p.target)], reason="user"), "client")
            elif p.kind == "partition" and cl is not None:
                cl.partitioned = True
                self.faults["partition"] += 1
            elif p.kind == "heal" and cl is not None:
                cl.partitioned = False
            elif p.kind == "slow-api" and cl is not None:
                cl.latency = float(p.arg)
                self.faults["slow-api"] += 1
            elif p.kind == "fast-api" and cl is not None:
                cl.latency = 0.0
            elif p.kind == "node-loss" and cl is not None:
                hit = cl.lose_node(str(p.arg), w.now)
                self.faults["node-loss"] += 1
                w.log("chaos", f"node {p.arg} lost; pods failed: {hit}")
            elif p.kind == "capacity" and cl is not None:
                self.add_capacity(cl, str(p.arg))
            elif p.kind == "crash":
                self.faults["crash"] += 1
                self.crash(p.target)
            elif p.kind == "stall" and p.target in self.services:
                # none of its tasks runs until then, wherever each one is (a stopped process)
                self.services[p.target].stalled_until = w.now + float(p.arg)
                self.faults["stall"] += 1
                w.log("chaos", f"{p.target} stalls for {float(p.arg):g}s")
            elif p.kind == "restart" and p.target not in self.services:
                self.boot(p.target)
        for name in SERVICES:  # heal everything
            if name not in self.services:
                self.boot(name)
        for cl in w.clusters.values():
            cl.partitioned, cl.latency = False, 0.0
        self.healed, self.healed_at = True, w.now

    def add_capacity(self, cl: SimCluster, back: str) -> None:
        """A node comes back (`back`), or a new one like an existing one joins."""
        self.faults["capacity"] += 1
        like = next(iter(cl.nodes.values()), None)
        if like is None:
            return
        self.spare_nodes += 1
        name = back if back and back not in cl.nodes else f"{cl.name}-extra-{self.spare_nodes}"
        labels = {**like.labels, "kubernetes.io/hostname": name}
        gpus = like.gpus if back else self.w.rng.choice([like.gpus, max(1, like.gpus // 2), like.gpus * 2])
        labels[LABEL_GPU_COUNT] = str(gpus)
        cl.add_node(SimNode(name, labels, gpus, taints=list(like.taints)))

    # --- stepping -------------------------------------------------------------------------------
    def step(self, t: Task) -> None:
        self.steps += 1
        try:
            t.wait = t.gen.send(None)
        except StopIteration:
            t.alive = False
        except Exception as exc:
            t.alive = False
            self.w.loop_errors.append(f"{t.name} {type(exc).__name__}: {exc}")
            self.w.log(t.name, f"task died: {type(exc).__name__}: {exc}")
            if t.name.endswith(".start") and isinstance(t.owner, Service):
                # the real service's run() raises: the process exits and its supervisor restarts it
                name = t.owner.name
                self.crash(name)
                self.w.spawned.append(Task(f"supervisor.{name}", self, self.restart_later(name, 1.0)))

    def restart_later(self, name: str, delay: float) -> Gen:
        yield Sleep(self.w.now + delay)
        if name not in self.services:
            self.boot(name)

    def fold(self) -> None:
        msgs = self.w.evt.msgs
        while self.folded < len(msgs):
            m = msgs[self.folded]
            self.projection.apply(m.data, m.seq)
            self.folded += 1

    def settled(self) -> bool:
        """Every fault healed, every workload terminal (or waiting with nothing in flight), the
        consumers drained and no Job of a finished workload left on a cluster."""
        w = self.w
        if not self.healed:
            return False
        self.fold()
        waiting = False
        for wid in self.wids:
            v = self.projection.get(wid)
            if v is None:
                return False
            if not v.terminal:
                if v.status != "waiting":
                    return False
                waiting = True
        for group in self.consumers.values():
            for c in group.values():
                if c.pending or c.ready_at(w.now) is not None:
                    return False
        for cl in w.clusters.values():
            if cl.jobs:
                return False
        return not waiting or w.now > self.healed_at + 60.0

    def run(self) -> Result:
        w, rng = self.w, self.rng
        for name in SERVICES:
            self.boot(name)
        w.spawned.append(Task("chaos", self, self.chaos()))
        clusters = [w.clusters[c] for c in sorted(w.clusters)]
        ready: list[Task] = []  # waiting for nothing
        sleeping: list[tuple[float, int, Task]] = []  # heap by wake-up time
        others: list[Task] = []  # waiting for a message or a condition
        n = 0
        next_wait_check = EPOCH0 + 10.0
        settled = False
        horizon = EPOCH0 + HORIZON
        while self.steps < MAX_STEPS:
            now = w.now
            for cl in clusters:
                if (cl._timers and cl._timers[0][0] <= now) or cl._dirty:
                    cl.advance(now)
            if w.spawned:
                ready.extend(w.spawned)
                w.spawned.clear()
            while sleeping and sleeping[0][0] <= now:
                ready.append(heapq.heappop(sleeping)[2])
            if others:
                keep = []
                for t in others:
                    r = t.ready_at(now)
                    if r is not None and r <= now:
                        ready.append(t)
                    else:
                        keep.append(t)
                others = keep
            ready = [t for t in ready if t.alive]
            if not ready:
                times = [sleeping[0][0]] if sleeping else []
                times += [r for t in others if t.alive and (r := t.ready_at(now)) is not None]
                times += [x for cl in clusters if (x := cl.next_time()) is not None]
                if not times or min(times) > horizon:
                    break
                w.now = max(now, min(times))
                continue
            i = rng.randrange(len(ready)) if len(ready) > 1 else 0
            t = ready[i]
            ready[i] = ready[-1]
            ready.pop()
            if isinstance(t.owner, Service) and t.owner.stalled_until > w.now:
                n += 1
                heapq.heappush(sleeping, (t.owner.stalled_until, n, t))
                continue
            self.step(t)
            if t.alive:
                wait = t.wait
                if wait is None:
                    ready.append(t)
                elif isinstance(wait, Sleep):
                    n += 1
                    heapq.heappush(sleeping, (wait.until, n, t))
                else:
                    others.append(t)
            w.now += rng.random() * 0.004  # every step takes a little time
            if w.now >= next_wait_check:
                next_wait_check = w.now + 10.0
                self.check_waits()
            if self.steps % 25 == 0 and self.settled():
                settled = True
                break
        if not settled:
            settled = self.settled()
        return self.verdict(settled)

    def check_waits(self) -> None:
        events = [(m.seq, m.data) for m in self.w.evt.msgs]
        for v in check_waits(events, self.w.snapshots, self.w.now):
            self.wait_violations.setdefault((v.invariant, v.workload_id), v)

    def verdict(self, settled: bool) -> Result:
        w = self.w
        events = [(m.seq, m.data) for m in w.evt.msgs]
        jobs = {
            name: [(j.labels.get(LABEL_WORKLOAD, ""), j.name) for j in cl.jobs.values()]
            for name, cl in sorted(w.clusters.items())
        }
        violations = check(events, jobs=jobs, snapshots=w.snapshots, now=w.now)
        violations += list(self.wait_violations.values())
        violations += check_owners(w.owners.writes)
        violations += check_manifests(events, sim_manifests(w.manifests))  # invariant 8: what the store holds
        violations += check_limits(events, w.policy)  # invariant 9: admission within the policy's limits
        violations += w.violations  # judged against the world as it happened (`absent-means-gone`)
        if w.trace is not None:
            w.trace.append(f"--- settled={settled} after {self.steps} steps, {w.now - EPOCH0:.1f}s virtual, {len(events)} events")
            for v in violations:
                w.trace.append(f"VIOLATION {v.invariant} {v.workload_id}: {v.detail}")
        return Result(
            seed=self.seed, violations=violations, faults=self.faults, steps=self.steps, virtual_seconds=w.now - EPOCH0,
            events=len(events), workloads=len(self.wids), settled=settled, trace=w.trace, loop_errors=list(w.loop_errors),
        )


def sim_manifests(written: dict[str, tuple[str, int]]) -> dict[str, dict[str, Manifest]]:
    """The simulated store's manifests (result URL -> (attempt, epoch)) as the invariants take
    them: workload -> store -> manifest. The URL is `file:///sim/stores/<store>/<wid>/result/...`."""
    out: dict[str, dict[str, Manifest]] = {}
    for url, (attempt, epoch) in written.items():
        store, wid = url.removeprefix("file:///sim/stores/").split("/")[:2]
        out.setdefault(wid, {})[store] = Manifest(workload_id=wid, attempt_id=attempt, epoch=epoch, store=store,
                                                  prefix=f"{wid}/attempts/{attempt}", objects=[], total_bytes=0, created_at=0.0)  # fmt: skip
    return out


def run(seed: int, *, trace: bool = False) -> Result:
    """One schedule from `seed`."""
    return Simulation(seed, trace=trace).run()
