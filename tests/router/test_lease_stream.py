"""Admission leadership against a real nats-server, as the router identity (its real permissions):
the lease in the admission bucket by compare-and-set, the term markers in the event stream, and
the stream itself refusing a release of a term that a later marker ended (the router's shell:
`Router.claim_lease`, `begin_term`, `publish_decided`, `resign`; the rules are `lease`'s)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.js import JetStreamContext

from gpuorch.config import Settings, Tuning
from gpuorch.runtime import bus
from gpuorch.runtime.shell import Publisher
from gpuorch.security import Bundle
from gpuorch_proto import Names, event_id
from gpuorch_proto import events as ev
from gpuorch_router import lease
from gpuorch_router.service import Router
from tests.support.nats import read_all

TTL = 1.5


@asynccontextmanager
async def router(url: str, identities: Bundle, names: Names, instance: str) -> AsyncIterator[Router]:
    """A router's shell on the bus as the router identity, its consumers not running."""
    nc = await nats.connect(url, max_reconnect_attempts=0, **bus.auth_options(identities.creds("router")))
    try:
        r = Router(Settings(prefix=names.prefix, tuning=Tuning(instance=instance, admission_ttl=TTL)))
        r.js = nc.jetstream(timeout=5.0)
        r.publisher = Publisher(r.js, names)
        r.kv_admission = await r.js.key_value(names.kv_admission)
        r.leadership = lease.Leadership()
        yield r
    finally:
        await nc.close()


def caught_up(r: Router) -> None:
    """As the events durable's ack floor reaching the marker would (no consumer runs here)."""
    assert r.leadership is not None
    r.leadership = dataclasses.replace(r.leadership, folded=r.leadership.marker)


def released(wid: str) -> ev.Released:
    return ev.Released(event_id=event_id(wid, "released"), workload_id=wid, at=time.time(), queue="default")


async def test_a_later_term_makes_the_stream_refuse_the_earlier_leaders_releases(
    js: JetStreamContext, names: Names, identities: Bundle, nats_url: str
) -> None:
    async with router(nats_url, identities, names, "0") as a, router(nats_url, identities, names, "1") as b:
        now = time.time()
        await a.claim_lease(now)
        await b.claim_lease(now)
        assert a.leadership is not None and b.leadership is not None
        assert (a.leadership.term, b.leadership.term) == (1, 0), "one lease, one holder"
        await a.begin_term()
        assert a.fence(now) is None, "no release before the log is folded up to the marker"
        caught_up(a)
        fence_a = a.fence(now)
        assert fence_a is not None and fence_a.term == 1
        assert await a.publish_decided([released("w-1")], fence_a, None)

        # a stops renewing; b takes the lease once it ran out (by b's clock) and marks its term
        later = now + TTL + lease.margin(TTL) + 0.01
        await b.claim_lease(later)
        assert b.leadership.term == 2
        await b.begin_term()
        caught_up(b)
        # a, late (its decision of before, or a clock that lags): the stream refuses it
        assert not await a.publish_decided([released("w-2")], fence_a, None)
        assert a.leadership.lease is None, "its term ended where the stream said so"
        fence_b = b.fence(later)
        assert fence_b is not None and await b.publish_decided([released("w-3")], fence_b, None)

        stored = [(r.event.workload_id, ev.type_tag(r.event)) for r in await read_all(js, names.stream_evt) if r.event is not None]
        assert stored == [
            ("admission", "admission-term"), ("w-1", "released"), ("admission", "admission-term"), ("w-3", "released"),
        ], stored  # fmt: skip
        terms = [(r.event.term, r.event.instance) for r in await read_all(js, names.stream_evt) if isinstance(r.event, ev.AdmissionTerm)]
        assert terms == [(1, "0"), (2, "1")]

        # a cannot take a live lease back; b resigns at its clean stop, and a takes the next term at once
        await a.claim_lease(later)
        assert a.leadership.term == 0
        await b.resign()
        await a.claim_lease(later)
        assert a.leadership.term == 3
