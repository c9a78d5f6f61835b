"""The pure snapshot builder, with plain dicts as the official client's sanitize_for_serialization makes them."""

from __future__ import annotations

import msgspec
import pytest

from gpuorch_inventory.core import (
    Demand,
    Hold,
    QueueHistory,
    build_snapshot,
    earliest_start,
    measure_queue_delays,
    observe,
    parse_staged_entry,
    parse_staged_key,
    parse_time,
    queue_shape_waits,
    snapshot_changed,
    staged_refs,
    unreachable_snapshot,
)
from gpuorch_proto import ClusterSnapshot, Taint, decode_snapshot, encode

from .builders import A100_40, A100_80, T0, make_node, make_pod, make_registry


def snap(nodes, pods, registry=None, *, time_scale=1.0, **kw) -> ClusterSnapshot:
    return build_snapshot(
        "primary",
        nodes,
        pods,
        registry or make_registry("training"),
        now=T0,
        observed_at=T0,
        time_scale=time_scale,
        **kw,
    )


def node_of(s: ClusterSnapshot, name: str):
    (n,) = [n for n in s.nodes if n.name == name]
    return n


def queue_of(s: ClusterSnapshot, name: str):
    (q,) = [q for q in s.queues if q.name == name]
    return q


# --------------------------------------------------------------------------- nodes


def test_node_facts_come_from_gfd_labels_pool_label_allocatable_and_taints():
    s = snap(
        [
            make_node(
                "gpu-a",
                gpus=4,
                product=A100_40,
                memory_mib=40960,
                pool="short",
                taints=[{"key": "gpuorch.io/short-only", "value": "true", "effect": "NoSchedule"}],
                labels={"zone": "z1"},
            )
        ],
        [],
    )
    n = node_of(s, "gpu-a")
    assert (n.ready, n.pool, n.gpu_product, n.gpu_memory_mib) == (True, "short", A100_40, 40960)
    assert (n.gpus_allocatable, n.gpus_free) == (4, 4)
    assert n.cpu_free == 64.0 and n.memory_free == 512 * 2**30
    assert n.labels["zone"] == "z1"
    assert n.taints == [Taint(key="gpuorch.io/short-only", value="true", effect="NoSchedule")]
    assert n.sharing == []


def test_free_gpus_subtract_limits_of_bound_unfinished_pods_only():
    nodes = [make_node("gpu-a", gpus=8)]
    pods = [
        make_pod("running", node="gpu-a", gpus=2, cpu="4", memory="16Gi"),
        make_pod("bound-not-started", node="gpu-a", gpus=1, phase="Pending"),
        make_pod("terminating", node="gpu-a", gpus=1, deleting=True),  # still holds until it is gone
        make_pod("done", node="gpu-a", gpus=4, phase="Succeeded"),
        make_pod("failed", node="gpu-a", gpus=4, phase="Failed"),
        make_pod("waiting", gpus=3),  # pending, unbound: demand, not usage
        make_pod("elsewhere", node="gpu-b", gpus=2),
    ]
    s = snap(nodes, pods)
    n = node_of(s, "gpu-a")
    assert n.gpus_free == 8 - 2 - 1 - 1
    assert n.cpu_free == 64 - 4 - 1 - 1
    assert n.memory_free == (512 - 16 - 1 - 1) * 2**30
    assert s.running_gpus == 2 + 1 + 1 + 2
    assert s.pending_gpus == 3


def test_init_container_gpus_count_as_the_scheduler_counts_them():
    s = snap([make_node("gpu-a", gpus=8)], [make_pod("p", node="gpu-a", gpus=1, init_gpus=3)])
    assert node_of(s, "gpu-a").gpus_free == 8 - 3  # max(sum of containers, largest init container)


def test_four_free_gpus_on_four_nodes_is_visible_per_node():
    nodes = [make_node(f"gpu-{i}", gpus=8) for i in range(4)]
    pods = [make_pod(f"big-{i}", node=f"gpu-{i}", gpus=7) for i in range(4)]
    s = snap(nodes, pods)
    assert [n.gpus_free for n in s.nodes] == [1, 1, 1, 1]
    assert sum(n.gpus_free for n in s.nodes) == 4
    assert max(n.gpus_free for n in s.nodes) < 4  # a 4-GPU one-node request does not fit


def test_not_ready_and_cordoned_nodes_offer_nothing_free():
    s = snap([make_node("down", ready=False), make_node("cordoned", unschedulable=True)], [])
    down, cordoned = node_of(s, "down"), node_of(s, "cordoned")
    assert not down.ready and down.gpus_allocatable == 8 and down.gpus_free == 0
    assert cordoned.ready and cordoned.gpus_free == 0 and cordoned.cpu_free == 0
    assert Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule") in cordoned.taints


@pytest.mark.parametrize(
    ("labels", "sharing"),
    [
        ({}, []),
        ({"nvidia.com/mig.strategy": "single"}, ["mig"]),
        ({"nvidia.com/mig.strategy": "none"}, []),
        ({"nvidia.com/gpu.sharing-strategy": "time-slicing"}, ["time-slicing"]),
        ({"nvidia.com/gpu.sharing-strategy": "mps"}, ["mps"]),
        ({"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1"}, []),
        ({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, ["mig", "mig:1g.5gb"]),
        ({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-3g.20gb"}, ["mig", "mig:3g.20gb"]),
        # mixed: nvidia.com/gpu is the GPUs left whole; the slices are nvidia.com/mig-<profile> resources
        ({"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "14"}, []),
        ({"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.sharing-strategy": "time-slicing"}, ["time-slicing"]),
        (
            {
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            },
            ["mig", "mig:1g.10gb", "time-slicing"],
        ),
    ],
    ids=[
        "plain", "mig-single", "mig-none-is-not-mig", "time-slicing", "mps", "sharing-none",
        "mig-single-profile-from-product", "mig-single-profile-without-vendor", "mig-mixed-gpus-are-whole",
        "mig-mixed-and-time-slicing", "mig-single-and-time-slicing",
    ],
)
def test_sharing_mechanisms_from_gfd_labels(labels, sharing):
    assert node_of(snap([make_node("g", labels=labels)], []), "g").sharing == sharing


def test_node_without_gfd_labels_or_gpus():
    s = snap([make_node("cpu-0", gpus=0, product=None, memory_mib=None, pool=None)], [])
    n = node_of(s, "cpu-0")
    assert (n.gpu_product, n.gpu_memory_mib, n.gpus_allocatable, n.gpus_free, n.pool) == (None, 0, 0, 0, None)


# --------------------------------------------------------------------------- queues


def test_queues_are_the_registry_queues_plus_default_with_pending_demand():
    pods = [
        make_pod("t-0", gpus=4, queue="training", job="train-a"),
        make_pod("t-1", gpus=4, queue="training", job="train-a"),  # same Job: one pending job
        make_pod("t-2", gpus=2, queue="training"),
        make_pod("anon", gpus=1),
        make_pod("unknown-queue", gpus=1, queue="nonexistent"),  # folds into default
        make_pod("running", node="gpu-0", gpus=8, queue="training"),
    ]
    s = snap([make_node("gpu-0")], pods, make_registry("training"))
    assert [q.name for q in s.queues] == ["training", "default"]
    assert (queue_of(s, "training").pending_jobs, queue_of(s, "training").pending_gpus) == (2, 10)
    assert (queue_of(s, "default").pending_jobs, queue_of(s, "default").pending_gpus) == (2, 2)
    assert queue_of(s, "training").owners == ["*"]


def test_wait_is_zero_when_the_request_fits_now():
    s = snap([make_node("gpu-0")], [make_pod("p", node="gpu-0", gpus=4, expected=3600, started=T0 - 60)])
    assert queue_of(s, "training").estimated_wait_seconds == 0.0


@pytest.mark.parametrize(
    ("time_scale", "expected_wait"),
    [(1.0, 7200 - 600), (10.0, 7200 - 6000), (20.0, 0.0)],
    ids=["real-time", "10x: 600 real s are 6000 simulated", "overrun: frees any moment"],
)
def test_wait_from_running_pods_remaining_time_with_time_scale(time_scale, expected_wait):
    pods = [make_pod("p", node="gpu-0", gpus=8, expected=7200, started=T0 - 600)]
    s = snap([make_node("gpu-0")], pods, time_scale=time_scale)
    assert queue_of(s, "training").estimated_wait_seconds == pytest.approx(expected_wait)


def test_pending_demand_ahead_takes_the_first_freed_node():
    nodes = [make_node("gpu-0"), make_node("gpu-1")]
    running = [
        make_pod("a", node="gpu-0", gpus=8, expected=3600, started=T0),
        make_pod("b", node="gpu-1", gpus=8, expected=7200, started=T0),
    ]
    assert queue_of(snap(nodes, running), "training").estimated_wait_seconds == 3600
    ahead = make_pod("ahead", gpus=8, expected=5000, queue="training")
    s = snap(nodes, [*running, ahead])
    # "ahead" takes gpu-0 from 3600 to 8600; gpu-1 frees at 7200.
    assert queue_of(s, "training").estimated_wait_seconds == 7200


def test_demand_restricted_to_another_pool_does_not_block_a_free_node():
    nodes = [make_node("train-0", pool="train"), make_node("short-0", pool="short")]
    pods = [
        make_pod("busy", node="train-0", gpus=8, expected=3600, started=T0),
        make_pod("wants-train", gpus=8, expected=600, node_selector={"gpuorch.io/pool": "train"}),
    ]
    assert queue_of(snap(nodes, pods), "training").estimated_wait_seconds == 0.0


def test_pending_pod_that_cannot_tolerate_a_taint_does_not_take_that_node():
    nodes = [make_node("short-0", taints=[{"key": "gpuorch.io/short-only", "effect": "NoSchedule"}])]
    pods = [make_pod("intolerant", gpus=8, expected=600)]
    assert queue_of(snap(nodes, pods), "training").estimated_wait_seconds == 0.0
    tolerant = make_pod("tolerant", gpus=8, expected=600, tolerations=[{"key": "gpuorch.io/short-only", "operator": "Exists"}])
    assert queue_of(snap(nodes, [tolerant]), "training").estimated_wait_seconds == 600


def gpu_memory_affinity(min_mib: int) -> dict:
    """What the dispatcher puts on a pod that needs >= min_mib per GPU."""
    expr = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(min_mib - 1)]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}


def test_pending_pod_needing_80gb_waits_for_an_80gb_node_not_a_free_40gb_one():
    nodes = [make_node("big-0", memory_mib=81920), make_node("small-0", product=A100_40, memory_mib=40960)]
    busy = make_pod("busy", node="big-0", gpus=8, expected=1000, started=T0)
    needs_80 = make_pod("needs-80", gpus=8, expected=500)
    needs_80["spec"]["affinity"] = gpu_memory_affinity(81920)
    # it waits for big-0 (1000..1500): small-0 stays free for an 8-GPU request now
    s = snap(nodes, [busy, needs_80], reference_gpus=8)
    assert queue_of(s, "training").estimated_wait_seconds == 0.0
    # without the affinity it takes small-0 now (0..500), and the request waits for it
    plain = make_pod("plain", gpus=8, expected=500)
    assert queue_of(snap(nodes, [busy, plain], reference_gpus=8), "training").estimated_wait_seconds == 500


@pytest.mark.parametrize(
    ("expr", "fits"),
    [
        ({"key": "gpuorch.io/pool", "operator": "In", "values": ["train", "x"]}, True),
        ({"key": "gpuorch.io/pool", "operator": "NotIn", "values": ["train"]}, False),
        ({"key": "gpuorch.io/pool", "operator": "Exists"}, True),
        ({"key": "nvidia.com/mig.strategy", "operator": "DoesNotExist"}, True),
        ({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["81920"]}, False),
        ({"key": "nvidia.com/gpu.memory", "operator": "Lt", "values": ["81921"]}, True),
        ({"key": "gpuorch.io/pool", "operator": "Gt", "values": ["1"]}, False),
    ],
    ids=["in", "not-in", "exists", "does-not-exist", "gt", "lt", "gt-on-a-word"],
)
def test_node_affinity_operators(expr, fits):
    from gpuorch_inventory.core import _fits_node, _parse_node, _parse_pod

    pod = make_pod("p", gpus=1)
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}
    }
    assert _fits_node(_parse_pod(pod), _parse_node(make_node("n"))) is fits


def test_oversized_pending_pod_is_skipped_like_an_unschedulable_pod():
    pods = [make_pod("huge", gpus=16, expected=600)]
    assert queue_of(snap([make_node("gpu-0")], pods), "training").estimated_wait_seconds == 0.0


def test_higher_priority_pending_pod_goes_first():
    nodes = [make_node("gpu-0")]
    busy = make_pod("busy", node="gpu-0", gpus=8, expected=100, started=T0)
    old_low = make_pod("old-low", gpus=4, expected=1000, created=T0 - 900)
    new_high = make_pod("new-high", gpus=8, expected=50, created=T0 - 10, priority=100)
    # high takes the node 100..150, then low holds 4 GPUs 150..1150: 4 stay free from 150.
    # (Served by age instead, high would hold all 8 at 1100..1150 and the request would wait 1150.)
    s = snap(nodes, [busy, old_low, new_high])
    assert queue_of(s, "training").estimated_wait_seconds == 150


def test_with_an_admission_system_only_the_same_queue_is_ahead():
    nodes = [make_node("gpu-0")]
    pods = [
        make_pod("busy", node="gpu-0", gpus=8, expected=100, started=T0),
        make_pod("research-job", gpus=8, expected=1000, queue="research"),
    ]
    shared = snap(nodes, pods, make_registry("training", "research", admission="none"))
    assert queue_of(shared, "training").estimated_wait_seconds == 1100
    kueue = snap(nodes, pods, make_registry("training", "research", admission="kueue"))
    assert queue_of(kueue, "training").estimated_wait_seconds == 100
    assert queue_of(kueue, "research").estimated_wait_seconds == 1100


def first_waits(*args, **kw):
    """Each queue's first wait (one GPU on any node), as `estimated_wait_seconds` carries it."""
    return {q: ws[0] for q, ws in queue_shape_waits(*args, **kw).items()}


def test_unknown_durations_fall_back_to_history_then_to_the_default():
    nodes = [make_node("gpu-0")]
    pods = [make_pod("no-annotation", node="gpu-0", gpus=8, started=T0 - 60)]
    waits = first_waits("primary", nodes, pods, make_registry("training"), now=T0, time_scale=1.0)
    assert (waits["training"].source, waits["training"].seconds) == ("default", 3600.0)
    hist = observe(observe(QueueHistory(), "primary", "training", 1000.0), "primary", "training", 2000.0)
    waits = first_waits("primary", nodes, pods, make_registry("training"), now=T0, time_scale=1.0, history=hist)
    assert waits["training"].source == "history"
    assert waits["training"].seconds == pytest.approx(0.3 * 2000 + 0.7 * 1000)
    assert waits["default"].source == "default"  # history is per (cluster, queue)


def test_wait_sources_are_reported():
    nodes = [make_node("gpu-0")]
    busy = make_pod("busy", node="gpu-0", gpus=8, expected=100, started=T0)
    free = first_waits("c", nodes, [], make_registry(), now=T0, time_scale=1.0)
    full = first_waits("c", nodes, [busy], make_registry(), now=T0, time_scale=1.0)
    assert free["default"].source == "free" and full["default"].source == "runtime"


# --------------------------------------------------------------------------- earliest_start


def test_earliest_start_reservation_of_demand_ahead_blocks_the_node():
    cap = {"n": 8}
    holds = [Hold("n", 8, 100.0)]
    assert earliest_start(cap, holds, []) == 100.0
    assert earliest_start(cap, holds, [Demand(8, 1000.0)]) == 1100.0
    assert earliest_start(cap, holds, [Demand(4, 1000.0)], request_gpus=4) == 100.0  # fits beside it
    assert earliest_start(cap, holds, [Demand(4, None)], request_gpus=5) is None  # held forever
    assert earliest_start(cap, [Hold("n", 8, None)], []) is None
    assert earliest_start(cap, [], [], request_gpus=9) is None


def test_earliest_start_prefers_best_fit_so_whole_nodes_stay_free():
    cap = {"a": 8, "b": 8}
    holds = [Hold("b", 6, 1000.0)]
    # the 2-GPU demand goes to "b" (fills it), leaving "a" whole for an 8-GPU request now
    assert earliest_start(cap, holds, [Demand(2, None)], request_gpus=8) == 0.0


def test_earliest_start_is_fast_enough_for_a_big_cluster():
    cap = {f"n{i}": 8 for i in range(100)}
    holds = [Hold(f"n{i}", 8, 100.0 + i) for i in range(100)]
    ahead = [Demand(1 + i % 8, 500.0 + i) for i in range(300)]
    assert earliest_start(cap, holds, ahead) is not None


# --------------------------------------------------------------------------- history


def test_measure_queue_delays_counts_each_started_gpu_pod_once_in_simulated_seconds():
    registry = make_registry("training")
    pods = [
        make_pod("a", node="g", gpus=1, queue="training", created=T0 - 100, started=T0 - 90),
        make_pod("cpu-only", node="g", gpus=0, created=T0 - 100, started=T0 - 50),
        make_pod("waiting", gpus=1, created=T0 - 100),
    ]
    obs, seen = measure_queue_delays(pods, registry, time_scale=60.0)
    assert obs == [("training", 600.0)]
    again, seen2 = measure_queue_delays(pods, registry, time_scale=60.0, seen=seen)
    assert again == [] and seen2 == seen
    _, pruned = measure_queue_delays([], registry, time_scale=60.0, seen=seen)
    assert pruned == frozenset()


def test_observe_is_pure_and_seeds_the_ewma():
    h0 = QueueHistory(alpha=0.5)
    h1 = observe(h0, "c", "q", 100.0)
    h2 = observe(h1, "c", "q", 300.0)
    assert h0.ewma("c", "q") is None and h1.ewma("c", "q") == 100.0 and h2.ewma("c", "q") == 200.0
    assert h2.count("c", "q") == 2 and h2.ewma("other", "q") is None


# --------------------------------------------------------------------------- cache, reachability, change


def test_datasets_cached_are_the_registry_ones_plus_what_gpuorch_staged():
    s = snap([], [], make_registry(datasets=["imagenet@v3"]), staged={"coco@2017", "imagenet@v3"})
    assert s.registry.datasets_cached == ["imagenet@v3", "coco@2017"]


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("primary.imagenet@v3", ("primary", "imagenet@v3")),
        ("primary.imagenet=v3", ("primary", "imagenet@v3")),
        ("primary.org/data.set@v1.2", ("primary", "org/data.set@v1.2")),
        ("primary.noversion", None),
        ("nocluster", None),
    ],
)
def test_staged_keys(key, parsed):
    assert parse_staged_key(key) == parsed


def test_staged_entries_as_the_dispatcher_writes_them_value_first():
    value = b'{"cluster": "edge", "ref": "imagenet@v3", "at": 1.0}'
    assert parse_staged_entry("edge.3f2a9c0d1e2b4a5c", value) == ("edge", "imagenet@v3")
    assert parse_staged_entry("edge.coco@2017", b"") == ("edge", "coco@2017")
    assert parse_staged_entry("edge.3f2a9c0d1e2b4a5c", b"not json") is None
    assert parse_staged_entry("edge.3f2a9c0d1e2b4a5c", b'{"cluster": "edge", "ref": 3}') is None


def test_staged_refs_pick_the_cluster():
    entries = {
        "a.h1": b'{"cluster": "a", "ref": "x@1"}',
        "b.h2": b'{"cluster": "b", "ref": "y@1"}',
        "a.z=2": b"1",
        "garbage": b"",
    }
    assert staged_refs(entries, "a") == {"x@1", "z@2"}


def test_unreachable_snapshot_keeps_the_last_observation_time_and_says_why():
    ok = snap([make_node("gpu-0")], [], staged={"coco@2017"})
    later = T0 + 42
    s = unreachable_snapshot(ok, "primary", make_registry("training"), later, "unreachable: connection refused")
    assert (s.reachable, s.observed_at, s.published_at) == (False, T0, later)
    assert s.error == "unreachable: connection refused"
    assert s.age(later) == 42
    assert "coco@2017" in s.registry.datasets_cached
    assert [n.name for n in s.nodes] == ["gpu-0"]  # last known, labelled by its age


def test_unreachable_snapshot_of_a_cluster_never_observed():
    s = unreachable_snapshot(None, "edge", make_registry(), T0, "unreachable: timeout", time_scale=30.0)
    assert (s.reachable, s.observed_at, s.nodes, s.time_scale) == (False, 0.0, [], 30.0)


def test_snapshot_changed_ignores_timestamps_but_not_facts():
    nodes = [make_node("gpu-0")]
    a = snap(nodes, [])
    later = build_snapshot(
        "primary", nodes, [], make_registry("training"), now=T0 + 5, observed_at=T0 + 5, time_scale=1.0
    )
    assert not snapshot_changed(a, later)
    assert snapshot_changed(None, a)
    busy = snap(nodes, [make_pod("p", node="gpu-0", gpus=1)])
    assert snapshot_changed(a, busy)
    gone = unreachable_snapshot(a, "primary", make_registry("training"), T0 + 5, "x")
    assert snapshot_changed(a, gone)
    assert not snapshot_changed(gone, msgspec.structs.replace(gone, error="y", published_at=T0 + 9))


def test_snapshot_changed_ignores_predictable_wait_drift_but_not_news():
    nodes = [make_node("gpu-0")]
    registry = make_registry("training")

    def at(t: float, pods: list, scale: float = 1.0, **kw) -> ClusterSnapshot:
        return build_snapshot("primary", nodes, pods, registry, now=t, observed_at=t, time_scale=scale, **kw)

    pods = [make_pod("p", node="gpu-0", gpus=8, expected=7200, started=T0)]
    a = at(T0, pods)
    drift = at(T0 + 3000, pods)
    assert queue_of(drift, "training").estimated_wait_seconds == 4200
    assert not snapshot_changed(a, drift)  # exactly the elapsed time: a consumer can age it
    # the job was replaced by one with 100 min to go: same nodes and counts, but the wait jumped
    replaced = at(T0 + 3000, [make_pod("q", node="gpu-0", gpus=8, expected=6000, started=T0 + 3000)])
    assert snapshot_changed(a, replaced)
    # overrun: the estimate stays at 0 while time passes
    assert not snapshot_changed(at(T0 + 8000, pods), at(T0 + 9000, pods))
    # a wait from history does not move with time: not news either
    unknown = [make_pod("u", node="gpu-0", gpus=8, started=T0)]
    hist = observe(QueueHistory(), "primary", "training", 5000.0)
    h1, h2 = at(T0, unknown, history=hist), at(T0 + 600, unknown, 10.0, history=hist)
    assert queue_of(h2, "training").estimated_wait_seconds == 5000
    assert not snapshot_changed(h1, msgspec.structs.replace(h2, time_scale=1.0))
    assert snapshot_changed(h1, at(T0 + 600, unknown, history=observe(hist, "primary", "training", 50000.0)))


def test_snapshot_round_trips_through_the_wire_format():
    s = snap(
        [make_node("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}])],
        [make_pod("p", node="gpu-0", gpus=2, expected=100, started=T0)],
    )
    assert decode_snapshot(encode(s)) == s


def test_timestamps_in_both_spellings():
    assert parse_time("2026-11-30T06:00:00Z") == parse_time("2026-11-30T06:00:00+00:00")
    assert parse_time("2026-11-30T06:00:00.500000+00:00") == parse_time("2026-11-30T06:00:00Z") + 0.5
    assert parse_time("garbage") is None and parse_time(None) is None


def test_node_and_gpu_names_are_taken_verbatim():
    s = snap([make_node("b", product=A100_80), make_node("a", product=A100_40)], [])
    assert [(n.name, n.gpu_product) for n in s.nodes] == [("a", A100_40), ("b", A100_80)]


def test_pod_starts_carry_gpuorchs_labels_and_trace_context():
    from gpuorch_inventory.core import observe_pod_starts

    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    pod = make_pod("att-pod", node="g", gpus=2, queue="training", created=T0 - 30, started=T0 - 20)
    pod["metadata"]["labels"] |= {"gpuorch.io/workload": "wl-1", "gpuorch.io/attempt": "wl-1-a1"}
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "b"}, {"name": "TRACEPARENT", "value": tp}]
    cpu = make_pod("cpu", node="g", created=T0 - 30, started=T0 - 29)
    starts, seen = observe_pod_starts([pod, cpu], make_registry("training"), time_scale=10.0)
    assert [s.name for s in starts] == ["cpu", "att-pod"], "in order of start, whatever the listing's"
    first = starts[1]
    assert (first.workload, first.attempt, first.traceparent, first.queue) == ("wl-1", "wl-1-a1", tp, "training")
    assert (first.created, first.started, first.delay_s, first.gpus) == (T0 - 30, T0 - 20, 100.0, 2)
    assert starts[0].workload is None and starts[0].traceparent is None
    assert observe_pod_starts([pod, cpu], make_registry("training"), time_scale=10.0, seen=seen)[0] == []
