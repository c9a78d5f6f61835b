"""Allocated is not productive (issue 31; docs/activity.md), end to end: the seed's three cases
side by side with a healthy control, on the real embedded system, with a real Prometheus
(Debian's) scraping the local clusters' dcgm-exporter endpoints and gpuorch's services.

* a three-stage pipeline whose CPU stage (`--device cpu`) asks for a GPU: (a) never-used;
* a 4-GPU training job whose input is read slowly (two thirds of each step waiting): (b) data-bound;
* a one-node 4-GPU gang (4 workers x 1 GPU, same_node) facing 4 free GPUs on 4 nodes: (c) shape;
* a 2-GPU job that only computes: (e) healthy.

`gpuorch explain -o json` and `gpuorch report -o json` (the CLI, as a user runs it) name each case;
the device activity read back from Prometheus and the throughput read from the progress channel
agree within 5 % with what the programs themselves reported (their metrics.json). `gpuorch report
--plot` draws allocated vs active GPU-hours. The web view (the real app on the bus, in Debian's
Chromium) shows each verdict on the workload page and the groups and worst offenders on the report
page, and exports the same sums at `/metrics`, which the real Prometheus scrapes. The embedded
default (`deploy/local/clusters.yaml`: each cluster's exporter through its API server) reads a
running attempt's present activity. With Prometheus stopped, a new workload still runs and is
promoted, and its activity is "unknown" with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuorch.client import Client
from gpuorch.observe.activity import DeviceUse, Unknown
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj
from tests.support.browser import launch, serving
from tests.support.prometheus import Prometheus, free_port
from tests.support.system import A100, registry, result_object, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e
DIGEST = "example.org/gpuorch/train@sha256:" + "5e" * 32
SCALE = 60  # simulated seconds per real second
EXPORTER = "/api/v1/namespaces/gpu-operator/services/nvidia-dcgm-exporter:gpu-metrics/proxy/metrics"
PROM_PORT = free_port()
SHOTS = Path(os.environ["GPUORCH_SCREENSHOTS"]) if os.environ.get("GPUORCH_SCREENSHOTS") else None  # docs/screenshots: the docs' own


def cluster(name: str, nodes: int, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": [{"name": f"{name}-gpu", "count": nodes, "pool": "train", "cpu": "64", "memory": "512Gi", "gpu": {**A100, "count": 4}}],
        "dcgm_exporter": {"collect_interval": 0.05},  # every 200 ms scrape collects afresh
        "registry": {
            "price_per_gpu_hour": 3.0, "artifact_stores": ["prod"], "queues": [{"name": "default", "owners": ["*"]}],
            "startup_seconds": 30,
            "metrics": {"prometheus": f"http://127.0.0.1:{PROM_PORT}", "selector": {"cluster": name}},
        },
        **more,
    }  # fmt: skip


# frag: every node runs another tenant's 3-GPU job: 4 GPUs free, one per node
HOLD = [{"name": f"hold-{i}", "gpus_per_job": 3, "jobs": 1, "duration": "100h",
         "node_selector": {"kubernetes.io/hostname": f"frag-gpu-{i}"}} for i in range(4)]  # fmt: skip
CLUSTERS = registry(cluster("work", 3), cluster("frag", 4, background=HOLD), time_scale=SCALE)


def workload(name: str, owner: str, where: str, args: list[str], gpus: float = 0, **spec: Any) -> Workload:
    body: dict[str, Any] = {
        "image": DIGEST, "command": ["python", "-m", "gpuorch.workloads.train"], "args": args,
        "resources": {"gpus": gpus, "cpu": "2", "memory": "8Gi", **spec.pop("resources", {})},
        "output": {"store": "prod"}, "requirements": {"clusters": [where]}, **spec,
    }  # fmt: skip
    return workload_from_obj({"metadata": {"name": name, "owner": owner}, "spec": body})


# ~24 real seconds of stepping each: 160 x 0.15 s computing; 80 x (0.1 s computing + 0.2 s waiting for input)
HEALTHY = workload("healthy", "ml", "work", ["--steps", "160", "--step-seconds", "9", "--checkpoint-every", "1000"], gpus=2)
DATA_BOUND = workload("slow-input", "nlp", "work", ["--steps", "80", "--step-seconds", "6", "--input-wait-seconds", "12",
                                                   "--checkpoint-every", "1000"], gpus=4)  # fmt: skip
GANG = workload("gang", "ml", "frag", ["--steps", "10"], gpus=1, resources={"workers": 4, "same_node": True})
PIPELINE = workload_from_obj({"metadata": {"name": "three-stage", "owner": "vision"}, "spec": {
    "image": DIGEST, "command": ["python", "-m", "gpuorch.workloads.train"], "output": {"store": "prod"},
    "requirements": {"clusters": ["work"]},
    "stages": [
        # the seed's mistake: a CPU preprocessing stage given the GPU runtime
        {"name": "preprocess", "args": ["--device", "cpu", "--steps", "80", "--step-seconds", "9", "--checkpoint-every", "1000"],
         "resources": {"gpus": 1, "cpu": "2", "memory": "8Gi"}},
        {"name": "train", "depends_on": ["preprocess"], "args": ["--steps", "20", "--step-seconds", "6"],
         "resources": {"gpus": 1, "cpu": "2", "memory": "8Gi"}},
        {"name": "evaluate", "depends_on": ["train"], "args": ["--device", "cpu", "--steps", "10", "--step-seconds", "3"],
         "resources": {"cpu": "1", "memory": "4Gi"}},
    ]}})  # fmt: skip


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("activity"), clusters=CLUSTERS, env_extra={"GPUORCH_METRICS_PORT": "0"}) as s:
        yield s


@pytest.fixture(scope="module")
def prometheus(system: System, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    admin = json.loads((system.state_dir / "clusters" / "admin.json").read_text())
    jobs: list[dict[str, Any]] = [
        {"job_name": f"dcgm-{name}", "metrics_path": EXPORTER,
         "static_configs": [{"targets": [url.removeprefix("http://")], "labels": {"cluster": name}}]}
        for name, url in sorted(admin["clusters"].items())
    ]  # fmt: skip
    services = [json.loads(f.read_text())["url"] for f in sorted((system.state_dir / "metrics").glob("*.json"))]
    jobs.append({"job_name": "gpuorch", "static_configs": [{"targets": [u.removeprefix("http://").removesuffix("/metrics") for u in services]}]})
    config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"}, "scrape_configs": jobs}
    p = Prometheus(tmp_path_factory.mktemp("prometheus"), config, PROM_PORT).start()
    yield p
    p.stop()


def gpuorch(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "gpuorch"
    return subprocess.run([str(cli), "--state", str(system.state_dir), *args], capture_output=True, text=True, timeout=180)


def explain_json(system: System, wid: str) -> dict[str, Any]:
    out = gpuorch(system, "explain", wid, "-o", "json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def close(measured: float | None, reported: float, rel: float = 0.05) -> bool:
    return measured is not None and abs(measured - reported) <= rel * reported


@pytest.fixture(scope="module")
def ran(system: System, prometheus: Prometheus) -> dict[str, str]:
    async def go() -> dict[str, str]:
        s = system.settings
        async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
            ids = {name: await c.submit(wl) for name, wl in
                   (("healthy", HEALTHY), ("data-bound", DATA_BOUND), ("gang", GANG), ("pipeline", PIPELINE))}  # fmt: skip
            for name in ("healthy", "data-bound", "pipeline"):
                v = await c.wait(ids[name], timeout=240)
                assert v.status == "completed", (name, v.status, v.reason)
        return ids

    return asyncio.run(go())


def test_prometheus_scrapes_the_clusters_exporters_and_gpuorchs_services(prometheus: Prometheus, ran: dict[str, str]) -> None:
    up = {(t["labels"]["job"], t["health"]) for t in prometheus.targets()}
    assert {("dcgm-work", "up"), ("dcgm-frag", "up"), ("gpuorch", "up")} <= up, up
    assert len([t for t in prometheus.targets() if t["labels"]["job"] == "gpuorch" and t["health"] == "up"]) >= 4
    assert prometheus.query('count(DCGM_FI_DEV_GPU_UTIL{cluster="frag"})')[0]["value"][1] == "16"
    # the other tenants' pods on frag, attributed as dcgm-exporter does (they never compute)
    held = prometheus.query('count(DCGM_FI_DEV_GPU_UTIL{cluster="frag",namespace="tenants"})')
    assert held and held[0]["value"][1] == "12"
    assert prometheus.query('sum(gpuorch_events_published_total{type="promoted"})')


def test_each_case_is_named_with_its_numbers(system: System, ran: dict[str, str]) -> None:
    healthy = explain_json(system, ran["healthy"])["activity"]
    assert [a["diagnosis"]["case"] for a in healthy] == ["healthy"], healthy
    slow = explain_json(system, ran["data-bound"])["activity"]
    assert [a["diagnosis"]["case"] for a in slow] == ["data-bound"], slow
    assert "not placement" in slow[0]["diagnosis"]["suggestion"]
    stages = {a["stage"]: a for a in explain_json(system, ran["pipeline"])["activity"]}
    assert stages["preprocess"]["diagnosis"]["case"] == "never-used", stages["preprocess"]
    assert stages["preprocess"]["work"]["activity_held"] == 0.0 and "resources.gpus: 0" in stages["preprocess"]["diagnosis"]["suggestion"]
    assert stages["train"]["diagnosis"]["case"] != "never-used" and stages["evaluate"]["diagnosis"]["case"] == "no-gpu"

    async def shape() -> dict[str, Any]:
        [gang] = explain_json(system, ran["gang"])["activity"]
        assert gang["diagnosis"]["case"] == "shape", gang
        return dict(gang["diagnosis"])

    gang = asyncio.run(assert_eventually(shape, timeout=60, interval=1.0))
    assert gang["numbers"]["free_by_node"] == [1, 1, 1, 1] and gang["numbers"]["needs_per_node"] == 4
    text = gpuorch(system, "explain", ran["gang"]).stdout
    assert "(c) shape" in text and "4 GPUs free on frag but at most 1 on one node" in text
    assert "GPU_SHAPE" in text  # the routing's own words, linked


@pytest.mark.parametrize("name", ["healthy", "data-bound"])
def test_activity_and_throughput_agree_with_what_the_program_reported(system: System, ran: dict[str, str], name: str) -> None:
    [a] = explain_json(system, ran[name])["activity"]
    view = asyncio.run(_view(system, ran[name]))
    own = json.loads(asyncio.run(result_object(system, view["result"], "metrics.json")))
    reported = own["work"]
    # device activity read back from Prometheus over its stepping time vs compute / (compute + input wait)
    assert close(a["work"]["activity_stepping"], reported["activity"]), (a["work"], reported)
    # useful throughput (progress channel, clusters' time) vs the program's own loop clock
    own_rate = own["steps"] / own["real_seconds"] * 3600 / SCALE
    assert close(a["work"]["steps_per_hour"], own_rate), (a["work"]["steps_per_hour"], own_rate)
    assert a["work"]["steps"] == own["steps"] and a["work"]["samples"] == reported["samples"]
    assert a["work"]["allocated_gpu_hours"] > a["work"]["active_gpu_hours"] > 0


async def _view(system: System, wid: str) -> dict[str, Any]:
    s = system.settings
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        v = await c.view(wid)
    assert v is not None
    return {"result": v.result_path}


def test_the_report_splits_allocated_from_active_per_destination_owner_and_stage(system: System, ran: dict[str, str],
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    import matplotlib.image

    out = gpuorch(system, "report", "-o", "json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)["activity"]
    owners = {g["key"]: g for g in r["by_owner"]}
    assert owners["nlp"]["cases"] == {"data-bound": 1} and owners["vision"]["cases"]["never-used"] == 1
    assert owners["nlp"]["active_gpu_hours"] < 0.5 * owners["nlp"]["allocated_gpu_hours"]
    assert owners["ml"]["gpu_hours_per_1k_steps"] is not None and owners["ml"]["steps_per_hour"] > 0
    assert {g["key"] for g in r["by_stage"]} >= {"preprocess", "train", "evaluate", "-"}
    worst = [o["case"] for o in r["worst"]]
    assert "never-used" in worst and "data-bound" in worst and "healthy" not in worst
    charts = SHOTS or tmp_path
    text = gpuorch(system, "report", "--plot", str(charts)).stdout
    assert "allocated vs active" in text and "worst offenders" in text
    # the plot: allocated vs active GPU-hours per destination, owner and stage
    assert f"chart: {charts / 'activity.png'}" in text, text
    img = matplotlib.image.imread(charts / "activity.png", format="png")
    assert img.shape[1] == 1300 and img.shape[0] >= 260
    grey = (img[:, :, :3] * 255).round().astype(int)
    assert ((grey[:, :, 0] == 0x43) & (grey[:, :, 1] == 0xA0) & (grey[:, :, 2] == 0x47)).sum() > 200  # the active bars drawn


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=60) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value) for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_the_web_view_shows_the_diagnosis_and_exports_the_metrics(system: System, prometheus: Prometheus, ran: dict[str, str],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    from playwright.async_api import async_playwright

    from gpuorch.observe.web import make_app

    report = json.loads((await asyncio.to_thread(gpuorch, system, "report", "-o", "json")).stdout)["activity"]
    app = make_app(system.settings, time_scale=SCALE)  # the real app, following the bus as `gpuorch web` does
    shots = SHOTS or tmp_path
    async with serving(app) as origin, async_playwright() as p:
        live = app.state.live
        def caught_up() -> bool:  # the log as far as the runs went: every attempt, the pipeline completed
            views = {name: live.projection.get(w) for name, w in ran.items()}
            return all(v is not None and (v.status == "completed" if name == "pipeline" else v.attempts) for name, v in views.items())

        await assert_eventually(caught_up, timeout=60)
        api = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(f"{origin}/api/report", timeout=60).read()))
        read = api["activity_read"]  # the first round: every attempt read from Prometheus and the store
        assert api["activity"]["by_owner"] and read["attempts"] == sum(g["attempts"] for g in report["by_owner"]), read
        print(f"\nweb view: first round over {read['attempts']} attempts in {read['seconds']:.2f} s")
        browser = await launch(p)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            failed: list[str] = []
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            # -- the workload page: each verdict with its numbers and suggestion ---------------------------
            await page.goto(f"{origin}/workloads/{ran['pipeline']}")
            pre = page.locator('#activity .verdict[data-stage="preprocess"]')
            await pre.wait_for(timeout=30000)
            assert await pre.get_attribute("data-case") == "never-used"
            text = await pre.inner_text()
            assert "(a) holds GPUs it never uses" in text and "resources.gpus: 0" in text and "0%" in text, text
            assert await page.locator('#activity .verdict[data-stage="evaluate"]').get_attribute("data-case") == "no-gpu"
            await page.screenshot(path=str(shots / "web-activity.png"), full_page=True)
            await page.goto(f"{origin}/workloads/{ran['data-bound']}")
            slow = page.locator("#activity .verdict")
            await slow.wait_for(timeout=30000)
            assert await slow.get_attribute("data-case") == "data-bound"
            assert "storage or staging, not placement" in await slow.inner_text()
            assert float(await slow.locator("td.allocated").inner_text()) > float(await slow.locator("td.active").inner_text()) > 0
            await page.goto(f"{origin}/workloads/{ran['gang']}")
            await page.locator('#activity .verdict[data-case="shape"]').wait_for(timeout=30000)
            assert await page.locator('#activity .verdict a[href="#verdicts"]').count() == 1  # linked to the routing's view
            # -- the report page: groups, worst offenders, the chart ------------------------------------------
            await page.goto(f"{origin}/report")
            nlp = page.locator('#activity-owner tr[data-key="nlp"]')
            await nlp.wait_for(timeout=60000)
            assert await nlp.locator("td.cases").inner_text() == "data-bound 1"
            owners = {g["key"]: g for g in report["by_owner"]}
            assert await nlp.locator("td.allocated").inner_text() == f"{owners['nlp']['allocated_gpu_hours']:.2f}"  # the CLI's figure
            assert await page.locator('#activity-stage tr[data-key="preprocess"] td.cases').inner_text() == "never-used 1"
            assert {await r.get_attribute("data-case") for r in await page.locator("#worst tbody tr").all()} >= {"never-used", "data-bound"}
            await page.wait_for_function("document.getElementById('activity-chart').complete && "
                                         "document.getElementById('activity-chart').naturalWidth === 1300", timeout=60000)  # fmt: skip
            await page.locator("#activity").scroll_into_view_if_needed()
            await page.screenshot(path=str(shots / "web-activity-report.png"), full_page=True)
            assert failed == [], failed
        finally:
            await browser.close()
        # -- /metrics: the same sums, labelled; scraped by the real Prometheus -------------------------------
        got = await asyncio.to_thread(_metrics, f"{origin}/metrics")
        nlp_alloc = sum(v for (name, labels), v in got.items() if name == "gpuorch_gpu_allocated_seconds" and ("owner", "nlp") in labels)
        assert nlp_alloc == pytest.approx(owners["nlp"]["allocated_gpu_hours"] * 3600, rel=1e-6)
        key = ("gpuorch_attempts_diagnosed", (("destination", "work"), ("owner", "vision"), ("stage", "preprocess"), ("verdict", "never-used")))
        assert got[key] == 1
        prometheus.add_jobs([{"job_name": "gpuorch-web", "static_configs": [{"targets": [origin.removeprefix("http://")]}]}])

        async def scraped() -> bool:  # (the web app answers in this event loop: the queries wait in a thread)
            q = await asyncio.to_thread(prometheus.query, 'sum by (owner) (gpuorch_gpu_allocated_seconds{job="gpuorch-web"})')
            return any(r["metric"].get("owner") == "nlp" and float(r["value"][1]) == pytest.approx(nlp_alloc) for r in q)

        await assert_eventually(scraped, timeout=60, interval=0.5)
        q = await asyncio.to_thread(prometheus.query, 'gpuorch_attempts_diagnosed{job="gpuorch-web",verdict="data-bound"}')
        assert [(r["metric"]["owner"], r["value"][1]) for r in q] == [("nlp", "1")]


def test_the_embedded_default_reads_a_running_attempts_activity_from_the_clusters_exporter(
    system: System, ran: dict[str, str], tmp_path: Path
) -> None:
    from gpuorch.observe.facts import Sources

    default = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "local" / "clusters.yaml").read_text())
    entries = {c["registry"]["metrics"].get("exporter") is not None and "prometheus" not in c["registry"]["metrics"]
               for c in default["clusters"]}  # fmt: skip
    assert entries == {True}, "every embedded cluster reads its own exporter"
    ours = yaml.safe_load(system.clusters_file.read_text())
    for c in ours["clusters"]:
        c["registry"]["metrics"] = default["clusters"][0]["registry"]["metrics"]
    (tmp_path / "clusters.yaml").write_text(yaml.safe_dump(ours))
    settings = replace(system.settings, registry=tmp_path / "clusters.yaml")
    steady = workload("steady", "ml", "work", ["--steps", "300", "--step-seconds", "9", "--checkpoint-every", "1000"], gpus=1)

    async def go() -> None:
        s = system.settings
        async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
            wid = await c.submit(steady)
            try:

                async def present() -> DeviceUse:
                    v = await c.view(wid)
                    assert v is not None and v.status == "running", v and (v.status, v.reason)
                    [f] = await Sources.of(settings).facts([v], await c.snapshots(), time.time())
                    assert isinstance(f.held_use, DeviceUse), f.held_use
                    return f.held_use

                use = await assert_eventually(present, timeout=120, interval=1.0)
                assert use.source.endswith("(now)") and use.devices == 1 and use.activity > 0.8, use
                done = await c.view(ran["healthy"])
                assert done is not None
                [f] = await Sources.of(settings).facts([done], await c.snapshots(), time.time())
                assert isinstance(f.held_use, Unknown) and "only present values" in f.held_use.reason
            finally:
                await c.cancel(wid)

    asyncio.run(go())


def test_without_prometheus_work_still_runs_and_activity_is_unknown(system: System, prometheus: Prometheus, ran: dict[str, str]) -> None:
    prometheus.stop()
    late = workload("after-prometheus", "ml", "work", ["--steps", "20", "--step-seconds", "6"], gpus=1)

    async def go() -> str:
        s = system.settings
        async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
            wid = await c.submit(late)
            v = await c.wait(wid, timeout=120)
            assert v.status == "completed" and v.result_path, (v.status, v.reason)  # routed and promoted all the same
            await c.cancel(ran["gang"])
            return wid

    wid = asyncio.run(go())
    [a] = explain_json(system, wid)["activity"]
    assert a["work"]["activity_held"] is None and a["work"]["steps"] == 20  # the progress channel still speaks
    assert any("did not answer" in u for u in a["diagnosis"]["unknown"]), a["diagnosis"]
