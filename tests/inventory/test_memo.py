"""A `Memo` kept from round to round changes nothing in what inventory says: on random
histories of a cluster (pods created, bound, started, finished, deleted; nodes relabelled,
tainted, cordoned), each round's snapshot and pod starts with the memo equal those without it,
while an unchanged pod is parsed once and its eligible nodes are worked out once. So do the
pods kept as a `PodSet` from the changes alone (what inventory does with its watch's changes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_inventory import core
from tests.inventory.builders import T0, make_node, make_pod, make_registry

NODES = ["n0", "n1", "n2"]
REGISTRIES = [make_registry(), make_registry("train", "batch", admission="kueue")]

op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 4), st.sampled_from([None, "train", "batch", "other"]),
              st.sampled_from([None, 50.0, 600.0]), st.sampled_from([None, "train", "infer"]), st.integers(0, 2)),
    st.tuples(st.just("bind"), st.integers(0, 30), st.sampled_from(NODES)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("deleting"), st.integers(0, 30)),
    st.tuples(st.just("delete"), st.integers(0, 30)),
    st.tuples(st.just("pool"), st.sampled_from(NODES), st.sampled_from(["train", "infer"])),
    st.tuples(st.just("taint"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("cordon"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("round"), st.floats(0.0, 100.0)),
)


class Cluster:
    """Objects as an informer's cache holds them: a change is a new dict with a new resourceVersion."""

    def __init__(self) -> None:
        self.rv = 0
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.changed: list[str] = []  # the pods changed since the last round, as a watch tells them
        self.made = 0
        for n in NODES:
            self.put(self.nodes, n, make_node(n, gpus=4))

    def put(self, where: dict[str, dict[str, Any]], key: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        where[key] = obj
        if where is self.pods:
            self.changed.append(key)

    def pod(self, i: int) -> tuple[str, dict[str, Any]] | None:
        names = sorted(self.pods)
        return None if not names else (names[i % len(names)], copy.deepcopy(self.pods[names[i % len(names)]]))

    def node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.nodes[name])

    def apply(self, o: tuple[Any, ...], now: float) -> None:
        kind = o[0]
        if kind == "create":
            _, gpus, queue, expected, pool, prio = o
            self.made += 1
            name = f"p{self.made}"
            pod = make_pod(name, gpus=gpus, queue=queue, expected=expected, created=now - self.made, priority=prio,
                           node_selector={"gpuorch.io/pool": pool} if pool else None, job=f"j{self.made // 2}")
            self.put(self.pods, name, pod)
        elif kind in ("bind", "finish", "deleting", "delete"):
            got = self.pod(o[1])
            if got is None:
                return
            name, pod = got
            if kind == "delete":
                del self.pods[name]
                self.changed.append(name)
                return
            if kind == "bind" and not pod["spec"].get("nodeName"):
                pod["spec"]["nodeName"] = o[2]
                pod["status"] = {"phase": "Running", "startTime": "2027-01-15T08:00:00+00:00"}
            elif kind == "finish":
                pod["status"]["phase"] = "Succeeded"
            elif kind == "deleting":
                pod["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00+00:00"
            self.put(self.pods, name, pod)
        elif kind == "pool":
            node = self.node(o[1])
            node["metadata"]["labels"]["gpuorch.io/pool"] = o[2]
            self.put(self.nodes, o[1], node)
        elif kind == "taint":
            node = self.node(o[1])
            node["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}] if o[2] else []
            self.put(self.nodes, o[1], node)
        elif kind == "cordon":
            node = self.node(o[1])
            node["spec"]["unschedulable"] = o[2]
            self.put(self.nodes, o[1], node)


def one_round(
    cluster: Cluster, registry: Any, now: float, seen: frozenset[str], memo: core.Memo | None, pod_set: core.PodSet | None = None
) -> tuple[Any, ...]:
    nodes = list(cluster.nodes.values())
    pods: core.Pods = list(cluster.pods.values())
    if pod_set is not None:  # brought up to date from the changes alone, each once, as they are now
        pod_set.update((k, cluster.pods.get(k)) for k in dict.fromkeys(cluster.changed))
        cluster.changed = []
        pods = pod_set
    starts, seen = core.observe_pod_starts(pods, registry, time_scale=60.0, seen=seen, memo=memo)
    snap = core.build_snapshot("c", nodes, pods, registry, now=now, observed_at=now, time_scale=60.0, memo=memo)
    return snap, starts, seen


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(REGISTRIES), st.lists(op, min_size=1, max_size=60))
def test_the_memo_changes_no_snapshot(registry: Any, ops: list[tuple[Any, ...]]) -> None:
    cluster, memo, memo2, pod_set = Cluster(), core.Memo(), core.Memo(), core.PodSet()
    now, seen_plain, seen_memo, seen_set = T0, frozenset[str](), frozenset[str](), frozenset[str]()
    for o in [*ops, ("round", 1.0)]:
        if o[0] != "round":
            cluster.apply(o, now)
            continue
        now += o[1]
        plain = one_round(cluster, registry, now, seen_plain, None)
        kept = one_round(cluster, registry, now, seen_memo, memo)
        followed = one_round(cluster, registry, now, seen_set, memo2, pod_set)
        assert kept == plain
        assert followed == plain
        assert len(pod_set) == len(cluster.pods)
        seen_plain, seen_memo, seen_set = plain[2], kept[2], followed[2]
    assert set(memo.pods) <= {f"uid-{n}" for n in cluster.pods}, "only what is still listed is kept"


def test_an_unchanged_pod_is_parsed_once_and_its_eligibility_worked_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed, fitted = [], []
    parse, fits = core._parse_pod, core._fits_node
    monkeypatch.setattr(core, "_parse_pod", lambda o: parsed.append(o) or parse(o))
    monkeypatch.setattr(core, "_fits_node", lambda p, n: fitted.append(p) or fits(p, n))
    cluster = Cluster()
    for _ in range(5):
        cluster.apply(("create", 1, None, 600.0, None, 0), T0)
    memo = core.Memo()
    one_round(cluster, make_registry(), T0, frozenset(), memo)
    assert len(parsed) == 5 and len(fitted) == 5 * len(NODES)
    one_round(cluster, make_registry(), T0 + 1, frozenset(), memo)
    assert len(parsed) == 5 and len(fitted) == 5 * len(NODES), "nothing changed: nothing worked out again"
    cluster.apply(("bind", 0, "n0"), T0)
    one_round(cluster, make_registry(), T0 + 2, frozenset(), memo)
    assert len(parsed) == 6, "the changed pod only"
    assert len(fitted) == 5 * len(NODES), "the others' eligibility is kept (the bound one is not pending)"
    cluster.apply(("pool", "n1", "infer"), T0)
    one_round(cluster, make_registry(), T0 + 3, frozenset(), memo)
    assert len(fitted) == 9 * len(NODES), "a node's labels changed: every pending pod's eligibility again"
