"""The router holds one string per workload id: its projection's view, its gate's and its state's
tables and the trace context all key by the id it made when it accepted the submit
(`Router.own_id`), not by the copy each echo decoded from the log carries (memory:
docs/performance.md, *Memory per pending workload*)."""

from __future__ import annotations

from gpuorch.dev.bench.pending import _router_state, measure_one, wire_of


def _keys(table: dict[str, object], wid: str) -> list[str]:
    return [k for k in table if k == wid]


def test_every_table_of_the_router_keys_a_workload_by_one_string() -> None:
    wire = wire_of(3)
    r = _router_state(False, wire)
    assert len(r.follower.projection.workloads) == 3
    for wid, view in r.follower.projection.workloads.items():
        own = _keys(r.gate.workloads, wid)[0]  # the id the router made (its own events carry it)
        assert wid is own and view.workload_id is own
        tables = (r.gate.seqs, r.gate.running, r.state.seqs, r.state.published, r.follower.traceparents)
        assert all(_keys(t, wid)[0] is own for t in tables)  # type: ignore[arg-type]
        assert r.gate.running[wid].workload_id is own
        assert all(a.attempt_id.startswith(wid) for a in view.attempts.values())


def test_the_pending_bench_measures_each_service() -> None:
    """(A handful of workloads: that it runs and counts something, not the figure.)"""
    for service in ("router", "dispatcher", "fencer"):
        assert measure_one(service, 20, False, True) > 0
