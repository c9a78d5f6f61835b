"""How long the web view keeps an attempt's activity facts (gpuorch.observe.facts): pure rules
and the bounded cache; the reading itself runs end to end in tests/e2e/test_activity.py."""

from __future__ import annotations

from dataclasses import replace

from gpuorch.observe import facts as fx
from gpuorch.observe.activity import Unknown
from gpuorch.observe.facts import FactsCache, Sources, ttl
from tests.observe.test_activity import T0, facts

END = T0 + 100  # `facts()`'s pods let go then


def test_a_live_attempt_is_read_again_soon_and_a_measured_finished_one_never() -> None:
    assert ttl(facts(outcome="live"), END) == fx.LIVE_TTL
    assert ttl(facts(), END + fx.SETTLE) is None
    assert ttl(facts(), END + fx.SETTLE - 1) == fx.RETRY_TTL  # its last samples may not be scraped yet
    assert ttl(facts(held_use=Unknown("Prometheus at http://p did not answer")), END + 3600) == fx.RETRY_TTL
    assert ttl(facts(progress=Unknown("no progress yet")), END + 3600) == fx.RETRY_TTL
    # no GPU: only the progress is measured; never placed and over: nothing more to measure
    assert ttl(facts(gpus=0.0, held_use=Unknown("it holds no GPU"), compute_use=Unknown("it holds no GPU")), END + fx.SETTLE) is None
    assert ttl(facts(held=None, held_use=Unknown("no window"), outcome="cancelled"), END) is None


def test_the_cache_drops_the_least_recently_used_and_what_a_new_event_changed() -> None:
    cache = FactsCache(Sources(None, {}, None), size=2)
    a, b, c = (facts(attempt_id=x) for x in ("a", "b", "c"))
    now = END + fx.SETTLE
    cache.put(a, 1, now)
    cache.put(b, 1, now)
    assert cache.fresh("a", 1, now) is a  # a used: b is now the least recent
    cache.put(c, 1, now)
    assert list(cache.entries) == ["a", "c"] and cache.fresh("b", 1, now) is None
    assert cache.fresh("a", 2, now) is None  # its workload had an event since
    live = replace(facts(attempt_id="l"), outcome="live")
    cache.put(live, 5, now)
    assert cache.fresh("l", 5, now + fx.LIVE_TTL - 0.1) is live and cache.fresh("l", 5, now + fx.LIVE_TTL) is None
    assert len(cache.entries) == 2
