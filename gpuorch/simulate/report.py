"""The comparison table: per policy, job completion times, waits, GPU-hours, data moved, cost.

JCT = outputs promoted - submitted (queue + staging + startup + run + output transfer); wait =
GPUs allocated - submitted. GPU-hours count every GPU a job holds from allocation to release, so
staging (an init container) is in them. Percentiles are nearest-rank. Only trace jobs count
(background load is the other tenants'). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine import RunResult
from .mapping import TraceFormat

#: what the generator makes (generator.py), each with the trace field that replaces it where a
#: trace records one (None: always generated)
GENERATED: tuple[tuple[str, str | None], ...] = (
    ("GPU memory floor", None), ("accelerator", "accelerators"), ("share of a GPU (whole GPUs)", "gpu_share"),
    ("CPU (1 core per worker)", "cpu"), ("memory (1 GiB per worker)", "memory"), ("gang shape (from num_gpu)", None),
    ("input dataset, size and replica locations", None), ("artifact store", None), ("checkpointing", None), ("image", None),
    ("declared run time (duration x seeded error)", None),
    ("true run time per GPU model (duration x speed x seeded error)", None), ("background load", None),
)
GENERATED_FIELDS = tuple(name for name, _ in GENERATED)


def fields(fmt: TraceFormat) -> dict[str, Any]:
    """Which fields of this replay were real (the trace's columns, as the mapping reads them) and
    which generated: `real` (the columns), `real_fields` (field -> column), `generated`."""
    def col(name: str) -> str:
        c = fmt.fields[name]
        if c.start is not None:
            return f"{c.column} - {c.start}"
        return f"{c.column} - {fmt.fields['submit'].column}" if c.end_minus_submit else c.column

    real = {f: col(f) for f in fmt.real}
    return {"real": list(real.values()), "real_fields": real,
            "generated": [name for name, f in GENERATED if f is None or f not in real]}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass(frozen=True)
class Row:
    policy: str
    jobs: int
    ran: int
    jct_mean_h: float
    jct_p50_h: float
    jct_p95_h: float
    jct_p99_h: float
    wait_mean_h: float
    gpu_hours: float
    staging_gpu_hours: float
    tb_moved: float
    cost: float
    never: int
    never_reasons: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    placed: dict[str, int] = field(default_factory=dict)  # jobs per cluster

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(result: RunResult, cpu_seconds: float = 0.0) -> Row:
    ran = [j for j in result.jobs if not j.never]
    jct = sorted(j.jct for j in ran)
    reasons: dict[str, int] = {}
    for j in result.jobs:
        if j.never:
            reasons[j.never] = reasons.get(j.never, 0) + 1
    n = len(ran) or 1
    return Row(
        policy=result.policy, jobs=len(result.jobs), ran=len(ran),
        jct_mean_h=sum(jct) / n / 3600, jct_p50_h=percentile(jct, 50) / 3600, jct_p95_h=percentile(jct, 95) / 3600,
        jct_p99_h=percentile(jct, 99) / 3600, wait_mean_h=sum(j.wait for j in ran) / n / 3600,
        gpu_hours=sum(j.gpu_hours for j in ran), staging_gpu_hours=sum(j.gpus * j.staging_s for j in ran) / 3600,
        tb_moved=sum(j.data_gb for j in ran) / 1000, cost=sum(j.cost for j in ran),
        never=len(result.jobs) - len(ran), never_reasons=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        cpu_seconds=cpu_seconds,
        placed={c: sum(1 for j in ran if j.cluster == c) for c in result.clusters},
    )


def _h(x: float) -> str:
    return f"{x:,.2f}"


def markdown(rows: Sequence[Row], *, baseline: str = "emptiest", bound: str = "clairvoyant") -> str:
    head = ("| policy | mean JCT (h) | p50 | p95 | p99 | mean wait (h) | GPU-hours (incl. staging) | "
            "staging GPU-h | data moved (TB) | cost ($) | never ran |")
    out = [head, "|" + "---|" * 11]
    for r in rows:
        out.append(f"| {r.policy} | {_h(r.jct_mean_h)} | {_h(r.jct_p50_h)} | {_h(r.jct_p95_h)} | {_h(r.jct_p99_h)} | "
                   f"{_h(r.wait_mean_h)} | {r.gpu_hours:,.0f} | {r.staging_gpu_hours:,.0f} | {r.tb_moved:,.1f} | "
                   f"{r.cost:,.0f} | {r.never} |")
    by = {r.policy: r for r in rows}
    g = by.get("gpuorch")
    notes = []
    if g is not None and baseline in by and by[baseline].jct_mean_h > 0:
        notes.append(f"gpuorch mean JCT vs {baseline}: {100 * (g.jct_mean_h / by[baseline].jct_mean_h - 1):+.1f} %")
    if g is not None and bound in by and by[bound].jct_mean_h > 0:
        notes.append(f"gpuorch mean JCT vs {bound}: {100 * (g.jct_mean_h / by[bound].jct_mean_h - 1):+.1f} %")
    reasons = next((r.never_reasons for r in rows if r.never_reasons), {})
    if reasons:
        notes.append("never ran (every policy: no cluster passes the router's hard checks): "
                     + "; ".join(f"{n} x {why}" for why, n in reasons.items()))
    return "\n".join(out + ([""] + [f"- {n}" for n in notes] if notes else []))


def document(rows: Sequence[Row], meta: dict[str, Any], fmt: TraceFormat) -> dict[str, Any]:
    return {**meta, "fields": fields(fmt), "policies": [r.as_dict() for r in rows]}
