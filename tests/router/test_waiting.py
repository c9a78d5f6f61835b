"""Waiting ends: an exclusion for a lost attempt is lifted once its cluster is observed again, and a
waiting decision is re-published (and only then) when its reasons change (issue 9, defect 4)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.context import Context

from gpuorch.config import Settings
from gpuorch.runtime.shell import Incoming
from gpuorch_proto import ClusterSnapshot, encode
from gpuorch_proto import events as ev
from gpuorch_router import core
from gpuorch_router.explain import render_explain
from gpuorch_router.policy import build_index, route
from gpuorch_router.service import Router
from tests.support.builders import NOW, make_snapshot, make_workload

W = "w-0000000042"
#: `alpha` is the only cluster that can ever run it: `beta` cannot reach the output store.
WL = make_workload(output_store="prod")


def alpha(observed_at: float, reachable: bool = True) -> ClusterSnapshot:
    return make_snapshot("alpha", reachable=reachable, observed_at=observed_at, published_at=observed_at + 0.5)


def beta(t: float) -> ClusterSnapshot:
    return make_snapshot("beta", observed_at=t, artifact_stores=["scratch"])


def world(*snaps: ClusterSnapshot) -> dict[str, Any]:
    return {s.cluster: build_index(s) for s in snaps}


def lost_history(t_request: float) -> list[ev.Base]:
    """Routed to alpha, lost there, the dispatcher asks for attempt 2 without alpha."""
    a = {"workload_id": W, "attempt_id": f"{W}-a1", "epoch": 1, "cluster": "alpha"}
    routed = route(WL, W, world(alpha(t_request - 100), beta(t_request - 100)), t_request - 100)
    return [
        ev.Submitted(workload_id=W, at=t_request - 100, workload=WL),
        ev.Routed(event_id=f"{W}.routed.1", workload_id=W, at=t_request - 100, decision=routed, attempt_number=1),
        ev.AttemptCreated(at=t_request - 99, attempt_number=1, job_name="j", output_path="/o", checkpoint_path="/c", **a),
        ev.Lost(at=t_request - 2, reason="cluster unreachable", **a),
        ev.RouteRequested(workload_id=W, at=t_request, attempt_number=2, exclude=["alpha"], reason="lost"),
    ]


def folded(events: list[ev.Base]) -> core.RouterState:
    state = core.RouterState()
    for seq, e in enumerate(events, start=1):
        state.apply(e, seq)
    return state


def failed_codes(d: Any, cluster: str) -> list[str]:
    v = next(v for v in d.verdicts if v.cluster == cluster)
    return [c.code for c in v.checks if not c.ok]


# --- the pure core -------------------------------------------------------------------------------


def test_lost_on_alpha_then_alpha_heals_routes_back_to_alpha() -> None:
    t = NOW
    state = folded(lost_history(t))
    # alpha partitioned: last observed before the loss -> waiting, excluded and unreachable
    during = core.decide(state, WL, W, 2, world(alpha(t - 5, reachable=False), beta(t)), t + 1)
    assert during.outcome == "waiting"
    assert set(failed_codes(during, "alpha")) == {"CLUSTER_UNREACHABLE", "CLUSTER_NOT_ALLOWED"}
    first = core.decision_events(W, during, 2, t + 1)
    for seq, e in enumerate(first, start=100):
        state.apply(e, seq)
    # alpha heals: inventory observes it after the route request -> the exclusion is lifted
    healed = world(alpha(t + 10), beta(t + 10))
    assert core.exclusions(state.requests.get(W), 2, healed, t + 10.5) == ()
    after = core.decide(state, WL, W, 2, healed, t + 10.5)
    assert after.outcome == "routed" and after.cluster == "alpha", after.summary
    out = core.reevaluation(state, W, 2, after, t + 10.5)
    assert [type(e) for e in out] == [ev.Routed]
    assert out[0].event_id == f"{W}.routed.2"


def test_exclusion_holds_until_observed_since_the_request_and_is_bounded() -> None:
    t = NOW
    req = core.RouteRequest(attempt_number=2, exclude=("alpha",), at=t)
    stale = {"alpha": alpha(t - 1, reachable=False)}
    assert core.exclusions(req, 2, stale, t + 30) == ("alpha",)
    assert core.exclusions(req, 2, {}, t + 30) == ("alpha",), "never observed: still excluded"
    # an observation *at* the request does not lift it; one after it does, reachable or not since
    assert core.exclusions(req, 2, {"alpha": alpha(t)}, t + 1) == ("alpha",)
    assert core.exclusions(req, 2, {"alpha": alpha(t + 0.1)}, t + 1) == ()
    assert core.exclusions(req, 2, {"alpha": alpha(t + 0.1, reachable=False)}, t + 1) == ()
    # bounded: by max_snapshot_age a pre-loss snapshot is stale, so the exclusion adds nothing
    assert core.exclusions(req, 2, stale, t + core.MAX_SNAPSHOT_AGE) == ()
    # it is the request of that attempt only
    assert core.exclusions(req, 3, stale, t + 1) == ()
    assert core.exclusions(None, 2, stale, t + 1) == ()


def test_a_restarted_router_rebuilds_the_same_exclusion_from_the_log() -> None:
    t = NOW
    events = lost_history(t)
    live, replayed = folded(events), core.RouterState()
    for seq, e in enumerate(events, start=1):  # replay, then the durable consumer redelivers the tail
        replayed.apply(e, seq)
    for seq, e in list(enumerate(events, start=1))[-2:]:
        replayed.apply(e, seq)
    assert replayed.requests == live.requests == {W: core.RouteRequest(2, ("alpha",), t)}
    snaps = world(alpha(t - 5, reachable=False), beta(t))
    assert core.decide(replayed, WL, W, 2, snaps, t + 1) == core.decide(live, WL, W, 2, snaps, t + 1)


def test_waiting_decision_is_republished_only_when_its_reasons_change() -> None:
    t = NOW
    wl = make_workload(output_store="prod", gpus=8)
    state = core.RouterState()
    state.apply(ev.Submitted(workload_id=W, at=t, workload=wl), 1)
    down = world(alpha(t - 1, reachable=False), beta(t))
    d0 = core.decide(state, wl, W, 1, down, t)
    assert d0.outcome == "waiting"
    seq = 2
    for e in core.decision_events(W, d0, 1, t):
        state.apply(e, seq)
        seq += 1
    # the same world, later (ages grow): nothing to publish, however often it is re-evaluated
    for dt in (1.0, 2.0, 30.0):
        same = core.decide(state, wl, W, 1, world(alpha(t - 1, reachable=False), beta(t + dt)), t + dt)
        assert core.reevaluation(state, W, 1, same, t + dt) == []
    # stale instead of unreachable: the reason changed -> a new decision with a new event id
    stale_world = world(alpha(t - 200), beta(t + 40))
    d1 = core.decide(state, wl, W, 1, stale_world, t + 40)
    assert d1.outcome == "waiting" and core.signature(d1) != core.signature(d0)
    out1 = core.reevaluation(state, W, 1, d1, t + 40)
    assert [type(e) for e in out1] == [ev.Unroutable]
    assert out1[0].event_id not in (f"{W}.unroutable.1", "")
    state.note_published(out1)
    # changed back a moment later: bounded rate, nothing yet ...
    d2 = core.decide(state, wl, W, 1, world(alpha(t - 1, reachable=False), beta(t + 40.2)), t + 40.2)
    assert core.reevaluation(state, W, 1, d2, t + 40.2) == []
    # ... the log echoes the first re-publish; a second later the change is published, new id again
    for e in out1:
        state.apply(e, seq)
        seq += 1
    out2 = core.reevaluation(state, W, 1, d2, t + 41.5)
    assert [type(e) for e in out2] == [ev.Unroutable]
    ids = {f"{W}.unroutable.1", out1[0].event_id, out2[0].event_id}
    assert len(ids) == 3, "every distinct decision gets its own id (JetStream de-duplicates by id)"
    assert "unreachable" in render_explain(out2[0].decision).lower()  # type: ignore[attr-defined]


def test_signature_ignores_ages_but_not_reasons() -> None:
    t = NOW
    state = core.RouterState()
    a = core.decide(state, WL, W, 1, world(alpha(t - 10, reachable=False), beta(t)), t)
    b = core.decide(state, WL, W, 1, world(alpha(t - 10, reachable=False), beta(t + 50)), t + 50)
    assert a.verdicts != b.verdicts  # the shown ages differ
    assert core.signature(a) == core.signature(b)
    c = core.decide(state, WL, W, 1, world(alpha(t + 50), beta(t + 50)), t + 50)
    assert core.signature(c) != core.signature(a)


def test_core_imports_no_io_libraries() -> None:
    forbidden = ("nats", "kubernetes", "asyncio", "structlog", "opentelemetry")
    code = f"import sys, gpuorch_router.core\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the shell: the router re-evaluates and routes once the cluster is back -----------------------


@dataclass
class _Msg:
    data: bytes

    @property
    def subject(self) -> str:  # the snapshot's own cluster subject: the router checks it
        import msgspec

        return f"gpuorch.inventory.{msgspec.json.decode(self.data)['cluster']}"


class _Publisher:
    """Captures what the router publishes and echoes it into its log, as JetStream would."""

    def __init__(self, router: Router, seq: int, got: asyncio.Event) -> None:
        self.router, self.seq, self.got = router, seq, got
        self.events: list[ev.Base] = []

    async def publish(self, events: list[ev.Base], *, context: Any = None) -> list[Any]:
        for e in events:
            self.events.append(e)
            self.seq += 1
            await self.router.on_event(_incoming(e, self.seq))  # the router follows its own output
            if isinstance(e, ev.Routed):
                self.got.set()
        return []


def _incoming(e: ev.Base, seq: int) -> Incoming:
    return Incoming(event=e, subject="gpuorch.evt.x", stream="EVT", stream_seq=seq, delivered=1, headers={}, msg_id=e.event_id, context=Context())


async def test_router_routes_back_to_the_healed_cluster_it_was_told_to_avoid() -> None:
    router = Router(Settings())
    t = time.time()
    await router.on_snapshot(_Msg(encode(alpha(t - 10, reachable=False))))
    await router.on_snapshot(_Msg(encode(beta(t))))
    events = lost_history(t)
    out: list[ev.Base] = []
    for seq, e in enumerate(events, start=1):
        out = list(await router.on_event(_incoming(e, seq)))
    assert [type(e) for e in out] == [ev.Unroutable], "partitioned and excluded: waiting"
    routed = asyncio.Event()
    pub = _Publisher(router, len(events), routed)
    router.publisher = pub  # type: ignore[assignment]
    for e in out:
        pub.seq += 1
        await router.on_event(_incoming(e, pub.seq))
    stop = asyncio.Event()
    loop = asyncio.create_task(router.reevaluate(stop))
    try:
        await router.on_snapshot(_Msg(encode(alpha(time.time()))))  # healed: observed after the request
        await asyncio.wait_for(routed.wait(), timeout=10)
    finally:
        stop.set()
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    r = next(e for e in pub.events if isinstance(e, ev.Routed))
    assert r.attempt_number == 2 and r.decision.cluster == "alpha"


async def test_router_republishes_a_waiting_decision_only_when_its_reasons_change() -> None:
    router = Router(Settings())
    t = time.time()
    await router.on_snapshot(_Msg(encode(alpha(t - 10, reachable=False))))
    await router.on_snapshot(_Msg(encode(beta(t))))
    events = lost_history(t)
    first: list[ev.Base] = []
    for seq, e in enumerate(events, start=1):
        first = list(await router.on_event(_incoming(e, seq)))
    pub = _Publisher(router, len(events), asyncio.Event())
    router.publisher = pub  # type: ignore[assignment]
    for e in first:
        pub.seq += 1
        await router.on_event(_incoming(e, pub.seq))
    # a redelivered route-requested whose decision is in the log publishes nothing again
    assert list(await router.on_event(_incoming(events[-1], len(events)))) == []
    # new snapshots, same facts: re-evaluated, never re-published
    for _ in range(5):
        await router.on_snapshot(_Msg(encode(beta(time.time()))))
        assert await router.reevaluate_once() == 0
    assert pub.events == []
    # the reason changes (unreachable -> stale, still not observed since the loss): one new decision
    await router.on_snapshot(_Msg(encode(alpha(t - 300))))
    router.republish_min_interval = 3600.0  # bounded rate: the last decision was "a moment ago"
    assert await router.reevaluate_once() == 0
    router.republish_min_interval = 0.0  # stands for the second passing
    assert await router.reevaluate_once() == 1
    assert await router.reevaluate_once() == 0
    [u] = pub.events
    assert isinstance(u, ev.Unroutable) and u.event_id != first[0].event_id
    assert "stale" in render_explain(u.decision)
