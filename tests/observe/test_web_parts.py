"""The web view's pure parts: a pipeline's graph layout (gpuorch.observe.dag), capacity over time
(gpuorch.observe.capacity) and the base path's rule (gpuorch.observe.web.base_path)."""

from __future__ import annotations

import pytest

from gpuorch.observe import capacity, dag
from gpuorch.observe.web import base_path
from gpuorch_proto.events import PipelineChild
from tests.observe.fleet import STAGES, free, pending, snapshots


def _children(spec: list[tuple[str, tuple[str, ...]]]) -> list[PipelineChild]:
    return [PipelineChild(workload_id=f"p-{name}", stage=name, depends_on=list(deps)) for name, deps in spec]


def test_depth_is_the_longest_chain_before_a_stage() -> None:
    d = dag.depths(_children([*STAGES, ("late", ("prep", "publish"))]))
    assert d == {"prep": 0, "train": 1, "eval": 2, "export": 2, "publish": 3, "late": 4}


def test_unknown_dependencies_are_left_out_and_a_cycle_still_ends() -> None:
    d = dag.depths(_children([("a", ("ghost",)), ("b", ("a", "b")), ("c", ("d",)), ("d", ("c",))]))
    assert d["a"] == 0 and d["b"] == 1
    assert d["c"] == d["d"] == 2  # past the rest


def test_every_edge_goes_right_from_a_stage_to_what_depends_on_it() -> None:
    children = _children(list(STAGES))
    status = {"p-prep": "completed", "p-train": "running"}
    lay = dag.layout(children, status)
    nodes = {n.stage: n for n in lay.nodes}
    assert [(e.src, e.dst) for e in lay.edges] == [("prep", "train"), ("train", "eval"), ("train", "export"), ("eval", "publish"), ("export", "publish")]
    for e in lay.edges:
        src, dst = nodes[e.src], nodes[e.dst]
        assert src.x + dag.NODE_W < dst.x
        assert e.path.startswith(f"M{src.x + dag.NODE_W:.1f},{src.y + dag.NODE_H / 2:.1f} ")
        assert e.path.endswith(f" {dst.x:.1f},{dst.y + dag.NODE_H / 2:.1f}")
    assert nodes["eval"].x == nodes["export"].x and nodes["eval"].y != nodes["export"].y
    assert (nodes["prep"].colour, nodes["train"].colour, nodes["eval"].status) == (dag.COLOURS["completed"], dag.COLOURS["running"], "pending")
    assert lay.depth == 4
    for n in lay.nodes:  # inside the drawing
        assert 0 <= n.x and n.x + dag.NODE_W <= lay.width and 0 <= n.y and n.y + dag.NODE_H <= lay.height


def test_a_sweeps_trials_wrap_into_columns_without_overlap() -> None:
    children = _children([(f"t{i:04d}", ()) for i in range(60)] + [("best", tuple(f"t{i:04d}" for i in range(60)))])
    lay = dag.layout(children, {}, per_column=25)
    spots = {(n.x, n.y) for n in lay.nodes}
    assert len(spots) == 61
    trial_columns = {n.x for n in lay.nodes if n.stage != "best"}
    assert len(trial_columns) == 3
    best = next(n for n in lay.nodes if n.stage == "best")
    assert best.x > max(trial_columns) + dag.NODE_W and len(lay.edges) == 60
    assert lay.height <= 2 * dag.MARGIN + 25 * (dag.NODE_H + dag.GAP_Y)


def test_the_history_keeps_one_sample_per_snapshot_and_only_the_latest() -> None:
    h = capacity.History(keep=50)
    snaps = snapshots("alpha", 80)
    for sn in snaps:
        assert h.record(sn)
        assert not h.record(sn)  # read again: the same snapshot
    assert not h.record(snaps[10])  # older than the last kept
    kept = h.of("alpha")
    assert len(kept) == 50 and [s.at for s in kept] == [sn.published_at for sn in snaps[30:]]
    assert [s.gpus_free for s in kept] == [free(i) for i in range(30, 80)]
    assert [s.pending_jobs for s in kept] == [pending(i) + pending(i) // 3 for i in range(30, 80)]
    assert h.of("beta") == []


def test_a_chart_puts_the_first_sample_left_the_last_right_and_zero_at_the_bottom() -> None:
    samples = [capacity.sample_of(sn) for sn in snapshots("alpha", 21)]
    c = capacity.capacity_chart(samples, width=200, height=100)
    assert c.top == 100  # 64 GPUs -> the next round value
    lines = {line.name: line for line in c.lines}
    free_pts = [tuple(map(float, p.split(","))) for p in lines["free"].points.split()]
    assert len(free_pts) == 21 and free_pts[0][0] == 0.0 and free_pts[-1][0] == 200.0
    assert [y for _, y in free_pts] == [pytest.approx(100 - free(i)) for i in range(21)]
    assert lines["GPUs"].last == 64 and lines["free"].last == free(20)
    assert c.span == 40.0 and c.ticks == [(0.0, 100.0), (50.0, 50.0), (100.0, 0.0)]
    q = capacity.queue_chart(samples, width=200, height=100)
    assert [line.name for line in q.lines] == ["training", "batch"] and q.lines[0].last == pending(20)


def test_a_chart_of_nothing_or_of_one_sample() -> None:
    empty = capacity.capacity_chart([])
    assert empty.samples == 0 and all(line.points == "" for line in empty.lines) and empty.top == 1
    one = capacity.capacity_chart([capacity.sample_of(snapshots("alpha", 1)[0])], width=200)
    assert one.lines[0].points.startswith("200.0,")


@pytest.mark.parametrize(("given", "expected"), [("", ""), ("/", ""), ("/gpuorch", "/gpuorch"), ("/ops/gpuorch/", "/ops/gpuorch"),
                                                 (" /a.b_c~d-e ", "/a.b_c~d-e")])  # fmt: skip
def test_a_base_path_is_normalised(given: str, expected: str) -> None:
    assert base_path(given) == expected


@pytest.mark.parametrize(("given", "says"), [("gpuorch", "must start with '/'"), ("/a//b", "segments"), ("/a b", "segments"),
                                             ("/a/../b", "no '.' or '..'"), ("/x?y=1", "segments")])  # fmt: skip
def test_a_bad_base_path_says_what_is_wrong(given: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"base path .*") as err:
        base_path(given)
    assert says in str(err.value)
