"""`explain`: why here, why not there, why still waiting, why rejected."""

from __future__ import annotations

import pytest

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_router.explain import render_explain
from gpuorch_router.policy import route
from tests.support.builders import (
    A100_40,
    NOW,
    make_input,
    make_nodes,
    make_queue,
    make_snapshot,
    make_workload,
    snapshots,
)


def _seed_world() -> dict[str, ClusterSnapshot]:
    return snapshots(
        make_snapshot(
            "primary",
            nodes=make_nodes("p", 4, free=0),
            queues=[make_queue("training", wait="2h")],
            datasets_cached=["imagenet@v3"],
        ),
        make_snapshot("spare", nodes=make_nodes("s", 4), bandwidth_mbps={"s3-east": 100}),
        make_snapshot("short", artifact_stores=["scratch"], bandwidth_mbps={"s3-east": 100}),
        make_snapshot("small", nodes=make_nodes("m", 4, product=A100_40, memory_mib=40960)),
    )


@pytest.mark.parametrize(
    ("workload", "world", "fragments"),
    [
        pytest.param(
            make_workload(
                inputs=[make_input("imagenet@v3", 1080, ["s3-east"])], output_store="prod", gpu_memory_gib=80
            ),
            _seed_world,
            [
                "ROUTED to primary (queue training)",
                "Why primary:",
                "3h2m to result = queue 2h + staging 0s",
                "INPUT_DATA: imagenet@v3 cached",
                "Why not there:",
                "spare: eligible but slower or dearer: 4h2m vs 3h2m",
                "data +3h, queue -2h",
                "short: ineligible",
                "[permanent] ARTIFACT_STORE: cannot reach output store 'prod'",
                "small: ineligible",
                "[permanent] GPU_MEMORY: needs >= 80 GiB per GPU; largest here 40 GiB",
                "-> lower resources.gpu_memory_gib",
            ],
            id="routed: why primary and why not spare, short or small",
        ),
        pytest.param(
            make_workload(gpu_memory_gib=80),
            lambda: snapshots(
                make_snapshot(
                    "primary", reachable=False, error="dial tcp: i/o timeout", observed_at=NOW - 900
                ),
                make_snapshot("small", nodes=make_nodes("m", 4, product=A100_40, memory_mib=40960)),
            ),
            [
                "WAITING",
                "Why still waiting",
                "primary:",
                "[capacity ] CLUSTER_UNREACHABLE: unreachable: dial tcp: i/o timeout (last observed 900s ago)",
                "-> unblocks when inventory observes the cluster again",
                "Never eligible as specified:",
                "small:",
            ],
            id="waiting: what blocks it and what would unblock it",
        ),
        pytest.param(
            make_workload(output_store="prod"),
            lambda: snapshots(make_snapshot("short", artifact_stores=["scratch"])),
            ["REJECTED", "Why rejected", "[permanent] ARTIFACT_STORE", "-> choose an output store"],
            id="rejected: every cluster's permanent reasons",
        ),
    ],
)
def test_render_explain(workload, world, fragments) -> None:  # type: ignore[no-untyped-def]
    text = render_explain(route(workload, "wl-7", world(), NOW))
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} missing from:\n{text}"


def test_estimate_table_lists_every_eligible_cluster_best_first() -> None:
    d = route(make_workload(inputs=[make_input("imagenet@v3", 1080, ["s3-east"])]), "w", _seed_world(), NOW)
    text = render_explain(d)
    table = text.split("best first")[1].split("Why")[0]
    rows = [line.split()[0] for line in table.strip().splitlines()[1:]]
    assert rows[0] == "cluster"
    # small has no path to the data; short and spare tie on score, so name order
    assert rows[1:] == ["primary", "short", "spare"]
    assert set(rows[1:]) == {v.cluster for v in d.verdicts if v.eligible}


def test_explain_says_where_the_run_time_came_from() -> None:
    """Learnt runs of the class on the cluster's model, with the declared value it replaced; the
    declared value when nothing is learnt (issue 30)."""
    from gpuorch_router.history import MeasuredTimeline, RoutingHistory, update_history
    from tests.support.builders import A100_80

    world = snapshots(make_snapshot("spare", nodes=make_nodes("s", 2, product=A100_80)))
    wl = make_workload(workload_class="resnet-ft", expected_runtime="2h")
    plain = render_explain(route(wl, "w", world, NOW))
    assert f"run 2h on {A100_80}: declared 2h; no runs learnt" in plain
    h: RoutingHistory | None = None
    for i in range(37):  # 1h20m each, declared 2h each time
        h = update_history(h, MeasuredTimeline(cluster="spare", workload_key="resnet-ft", gpu_product=A100_80, compute_started_at=0.0,
                                               finished_at=4800.0 + i % 2, workload_id=f"r{i}", declared_seconds=7200.0))  # fmt: skip
    text = render_explain(route(wl, "w", world, NOW, history=h))
    line = next(x for x in text.splitlines() if x.strip().startswith("run "))
    assert line == f"  run 1h21m on {A100_80}: p50 1h20m of 32 runs of class resnet-ft (weight 0.95); declared 2h", line
