"""The services' compact views (`Projection(compact=True)`, gpuorch.projection) answer what the
services ask exactly as whole views do, over random event histories; and a compact projection
restored from its snapshot (`Follower.restore`: decoded, then `compact_all`) is the one dumped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch.compaction import (
    _ATTEMPT_TIMES,
    _CHECKPOINT,
    _OUTPUT,
    _REASON,
    _VIEW_TIMES,
    Attempts,
    Times,
    _Root,
    settled,
)
from gpuorch.follow import Follower
from gpuorch.projection import AttemptView, Projection, WorkloadView, dump_projection, load_projection
from gpuorch_dispatcher.core import estimated_queue_wait
from gpuorch_proto import Event, encode
from gpuorch_router.preempt import capacity_clusters
from tests.snapshot.histories import MAKERS, histories
from tests.support.builders import NOW

_decode = msgspec.json.Decoder(Event).decode


def fold(history: list[tuple[int, Event]], compact: bool) -> Projection:
    """Each projection folds its own decoded copy of the log (as each service process does)."""
    p = Projection(retire=True, compact=compact)
    for seq, e in history:
        p.apply(_decode(encode(e)), seq)
    return p


def decision_answers(v: WorkloadView) -> object:
    """What the services read of a view's routing decision."""
    d = v.decision
    if d is None:
        return None
    return (
        d.workload_id, d.outcome, d.cluster, d.queue, d.placement, d.decided_at, capacity_clusters(d),
        [(x.cluster, x.eligible, [c for c in x.checks if not c.ok]) for x in d.verdicts],
        # the router's learning pass: staging on the promoted attempt's cluster
        {x.cluster: (x.estimate.data_staging, x.estimate.image_staging) for x in d.verdicts if x.estimate is not None},
        # the dispatcher's requeue limit: the router's queue-wait estimate for each attempt's cluster
        {aid: estimated_queue_wait(v, a) for aid, a in v.attempts.items()},
    )  # fmt: skip


def assert_same_answers(c: WorkloadView, w: WorkloadView) -> None:
    drop = {"decision": None, "history": [], "idempotency_key": None}
    assert replace(c, **drop) == replace(w, **drop)  # type: ignore[arg-type]
    assert c.workload == w.workload  # the document, equal (shared parts, same values)
    assert decision_answers(c) == decision_answers(w)
    assert (c.terminal, c.live_attempts, c.latest_attempt, c.next_attempt_number) == (
        w.terminal, w.live_attempts, w.latest_attempt, w.next_attempt_number,
    )  # fmt: skip
    assert settled(c) == settled(w)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_compact_projection_answers_as_the_whole_one(history: list[tuple[int, Event]]) -> None:
    whole, compact = fold(history, False), fold(history, True)
    assert whole.workloads.keys() == compact.workloads.keys()
    assert whole.retired == compact.retired  # retired records: the same whatever the live form
    assert whole.last_seq == compact.last_seq
    for wid, w in whole.workloads.items():
        assert_same_answers(compact.workloads[wid], w)
        assert not compact.workloads[wid].history


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_compact_projection_restores_from_its_snapshot(history: list[tuple[int, Event]]) -> None:
    live = fold(history, True)
    f = Follower()
    assert f.projection.compact, "the services' follower keeps compact views"
    f.restore(load_projection(dump_projection(live)), {w: {"traceparent": f"00-{w}"} for w in live.workloads})
    assert f.projection.workloads == live.workloads
    assert f.projection.retired == live.retired
    for wid in live.workloads:
        assert f.traceparent(wid) == f"00-{wid}"


def test_a_compact_view_shares_the_parts_of_equal_documents() -> None:
    from gpuorch_proto import event_id
    from gpuorch_proto import events as ev
    from tests.support.builders import NOW, make_workload

    p = Projection(retire=True, compact=True)
    for i in range(2):
        wid = f"w{i}"
        wl = _decode(encode(ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=NOW, workload=make_workload(f"t{i}", gpus=1))))
        p.apply(wl, i + 1)
    a, b = (p.workloads[w].workload for w in ("w0", "w1"))
    assert a is not None and b is not None and a != b
    assert a.spec.resources is b.spec.resources and a.spec.retry is b.spec.retry


# --- the packed containers and fields of compact views -----------------------------------------

_kinds = st.sampled_from(["submitted", "routed", "created", "running", "fence-requested", "finished"])
_ops = st.lists(st.tuples(st.sampled_from(["set", "setdefault", "pop", "del", "get"]), _kinds, st.floats(allow_nan=False)), max_size=30)


@given(ops=_ops)
def test_packed_times_behave_as_a_dict(ops: list[tuple[str, str, float]]) -> None:
    d: dict[str, float] = {}
    a = AttemptView("w-a1", 1, 1, "east", times=b"")  # type: ignore[arg-type]  # (packed: a compact attempt's)
    t = a.times
    assert isinstance(t, Times)
    for op, k, at in ops:
        outcomes = []
        for m in (d, t):
            try:
                if op == "set":
                    m[k] = at
                    got: object = None
                elif op == "setdefault":
                    got = m.setdefault(k, at)
                elif op == "pop":
                    got = m.pop(k, None)
                elif op == "del":
                    del m[k]
                    got = None
                else:
                    got = (m.get(k), m.get(k, -1.0), k in m)
            except KeyError:
                got = KeyError
            outcomes.append(got)
        assert outcomes[0] == outcomes[1]
        assert list(t) == list(d) and list(t.items()) == list(d.items()) and len(t) == len(d)
        assert t == d and d == t and dict(t) == d
        b = AttemptView("w-a1", 1, 1, "east", times=dict(d))
        _ATTEMPT_TIMES.pack(b)
        assert isinstance(b.times, Times) and b.times == t and list(b.times.items()) == list(d.items())
        assert replace(a).times == d and type(_ATTEMPT_TIMES.slot.__get__(replace(a))) is bytes  # a copy keeps the packed form


@given(ids=st.lists(st.sampled_from(["w-a1", "w-a2", "w-a3"]), max_size=6))
def test_a_compact_views_attempts_behave_as_a_dict(ids: list[str]) -> None:
    d: dict[str, AttemptView] = {}
    m = Attempts()
    for n, aid in enumerate(ids):
        a = AttemptView(aid, n, 1, "east")
        d[aid] = m[aid] = a
        assert list(m) == list(d) and list(m.items()) == list(d.items()) and list(m.values()) == list(d.values())
        assert m == d and len(m) == len(d) and all(m[k] is d[k] and m.get(k) is d[k] and k in m for k in d)
        assert m.get("w-a9") is None and "w-a9" not in m
    for aid in list(d):
        del d[aid], m[aid]
        assert m == d and list(m) == list(d)


def _pending(compact: bool) -> Projection:
    """One workload routed and its attempt created with the dispatcher's paths and job name."""
    history = [
        (1, MAKERS["submitted"]("w0-a", 0, 1, NOW)), (2, MAKERS["routed"]("w0-a", 0, 1, NOW + 1)),
        (3, MAKERS["attempt-created"]("w0-a", 0, 1, NOW + 2)),
    ]  # fmt: skip
    return fold(history, compact)


def test_a_pending_compact_view_holds_its_times_packed_and_its_paths_and_reason_derived() -> None:
    c, w = _pending(True).workloads["w0-a"], _pending(False).workloads["w0-a"]
    a = c.attempts["w0-a-a1"]
    assert isinstance(c.times, Times) and isinstance(a.times, Times) and isinstance(c.attempts, Attempts)
    assert type(_VIEW_TIMES.slot.__get__(c)) is bytes and type(_ATTEMPT_TIMES.slot.__get__(a)) is bytes
    assert type(_OUTPUT.slot.__get__(a)) is _Root and type(_CHECKPOINT.slot.__get__(a)) is _Root
    assert _REASON.slot.__get__(c) is a  # the reason is derived from the attempt whose Job it names
    wa = w.attempts["w0-a-a1"]
    assert (a.output_path, a.checkpoint_path) == (wa.output_path, wa.checkpoint_path) == (
        "/store/prod/w0-a/attempts/w0-a-a1", "/store/ckpt/w0-a/attempts/w0-a-a1/checkpoints",
    )  # fmt: skip
    assert type(a.output_path) is str and c.reason == w.reason == "Job w0-a-a1 created on east; waiting for the cluster to place its pods"
    assert c.times == w.times and a.times == wa.times
    assert_same_answers(c, w)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_compact_projections_snapshot_has_the_whole_views_format(history: list[tuple[int, Event]]) -> None:
    """What an older release reads: plain dicts and strings, as the whole views'."""
    whole, compact = fold(history, False), fold(history, True)
    keep = ("times", "attempts", "reason", "status", "epoch")
    raw_w, raw_c = (msgspec.msgpack.decode(dump_projection(p))["workloads"] for p in (whole, compact))
    assert {w: {k: v[k] for k in keep} for w, v in raw_c.items()} == {w: {k: v[k] for k in keep} for w, v in raw_w.items()}
    old = msgspec.msgpack.Decoder(dict[str, Any])  # a reader that knows nothing of the compact form
    assert old.decode(dump_projection(compact))["workloads"] == raw_c
