"""Watches instead of polling (issue 12 item 4): the dispatcher's and inventory's API calls
against a cluster do not grow with the number of live attempts.

Counted by the services themselves (every call goes through `ApiClient.call_api`, counted in
`gpuorch_kube_requests_total`), read from their metrics endpoints over two windows of the same
length (three watch periods of the dispatcher): one with no live attempt, one with 50.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections import Counter

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import events as ev
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e
# 50 pods of three containers each (gpuorch's agent stages and uploads beside every program) on a
# 2-core machine that also serves the clusters' API: a call may wait seconds for a CPU. A cluster
# is lost only after it failed calls for longer than that (the default is tuned for real API servers)
E2E_ENV = {"GPUORCH_LOST_AFTER": "8"}

LINE = re.compile(r'^gpuorch_kube_requests_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$', re.M)


def metrics_url(system: System, service: str) -> str:
    pid = system.procs[service].pid
    doc = json.loads((system.state_dir / "metrics" / f"{service}-{pid}.json").read_text())
    return str(doc["url"])


def kube_calls(url: str) -> Counter[tuple[str, str, str]]:
    """(cluster, verb, resource) -> calls so far, as the service reports them."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: Counter[tuple[str, str, str]] = Counter()
    for m in LINE.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        out[(labels["cluster"], labels["verb"], labels["resource"])] += int(float(m.group("value")))
    return out


def by_verb(c: Counter[tuple[str, str, str]]) -> Counter[str]:
    """Calls by verb; the liveness probe (GET /version, per cluster on its own timer: issue 27)
    counted apart, as `probe`."""
    out: Counter[str] = Counter()
    for (_cluster, verb, res), n in c.items():
        out["probe" if res == "version" else verb] += n
    return out


async def window(urls: dict[str, str]) -> dict[str, Counter[str]]:
    """Calls per service and verb while the dispatcher opens three more watches on `alpha`'s Jobs."""
    d0 = {s: await asyncio.to_thread(kube_calls, u) for s, u in urls.items()}
    start = d0["dispatcher"][("alpha", "watch", "jobs")]

    async def three_watch_periods() -> bool:
        return (await asyncio.to_thread(kube_calls, urls["dispatcher"]))[("alpha", "watch", "jobs")] >= start + 3

    await assert_eventually(three_watch_periods, timeout=60, interval=0.2)
    d1 = {s: await asyncio.to_thread(kube_calls, u) for s, u in urls.items()}
    return {s: by_verb(d1[s] - d0[s]) for s in urls}


async def test_api_calls_do_not_grow_with_live_attempts(system: System, client: Client) -> None:
    urls = {s: metrics_url(system, s) for s in ("dispatcher", "inventory")}
    await assert_eventually(lambda: by_verb(kube_calls(urls["dispatcher"]))["watch"] > 0, timeout=30)
    idle = await window(urls)

    cpu = {"gpus": 0, "cpu": "1", "memory": "1Gi"}
    wids = await asyncio.gather(*(client.submit(train(f"calls-{i}", steps=3000, resources=cpu)) for i in range(50)))

    async def all_live() -> bool:
        n = 0
        for w in wids:
            n += any(isinstance(e, ev.Running) for _, e in await client.events(w))
        assert n == len(wids), f"{n} of {len(wids)} running"
        return True

    await assert_eventually(all_live, timeout=240, interval=1.0)
    busy = await window(urls)
    print(f"kube calls per window: idle {idle} busy {busy}")  # the figures in docs/performance.md
    try:
        for s in urls:
            assert idle[s]["list"] == busy[s]["list"] == 0, (s, idle, busy)  # one list at start, then watches only
            assert idle[s]["get"] == busy[s]["get"] == 0, (s, idle, busy)
            # per resource, not per attempt (that would be 50 more): a watch the server ends early
            # (a slow reader on a loaded machine) is opened again, so a window may hold twice as many
            assert busy[s]["watch"] <= 2 * idle[s]["watch"] + 4, (s, idle, busy)
            assert busy[s]["probe"] <= 2 * idle[s]["probe"] + 4, (s, idle, busy)  # per cluster, not per attempt
        assert idle["inventory"]["probe"] == 0, ("inventory probes only a suspected cluster", idle)
        assert busy["dispatcher"]["watch"] + busy["dispatcher"]["list"] + busy["dispatcher"]["get"] < 50, (
            "fewer calls in the window than live attempts", busy)
        # quiet is not unreachable: open watches with little to say still count as answers; no attempt is lost
        lost = [w for w in wids if any(isinstance(e, ev.Lost) for _, e in await client.events(w))]
        assert not lost, lost
    finally:
        await asyncio.gather(*(client.cancel(w) for w in wids))
