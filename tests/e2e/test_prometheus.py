"""A real Prometheus (Debian's `prometheus`) scrapes every service of a running system, with the
alert rules of deploy/prometheus/rules.yml loaded, over the scrape config that
`gpuorch.observe.targets` writes for it: every target is up, every rule evaluates, every query of
the Grafana dashboard runs; a partitioned cluster makes `GpuorchClusterLost` fire for that cluster
from the scraped data, and the heal resolves it.

The only change to the rules is their `for:` (2 minutes in production), shortened to 2 s so the
test takes seconds; the expressions are the file's, compared below."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuorch.observe import metrics, targets
from gpuorch.system import SERVICES, System
from tests.support.prometheus import (
    RULES,
    Prometheus,
    alert_rules,
    as_prometheus,
    dashboard,
    dashboard_panels,
    dashboard_queries,
    running_prometheus,
)
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

FOR = "2s"  # every alert's `for:` in this test (evaluation every second)


def service_processes(system: System) -> list[str]:
    return sorted(n for n in system.procs if n.partition("-")[0] in SERVICES)


@pytest.fixture(scope="module")
def prometheus(system: System, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    (work / "rules.yml").write_text(yaml.safe_dump(rules))
    assert {a: r["expr"] for a, r in alert_rules(work / "rules.yml").items()} == {a: r["expr"] for a, r in alert_rules().items()}

    found, missing = targets.read(system.state_dir)
    assert not missing, f"no metrics endpoint for {missing}"
    config = targets.config(found, rules=[work / "rules.yml"], scrape_interval="1s", evaluation_interval="1s")
    with running_prometheus(work, config) as p:
        yield p


async def test_every_service_is_scraped_and_up(system: System, prometheus: Prometheus) -> None:
    processes = service_processes(system)
    assert len(processes) == len(SERVICES)

    def all_up() -> bool:
        active = prometheus.api("targets", state="active")["activeTargets"]
        health = {t["labels"]["process"]: (t["health"], t["lastError"]) for t in active}
        assert health == {p: ("up", "") for p in processes}, health
        return True

    await assert_eventually(all_up, timeout=30)
    up = prometheus.api("query", query='up{job="gpuorch"} == 1')["result"]
    assert sorted(r["metric"]["process"] for r in up) == processes

    # what Prometheus scraped is what the metrics module says the services serve
    def scraped() -> set[str]:
        names = {n for n in prometheus.api("label/__name__/values") if n.startswith(("gpuorch_", "process_"))}
        assert {"gpuorch_cluster_reachable", "gpuorch_orchestration_queue_depth", "gpuorch_messages_handled_total",
                "process_resident_memory_bytes"} <= names, sorted(names)  # fmt: skip
        return names

    names = await assert_eventually(scraped, timeout=30)
    assert names <= metrics.exported_names(), sorted(names - metrics.exported_names())

    # the counters the alerts take increase() of are there at 0 before anything happened
    zeros = prometheus.api("query", query='gpuorch_promotion_rejections_total{service="fencer"} == 0')["result"]
    assert {r["metric"]["cluster"] for r in zeros} == {"alpha", "beta"}, zeros
    dead = prometheus.api("query", query='gpuorch_messages_handled_total{result="dead_lettered"} == 0')["result"]
    assert {r["metric"]["service"] for r in dead} == set(SERVICES) - {"inventory"}, dead


async def test_every_rule_evaluates_without_error(prometheus: Prometheus) -> None:
    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} == set(alert_rules()), [r["name"] for r in rules]
        assert not any(r["lastEvaluation"].startswith("0001-") for r in rules), "not every rule was evaluated yet"
        return rules

    rules = await assert_eventually(evaluated, timeout=30)
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]


async def test_every_dashboard_query_runs(system: System, prometheus: Prometheus) -> None:
    for where, expr in dashboard_queries(dashboard()):
        try:
            prometheus.api("query", query=as_prometheus(expr, cluster=".*"))
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc

    def panels_show_every_cluster_and_service() -> bool:
        reachable = prometheus.api("query", query=as_prometheus(query_of("Reachable"), cluster=".*"))["result"]
        assert {r["metric"]["cluster"]: r["value"][1] for r in reachable} == {"alpha": "1", "beta": "1"}, reachable
        memory = prometheus.api("query", query=as_prometheus(query_of("Resident memory")))["result"]
        assert sorted(r["metric"]["process"] for r in memory) == service_processes(system), memory
        return True

    await assert_eventually(panels_show_every_cluster_and_service, timeout=30)


def query_of(title: str) -> str:
    """The first query of the dashboard panel whose title starts with `title`."""
    [expr] = [p["targets"][0]["expr"] for p in dashboard_panels(dashboard()) if p["title"].startswith(title)]
    return str(expr)


def cluster_lost_alerts(prometheus: Prometheus) -> dict[str, str]:
    """cluster -> state (pending, firing) of every GpuorchClusterLost alert."""
    return {a["labels"]["cluster"]: a["state"] for a in prometheus.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "GpuorchClusterLost"}  # fmt: skip


async def test_a_partitioned_cluster_fires_cluster_lost_and_the_heal_resolves_it(
    system: System, prometheus: Prometheus, record_property: Any
) -> None:
    def quiet() -> bool:
        assert cluster_lost_alerts(prometheus) == {}
        return True

    await assert_eventually(quiet, timeout=30)
    started = time.monotonic()
    system.fault("alpha", "partition")
    try:

        def firing() -> bool:
            assert cluster_lost_alerts(prometheus) == {"alpha": "firing"}, cluster_lost_alerts(prometheus)
            return True

        await assert_eventually(firing, timeout=60, interval=0.2)
        fired = time.monotonic() - started
        [alert] = [a for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == "GpuorchClusterLost"]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"] == "cluster alpha does not answer inventory"
    finally:
        system.fault("alpha", "heal")
    healed = time.monotonic()

    await assert_eventually(quiet, timeout=60, interval=0.2)
    record_property("cluster_lost_fired_s", round(fired, 1))
    record_property("cluster_lost_resolved_s", round(time.monotonic() - healed, 1))
    print(f"GpuorchClusterLost firing {fired:.1f}s after the partition, resolved {time.monotonic() - healed:.1f}s after the heal")

