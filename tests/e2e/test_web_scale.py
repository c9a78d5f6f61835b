"""The web view with 10,000 workloads, in the real Chromium, behind a base path (issue 32).

The fleet's events are written by a generator (tests/observe/fleet.py: singles in every state,
pipelines of five stages) rather than by running 10,000 workloads through the system; the web
view folds them exactly as it folds the stream and serves them over HTTP through the real app,
under `/ops/gpuorch` as a reverse proxy would forward it. What the browser shows is checked
against the generator's own record. The time to the first page rendered and to a filter applied
are measured and printed (`-s`), not asserted (docs/web.md has them).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuorch.config import Settings
from gpuorch.observe import dag
from gpuorch.observe.web import Live, make_app
from gpuorch_proto import events as ev
from tests.observe.fleet import CLUSTERS, Fleet, fleet, free, pending, snapshots
from tests.support.browser import launch, serving
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e
N = 10_000
BASE = "/ops/gpuorch"
SAMPLES = 150


@pytest.fixture(scope="module")
def data() -> Fleet:
    return fleet(N)


async def _rows(page: Any) -> list[dict[str, str]]:
    return list(await page.locator("#workload-rows tr[data-id]").evaluate_all("""rows => rows.map(r => ({
        id: r.dataset.id, status: r.querySelector('.status').textContent, owner: r.querySelector('.owner').textContent,
        cluster: r.querySelector('.cluster').textContent, queue: r.querySelector('.queue').textContent}))"""))


async def _links(page: Any) -> list[str]:
    """Every URL the page links to or loads from: anchors, forms, images, the scripts' own."""
    return list(await page.evaluate("""() => [
        ...[...document.querySelectorAll('a[href]')].map(a => new URL(a.getAttribute('href'), document.baseURI).href),
        ...[...document.querySelectorAll('form[action]')].map(f => f.action),
        ...[...document.querySelectorAll('img[src]')].map(i => i.src)]"""))


async def test_ten_thousand_workloads_in_chromium(data: Fleet, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    truth = data.truth
    live = Live()
    t = time.perf_counter()
    for seq, e in data.events:
        live.add(seq, e)
    fold = time.perf_counter() - t
    for c in CLUSTERS:
        for sn in snapshots(c, SAMPLES, start=time.time() - 2 * SAMPLES):
            live.snapshot(sn)
    app = make_app(Settings(), live=live, follow=False, base=BASE)
    shots = Path(os.environ.get("GPUORCH_SCREENSHOTS") or tmp_path)  # GPUORCH_SCREENSHOTS=docs/screenshots: the docs' own
    shots.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {"fold and index of the events": fold}
    async with serving(app) as origin, async_playwright() as p:
        home = f"{origin}{BASE}/"
        browser = await launch(p)
        try:
            page = await browser.new_page(viewport={"width": 1500, "height": 1000})
            requested: list[str] = []
            failed: list[str] = []
            page.on("request", lambda r: requested.append(r.url))
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            links: set[str] = set()

            # -- the first page: 50 rows of 10,000, newest first ----------------------------------
            t = time.perf_counter()
            await page.goto(home)
            await page.wait_for_selector("#workload-rows tr[data-id]")
            timings["first page rendered"] = time.perf_counter() - t
            timings["first page, the browser's own DOMContentLoaded"] = await page.evaluate(
                "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd") / 1000  # fmt: skip
            newest = sorted(truth, key=lambda w: truth[w].submitted, reverse=True)
            assert [r["id"] for r in await _rows(page)] == newest[:50]
            assert await page.inner_text("#total") == str(N) and await page.inner_text("#pages") == str(N // 50)
            links |= set(await _links(page))

            # -- a filter applied: failed, then bob's -----------------------------------------------
            t = time.perf_counter()
            await page.select_option("#f-status", "failed")
            await page.wait_for_url("**status=failed**")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            timings["filter applied (status)"] = time.perf_counter() - t
            t = time.perf_counter()
            await page.select_option("#f-owner", "bob")
            await page.wait_for_url("**owner=bob**")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            timings["filter applied (status and owner)"] = time.perf_counter() - t
            expected = {w for w, x in truth.items() if x.status == "failed" and x.owner == "bob"}
            assert await page.inner_text("#total") == str(len(expected)) and len(expected) > 50
            seen: list[str] = []
            while True:  # every page of the result, by its "next" link
                rows = await _rows(page)
                assert {(r["status"], r["owner"]) for r in rows} == {("failed", "bob")}
                seen += [r["id"] for r in rows]
                if not await page.locator("#next").count():
                    break
                await page.click("#next")
                await page.wait_for_url(f"**page={len(seen) // 50 + 1}**")
            assert sorted(seen) == sorted(expected)
            links |= set(await _links(page))

            # -- free text, then a sort by a column header ----------------------------------------------
            await page.goto(home)
            t = time.perf_counter()
            await page.fill("#f-q", "P-01")
            await page.press("#f-q", "Enter")
            await page.wait_for_url("**q=P-01**")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            timings["filter applied (text)"] = time.perf_counter() - t
            assert await page.inner_text("#total") == str(sum(1 for w in truth if "p-01" in w))
            await page.click("a.sort[data-key=owner]")
            await page.wait_for_url("**sort=owner**")
            owners = [r["owner"] for r in await _rows(page)]
            assert owners == sorted(owners) and owners[0] == min(x.owner for w, x in truth.items() if "p-01" in w)
            await page.click("a.sort[data-key=owner]")
            await page.wait_for_url("**sort=-owner**")
            owners = [r["owner"] for r in await _rows(page)]
            assert owners == sorted(owners, reverse=True)
            assert await page.input_value("#f-q") == "P-01"  # the filter kept across the sort
            links |= set(await _links(page))

            # -- live: an event that puts a workload into the filter's result appears, no reload ----------
            running_gamma = {w for w, x in truth.items() if x.status == "running" and x.cluster == "gamma"}
            wid = max((w for w, x in truth.items() if x.status == "dispatched" and x.cluster == "gamma"), key=lambda w: truth[w].submitted)
            assert sum(1 for w in running_gamma if truth[w].submitted > truth[wid].submitted) < 50  # it will be on page 1
            await page.goto(f"{home}?status=running&cluster=gamma")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            assert await page.inner_text("#total") == str(len(running_gamma))
            assert not await page.locator(f'#workload-rows tr[data-id="{wid}"]').count()
            await page.evaluate("window.__loaded = 'same page'")
            seq = data.events[-1][0]
            a = {"workload_id": wid, "attempt_id": f"{wid}-a1", "epoch": 1, "cluster": "gamma"}
            live.add(seq + 1, ev.Admitted(**a, at=time.time()))
            live.add(seq + 2, ev.Running(**a, at=time.time()))
            await page.wait_for_selector(f'#workload-rows tr[data-id="{wid}"]', timeout=15000)
            assert await page.inner_text("#total") == str(len(running_gamma) + 1)
            assert await page.evaluate("window.__loaded") == "same page"
            await page.goto(f"{home}?status=failed&owner=bob&cluster=alpha")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            await page.screenshot(path=str(shots / "web-workloads-filtered.png"))

            # -- a pipeline: its graph, each stage in its state's colour, linked to its workload --------
            pid = next(p for p, stages in data.pipelines.items() if len({truth[s].status for s in stages}) == 3)
            await page.goto(f"{home}?pipeline={pid}")
            await page.wait_for_selector("#workload-rows tr[data-id]")
            assert await page.inner_text("#total") == "5"
            await page.click(f'#workload-rows td.pipeline a[href$="/pipelines/{pid}"] >> nth=0')
            await page.wait_for_selector("svg#dag a.node")
            nodes = await page.locator("svg#dag a.node").evaluate_all(
                "ns => ns.map(n => ({stage: n.dataset.stage, status: n.dataset.status, href: n.getAttribute('href'), fill: n.querySelector('rect').getAttribute('fill')}))")  # fmt: skip
            assert len(nodes) == 5 and await page.locator("svg#dag path.edge").count() == 5
            for n, child in zip(nodes, data.pipelines[pid], strict=True):
                assert n["status"] == truth[child].status and n["fill"] == dag.colour(truth[child].status), n
                assert n["href"] == f"{BASE}/workloads/{child}"
            links |= set(await _links(page))
            await page.screenshot(path=str(shots / "web-pipeline.png"))
            # a stage moves: the graph follows without a reload
            waiting = next(s for s in data.pipelines[pid] if truth[s].status == "running")
            await page.evaluate("window.__loaded = 'same page'")
            a = {"workload_id": waiting, "attempt_id": f"{waiting}-a1", "epoch": 1, "cluster": truth[waiting].cluster or ""}
            live.add(seq + 3, ev.Succeeded(**a, at=time.time(), output_path="/o"))
            live.add(seq + 4, ev.Promoted(**a, at=time.time(), output_path="/o", result_path="/r"))
            live.add(seq + 5, ev.Completed(workload_id=waiting, at=time.time(), attempt_id=a["attempt_id"], result_path="/r"))
            stage = truth[waiting].stage
            await page.wait_for_selector(f'svg#dag a.node[data-stage="{stage}"][data-status="completed"]', timeout=15000)
            assert await page.evaluate("window.__loaded") == "same page"
            await page.click(f'svg#dag a.node[data-stage="{stage}"]')
            await page.wait_for_selector("#to-pipeline")
            assert await page.get_attribute("#to-pipeline", "href") == f"{BASE}/pipelines/{pid}"
            links |= set(await _links(page))

            # -- a cluster: capacity and queue length over time ---------------------------------------
            await page.goto(f"{home}clusters")
            await page.click('#clusters a[href$="/clusters/alpha"]')
            await page.wait_for_selector("svg#capacity polyline", state="attached")
            assert await page.get_attribute("svg#capacity", "data-samples") == str(SAMPLES)
            last = {n: await page.get_attribute(f'svg#capacity polyline[data-name="{n}"]', "data-last") for n in ("GPUs", "free")}
            assert last == {"GPUs": "64", "free": str(free(SAMPLES - 1))}
            queues = await page.locator("svg#queue-length polyline").evaluate_all("ls => ls.map(l => [l.dataset.name, l.dataset.last])")
            assert queues == [["training", str(pending(SAMPLES - 1))], ["batch", str(pending(SAMPLES - 1) // 3)]]
            points = await page.get_attribute('svg#capacity polyline[data-name="free"]', "points")
            assert points is not None and len(points.split()) == SAMPLES
            on_alpha = sum(1 for x in truth.values() if x.cluster == "alpha")
            assert await page.inner_text("#to-workloads") == f"its {on_alpha} workloads"
            links |= set(await _links(page))
            await page.screenshot(path=str(shots / "web-cluster.png"), full_page=True)
            await page.click("#to-workloads")
            await page.wait_for_url("**cluster=alpha**")
            assert await page.inner_text("#total") == str(on_alpha)
            await page.goto(f"{home}report?cluster=alpha")
            await page.wait_for_selector("#report tbody tr")
            await page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth > 0)", timeout=60000)
            links |= set(await _links(page))

            # -- the base path: every link and every request under it, nothing refused ------------------
            outside = sorted({u for u in links | set(requested) if not u.startswith(f"{origin}{BASE}/")})
            assert outside == [], outside
            assert failed == [], failed
        finally:
            await browser.close()
    print(f"\nweb view, {N} workloads ({len(data.events)} events), Chromium:")
    for what, seconds in timings.items():
        print(f"  {what}: {seconds * 1000:.0f} ms")


def _get(url: str) -> tuple[int, str]:
    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(Stay).open(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location") or ""


async def test_the_cli_takes_the_base_path_from_its_flag_or_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "GPUORCH_NATS_URL": "nats://127.0.0.1:1", "GPUORCH_WEB_BASE_PATH": "/from-env"}  # no bus: pages still serve
    cli = [sys.executable, "-m", "gpuorch.cli", "--state", str(tmp_path), "web"]

    def run(*args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, env={**env, **env_extra})

    helped = await asyncio.to_thread(run, "--help")
    assert helped.returncode == 0 and "--base-path" in helped.stdout
    bad = await asyncio.to_thread(run, "--base-path", "gpuorch")
    assert bad.returncode == 2 and "--base-path: base path 'gpuorch': must start with '/'" in bad.stderr, bad.stderr
    bad_env = await asyncio.to_thread(run, GPUORCH_WEB_BASE_PATH="/a//b")
    assert bad_env.returncode == 2 and "GPUORCH_WEB_BASE_PATH: base path '/a//b'" in bad_env.stderr, bad_env.stderr
    for flag, base in (([], "/from-env"), (["--base-path", "/from-flag/"], "/from-flag")):
        proc = await asyncio.to_thread(subprocess.Popen, [*cli, "--port", "0", *flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env=env)  # fmt: skip
        try:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.startswith("gpuorch web: http://127.0.0.1:") and line.strip().endswith(f"{base}/"), line
            url = line.split(": ", 1)[1].strip()
            origin = url[: -len(f"{base}/")]

            def up(url: str = url) -> bool:
                try:
                    return _get(f"{url}healthz")[0] == 200
                except urllib.error.URLError:  # not listening yet
                    return False

            await assert_eventually(up, timeout=30)
            assert _get(f"{origin}/") == (307, f"{base}/")
            assert _get(f"{origin}/healthz")[0] == 404  # only under the base path
            status, body = _get(url)
            assert status == 200 and f'href="{base}/clusters"' in body and 'href="/clusters"' not in body
        finally:
            proc.terminate()
            proc.wait(timeout=15)
