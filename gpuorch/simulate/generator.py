"""Seeded attributes for what a trace does not record (docs/simulation.md, "Generated fields").

Each job's attributes come from its own `random.Random(f"{seed}:{job_id}")`, so a job gets the same
attributes whatever slice of the trace is read and whatever policy runs. Nothing here reads the
clock or a file.

| field | how (defaults of `GeneratorConfig`) |
|---|---|
| GPU memory floor | none 55 %, 24 GiB 10 %, 40 GiB 20 %, 80 GiB 15 % |
| accelerator | any 91 %, `H100`/`H200` 4 %, `A100` 4 %, `B200` 1 % (a model the fleet lacks: never runs) |
| shape | <= 8 GPUs: one worker on one node; more: `gpus/8` workers of 8 GPUs (a gang, one cluster) |
| input dataset | none 15 %; else one of the catalogue, by popularity weight (size and replica locations from the catalogue) |
| artifact store | `prod` 70 %, `scratch` 30 % |
| checkpointing | 50 %: a portable checkpoint in the output store |
| image | one of `images` (5), uniformly |
| declared run time | recorded duration x exp(N(0, `declared_sigma`=0.4)): what the user writes, on the reference GPU |
| true run time | recorded duration x speed(reference) / speed(model) x exp(N(0, `model_sigma`=0.1)) per GPU family: the router's speed table is right on average only |
| workload class | none (the router learns under owner + image + command); with `repeat_classes`, jobs of one file with the same GPU count and duration share one |
| CPU, memory | 1 core, 1 GiB per worker |

A field the trace records (`trace.TraceJob`: GPU-model list, share of a GPU, CPU, memory) is used
as recorded instead: the draws for it are still made, and dropped, so every other attribute of a
job is the same whichever fields its trace has. A fractional job (a share < 1 of one GPU) names
the trace's sharing mechanism (`Resources.sharing`): the router's own rule
(`gpuorch_proto.placement.sharing_ok`, its SHARING and GPU_SHARED checks) then sends it only where
GPUs are shared that way, and whole-GPU jobs never there.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpuorch_proto.workload import (
    CheckpointPolicy,
    DatasetInput,
    Metadata,
    OutputPolicy,
    Resources,
    Sharing,
    Workload,
    WorkloadSpecBody,
)

from .trace import TraceJob
from .world import Dataset

IMAGE_DIGESTS = tuple(f"ghcr.io/acme/train-{k}@sha256:{(str(k) * 64)[:64]}" for k in range(5))


@dataclass(frozen=True)
class GeneratorConfig:
    memory_gib: tuple[tuple[float, float], ...] = ((0.0, 0.55), (24.0, 0.10), (40.0, 0.20), (80.0, 0.15))
    accelerators: tuple[tuple[str, float], ...] = (("", 0.91), ("H100,H200", 0.04), ("A100", 0.04), ("B200", 0.01))
    no_input: float = 0.15
    prod_store: float = 0.70
    checkpoint: float = 0.50
    declared_sigma: float = 0.4
    model_sigma: float = 0.1
    reference_accelerator: str = "NVIDIA-A100-SXM4-80GB"  # trace durations are run times on this GPU
    node_gpus: int = 8  # GPUs per worker of a multi-node gang
    # jobs of one trace file with the same GPU count and recorded duration (to the second) share a
    # workload class (an opaque digest): the trace's repeats read as recurring runs of one program
    repeat_classes: bool = False

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> GeneratorConfig:
        known = {f.name for f in fields(cls)}
        bad = set(doc) - known
        if bad:
            raise ValueError(f"generator: unknown field(s) {', '.join(sorted(bad))}")
        conv: dict[str, Any] = {}
        for k, v in doc.items():
            conv[k] = tuple(tuple(x) for x in v) if isinstance(v, list) and v and isinstance(v[0], list) else v
        return cls(**conv)


@dataclass(frozen=True)
class SimJob:
    """A trace job with its generated attributes: what the simulator routes and runs."""

    index: int
    trace: TraceJob
    workload: Workload
    workers: int
    per_worker: int
    memory_gib: float
    accelerators: tuple[str, ...]
    dataset: Dataset | None
    declared_run: float  # seconds on the reference GPU (what the workload says)
    true_factor: Mapping[str, float]  # per GPU family: true/nominal run time factor (seeded error)
    store: str
    sharing: Sharing | None = None  # a fractional job's mechanism (per_worker is then one shared device)
    cpu: float = 0.0  # cores per worker the trace records (0: not recorded, not checked)
    memory: float = 0.0  # bytes per worker the trace records (0: not recorded)

    @property
    def node_demand(self) -> tuple[float, tuple[str, ...], int, Sharing | None, float, float]:
        """What decides which nodes of a cluster may take it (`model.ClusterModel.suitable`'s arguments)."""
        return self.memory_gib, self.accelerators, self.per_worker, self.sharing, self.cpu, self.memory

    @property
    def gpus(self) -> int:
        return self.workers * self.per_worker

    @property
    def submit(self) -> float:
        return self.trace.submit


def _pick(rng: random.Random, table: tuple[tuple[Any, float], ...]) -> Any:
    x, acc = rng.random() * sum(w for _, w in table), 0.0
    for value, w in table:
        acc += w
        if x < acc:
            return value
    return table[-1][0]


FAMILIES = ("B200", "GH200", "H200", "H100", "H800", "MI300X", "A100", "A800", "MI250X", "L40S", "L40", "A40",
            "A6000", "V100", "A10G", "A10", "L4", "T4", "")


def family(product: str) -> str:
    up = product.upper().replace("_", "-").split("-")
    for f in FAMILIES:
        if f and f in up:
            return f
    return ""


def shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """(workers, GPUs per worker): one node up to `node_gpus`, else whole-node workers."""
    if gpus <= node_gpus:
        return 1, gpus
    return math.ceil(gpus / node_gpus), node_gpus


def repeat_class(job: TraceJob) -> str:
    """The class of a job under `repeat_classes`: a digest of file, GPU count and duration, so the
    router learns nothing from the name itself."""
    return "r-" + hashlib.blake2b(f"{job.origin}:{job.gpus}:{job.duration:.0f}".encode(), digest_size=6).hexdigest()


def generate(job: TraceJob, index: int, seed: int, datasets: tuple[Dataset, ...], cfg: GeneratorConfig,
             sharing: Sharing | None = None) -> SimJob:
    """`sharing`: the mechanism the trace's fractional jobs name (the mapping's `sharing`)."""
    rng = random.Random(f"{seed}:{job.job_id}:{job.origin}")
    mem = float(_pick(rng, cfg.memory_gib))
    acc_s = str(_pick(rng, cfg.accelerators))
    accels = tuple(a for a in acc_s.split(",") if a) if job.accelerators is None else job.accelerators
    if job.fractional and sharing is None:
        raise ValueError(f"job {job.job_id} asks for {job.share:g} of a GPU, and the trace's mapping names no sharing mechanism")
    share = sharing if job.fractional else None
    ds: Dataset | None = None
    if datasets and rng.random() >= cfg.no_input:
        ds = datasets[-1]
        x, acc = rng.random() * sum(d.weight for d in datasets), 0.0
        for d in datasets:
            acc += d.weight
            if x < acc:
                ds = d
                break
    store = "prod" if rng.random() < cfg.prod_store else "scratch"
    ckpt = rng.random() < cfg.checkpoint
    image = IMAGE_DIGESTS[rng.randrange(len(IMAGE_DIGESTS))]
    declared = job.duration * math.exp(rng.gauss(0.0, cfg.declared_sigma))
    true_factor = {f: math.exp(rng.gauss(0.0, cfg.model_sigma)) for f in FAMILIES}
    workers, per_worker = shape(job.gpus, cfg.node_gpus)
    cpu, memory = (job.cpu or 0.0) / workers, (job.memory or 0.0) / workers  # the trace's are per job
    wl = Workload(
        metadata=Metadata(name=f"trace-{index}", owner="trace", workload_class=repeat_class(job) if cfg.repeat_classes else None),
        spec=WorkloadSpecBody(
            image=image,
            inputs=[DatasetInput(ref=ds.ref, size_gb=ds.size_gb, locations=list(ds.locations))] if ds else [],
            resources=Resources(gpus=job.share if share is not None and job.share is not None else per_worker,
                                gpu_memory_gib=mem or None, accelerators=list(accels), workers=workers, same_node=workers == 1,
                                cpu=f"{round(cpu * 1000)}m" if cpu else "1", memory=f"{round(memory)}" if memory else "1Gi",
                                sharing=share),
            expected_runtime=f"{max(1, round(declared))}s",
            reference_accelerator=cfg.reference_accelerator,
            checkpoint=CheckpointPolicy(path="ckpt", interval="30m", portable=True, store=store) if ckpt else CheckpointPolicy(),
            output=OutputPolicy(store=store, promote=True),
        ),
    )
    return SimJob(index=index, trace=job, workload=wl, workers=workers, per_worker=per_worker, memory_gib=mem,
                  accelerators=accels, dataset=ds, declared_run=float(max(1, round(declared))), true_factor=true_factor,
                  store=store, sharing=share, cpu=cpu, memory=memory)
