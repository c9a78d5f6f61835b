"""What-if: the same trace over a changed fleet, and the difference per policy (docs/simulation.md).

`gpuorch simulate --what-if "east-h100:+16 nodes"` (repeatable) and `--what-if-clusters FILE` run
two fleets over the same jobs and seed. This module holds the pure parts: `parse_change` reads a
change (`CLUSTER[/POOL-OR-GPU]:+N nodes`, strictly: an error names the bad part), `apply` makes the
changed `World` (an error names the unknown cluster and the known ones), `background_for` keeps the
other tenants' work of an unchanged cluster as it was, and `measures` / `diff` compute the table.

A change copies or removes nodes of one *kind* (pool, GPU model, GPUs per node, memory): added
nodes are copies of that kind's last node, named after it (`east-h100-h100-14`, ...); removed nodes
are that kind's last ones. A cluster with one kind of node needs no selector; a mixed one (the
documented `central-lab`: pool `train` of A100s, pool `dev` of V100s) needs the pool or a part of
the GPU model after a slash: `central-lab/dev:+4 nodes`, `central-lab/A100:-2 nodes`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .engine import BackgroundJob, RunResult, background_jobs
from .report import Row
from .world import ClusterSpec, NodeSpec, World

FORM = 'CLUSTER[/POOL-OR-GPU]:+N nodes (or -N nodes), e.g. "east-h100:+16 nodes"'

#: (key, label) of each compared measure, in table order
METRICS: tuple[tuple[str, str], ...] = (
    ("jct_mean_h", "mean JCT (h)"),
    ("jct_p50_h", "p50 JCT (h)"),
    ("jct_p95_h", "p95 JCT (h)"),
    ("jct_p99_h", "p99 JCT (h)"),
    ("wait_mean_h", "mean queueing (h)"),
    ("utilization_pct", "utilization (%)"),
)


class WhatIfError(ValueError):
    """A what-if change that cannot be read or applied; the message says which part and why."""


@dataclass(frozen=True)
class Change:
    cluster: str
    selector: str | None  # a pool or a part of a GPU model; None: the cluster's only kind of node
    nodes: int  # added (> 0) or removed (< 0)
    text: str  # as the user wrote it, for messages


_AMOUNT = re.compile(r"[+-]\d+")
_GLUED = re.compile(r"([+-]?\d+)(nodes?)")


def parse_change(text: str) -> Change:
    """`CLUSTER[/SELECTOR]:+N nodes` -> a `Change`. Strict: a sign, a whole number, the unit `nodes`."""
    where = f'what-if "{text}"'
    target, colon, amount = text.partition(":")
    target = target.strip()
    if not colon:
        raise WhatIfError(f"{where}: no ':' between cluster and change; expected {FORM}")
    if not target:
        raise WhatIfError(f"{where}: no cluster before ':'; expected {FORM}")
    cluster, slash, selector = target.partition("/")
    cluster, selector = cluster.strip(), selector.strip()
    if not cluster or (slash and not selector) or "/" in selector or any(c.isspace() for c in target):
        raise WhatIfError(f"{where}: {target!r} is not CLUSTER or CLUSTER/POOL-OR-GPU; expected {FORM}")
    tokens = amount.split()
    if not tokens:
        raise WhatIfError(f"{where}: nothing after ':'; expected {FORM}")
    number, *rest = tokens
    glued = _GLUED.fullmatch(number)  # "+16nodes": the unit written onto the number
    if glued is not None:
        number, rest = glued.group(1), [glued.group(2), *rest]
    if _AMOUNT.fullmatch(number) is None:
        hint = " (a sign is required: + adds, - removes)" if number.isdigit() else ""
        raise WhatIfError(f"{where}: {number!r} is not a signed whole number of nodes{hint}; expected {FORM}")
    n = int(number)
    if n == 0:
        raise WhatIfError(f"{where}: {number!r} changes nothing; add (+N) or remove (-N) at least one node")
    if rest and rest[0] not in ("node", "nodes"):
        raise WhatIfError(f"{where}: unknown unit {rest[0]!r}; the unit is nodes; expected {FORM}")
    if len(rest) > 1:
        raise WhatIfError(f"{where}: unexpected {' '.join(rest[1:])!r} after '{number} {rest[0]}'; expected {FORM}")
    return Change(cluster=cluster, selector=selector or None, nodes=n, text=text)


def _kind(n: NodeSpec) -> tuple[str | None, str, int, int]:
    return (n.pool, n.product, n.gpus, n.memory_mib)


def _describe(nodes: Sequence[NodeSpec], kind: tuple[str | None, str, int, int]) -> str:
    pool, product, gpus, _ = kind
    count = sum(1 for n in nodes if _kind(n) == kind)
    return f"{f'pool {pool}: ' if pool else ''}{count} x {product} ({gpus} GPUs)"


def node_kinds(spec: ClusterSpec) -> list[tuple[str | None, str, int, int]]:
    """The cluster's kinds of node (pool, GPU model, GPUs, memory), in the order they first appear."""
    return list(dict.fromkeys(_kind(n) for n in spec.nodes))


def _pick_kind(spec: ClusterSpec, change: Change, where: str) -> tuple[str | None, str, int, int]:
    kinds = node_kinds(spec)
    listing = "; ".join(_describe(spec.nodes, k) for k in kinds)
    if change.selector is None:
        if len(kinds) == 1:
            return kinds[0]
        if not kinds:
            raise WhatIfError(f"{where}: cluster {spec.name} has no nodes to copy; give it nodes in a --what-if-clusters file")
        pools = [k[0] for k in kinds if k[0]]
        example = pools[0] if len(set(pools)) == len(kinds) else kinds[0][1]
        raise WhatIfError(f"{where}: {spec.name} has {len(kinds)} kinds of node ({listing}); name one after a slash, "
                          f'e.g. "{spec.name}/{example}:{change.text.partition(":")[2].strip()}"')
    sel = change.selector.lower()
    by_pool = [k for k in kinds if (k[0] or "").lower() == sel]
    matches = by_pool or [k for k in kinds if sel in k[1].lower()]
    if not matches:
        raise WhatIfError(f"{where}: no pool or GPU model {change.selector!r} in {spec.name}; its nodes: {listing}")
    if len(matches) > 1:
        raise WhatIfError(f"{where}: {change.selector!r} matches {len(matches)} kinds of node in {spec.name} "
                          f"({'; '.join(_describe(spec.nodes, k) for k in matches)}); be more specific")
    return matches[0]


def _apply_one(spec: ClusterSpec, change: Change, where: str) -> ClusterSpec:
    kind = _pick_kind(spec, change, where)
    nodes = list(spec.nodes)
    positions = [i for i, n in enumerate(nodes) if _kind(n) == kind]
    if change.nodes < 0:
        remove = -change.nodes
        if remove > len(positions):
            raise WhatIfError(f"{where}: {spec.name} has {len(positions)} such nodes ({_describe(nodes, kind)}); "
                              f"cannot remove {remove}")
        if remove == len(nodes):
            raise WhatIfError(f"{where}: that removes every node of {spec.name}; to drop a cluster, "
                              "use --what-if-clusters with a file without it")
        gone = set(positions[-remove:])
        return replace(spec, nodes=tuple(n for i, n in enumerate(nodes) if i not in gone))
    template = nodes[positions[-1]]
    stem = template.name.rsplit("-", 1)[0] if "-" in template.name else template.name
    used = {n.name for n in nodes}
    added: list[NodeSpec] = []
    k = len(positions)
    while len(added) < change.nodes:
        name = f"{stem}-{k}"
        k += 1
        if name not in used:
            used.add(name)
            added.append(replace(template, name=name))
    at = positions[-1] + 1
    return replace(spec, nodes=tuple(nodes[:at] + added + nodes[at:]))


def apply(world: World, changes: Iterable[Change], where: str = "the clusters file") -> World:
    """The world with every change made, in order. Unknown clusters and impossible changes raise."""
    clusters = list(world.clusters)
    for change in changes:
        at = next((i for i, c in enumerate(clusters) if c.name == change.cluster), None)
        if at is None:
            raise WhatIfError(f'what-if "{change.text}": no cluster {change.cluster!r} in {where}; '
                              f"known: {', '.join(c.name for c in clusters)}")
        clusters[at] = _apply_one(clusters[at], change, f'what-if "{change.text}"')
    return replace(world, clusters=tuple(clusters))


def background_for(baseline: World, whatif: World, seed: int, horizon: float) -> list[BackgroundJob]:
    """The other tenants' work in the what-if fleet.

    A cluster that both fleets have, with the same `background:` settings, keeps exactly the
    baseline's jobs: buying nodes does not bring other tenants more work, so its absolute load stays
    and only its share of the bigger cluster falls. A cluster that is new, or whose `background:`
    the what-if file changes, gets its own (`engine.background_jobs`, the same seeded rule).
    """
    base_index = {c.name: i for i, c in enumerate(baseline.clusters)}
    base_jobs = background_jobs(baseline, seed, horizon)
    own_jobs = background_jobs(whatif, seed, horizon)
    keep = {i: base_index[c.name] for i, c in enumerate(whatif.clusters)
            if c.name in base_index and baseline.clusters[base_index[c.name]].background == c.background}
    from_base = {b: w for w, b in keep.items()}
    out = [replace(j, cluster=from_base[j.cluster]) for j in base_jobs if j.cluster in from_base]
    out += [j for j in own_jobs if j.cluster not in keep]
    out.sort(key=lambda b: (b.submit, b.cluster))
    return out


def utilization(result: RunResult, window: float) -> float:
    """Percent of the fleet's GPUs busy (trace and background work) over [0, window) seconds,
    counted in whole `bucket`s (the load series' resolution)."""
    buckets = max(1, math.ceil(window / result.bucket))
    busy = sum(sum(series[:buckets]) for series in result.load.values())
    capacity = sum(result.capacity.values()) * buckets * result.bucket
    return 100.0 * busy / capacity if capacity > 0 else math.nan


def measures(row: Row, result: RunResult, window: float) -> dict[str, float]:
    """Every compared measure of one replay (`METRICS`): the report's row, plus utilization."""
    got = {key: float(getattr(row, key)) for key, _ in METRICS if key != "utilization_pct"}
    got["utilization_pct"] = utilization(result, window)
    return got


@dataclass(frozen=True)
class Delta:
    policy: str
    metric: str
    baseline: float
    what_if: float
    delta: float
    delta_pct: float | None  # None: the baseline is 0 (no relative change)

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def diff(baseline: Mapping[str, Mapping[str, float]], what_if: Mapping[str, Mapping[str, float]]) -> list[Delta]:
    """Per policy (in the baseline's order) and metric (`METRICS` order): what-if minus baseline."""
    missing = [p for p in baseline if p not in what_if]
    if missing:
        raise ValueError(f"the what-if run lacks policies {', '.join(missing)}")
    out: list[Delta] = []
    for policy, base in baseline.items():
        for key, _ in METRICS:
            b, w = base[key], what_if[policy][key]
            out.append(Delta(policy, key, b, w, w - b, 100.0 * (w - b) / b if b and math.isfinite(b) else None))
    return out


def _num(x: float) -> str:
    return f"{x:,.2f}"


def markdown(deltas: Sequence[Delta]) -> str:
    """One row per policy and metric: baseline, what-if, delta, delta %."""
    label = dict(METRICS)
    out = ["| policy | measure | baseline | what-if | delta | delta % |", "|---|---|---|---|---|---|"]
    last = ""
    for d in deltas:
        pct = "n/a" if d.delta_pct is None else f"{d.delta_pct:+.1f} %"
        out.append(f"| {d.policy if d.policy != last else ''} | {label[d.metric]} | {_num(d.baseline)} | {_num(d.what_if)} | "
                   f"{'+' if d.delta >= 0 else ''}{_num(d.delta)} | {pct} |")
        last = d.policy
    return "\n".join(out)


def describe_fleet(world: World) -> str:
    return f"{len(world.clusters)} clusters, {sum(len(c.nodes) for c in world.clusters):,} nodes, " \
           f"{sum(c.gpus for c in world.clusters):,} GPUs"
