"""deploy/grafana/gpuorch.json, the Grafana dashboard: every query is PromQL that Prometheus's
parser accepts (`promtool check rules` over them as recording rules), reads only metrics the
services serve, and every gpuorch metric is on some panel. (tests/e2e/test_prometheus.py runs
each query against a real Prometheus scraping a running system.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuorch.observe import metrics
from tests.support.prometheus import (
    DASHBOARD,
    as_prometheus,
    dashboard,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    promtool,
)


def test_every_panel_has_queries_and_a_unique_id() -> None:
    doc = dashboard()
    assert doc["uid"] == "gpuorch" and doc["title"]
    ids = [p["id"] for p in dashboard_panels(doc)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for p in dashboard_panels(doc):
        if p["type"] == "row":
            continue
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", f"panel {p['title']!r} is tied to one data source"
    assert {v["name"] for v in doc["templating"]["list"] if v["type"] == "datasource"} == {"datasource"}


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    found = dashboard_queries(dashboard())
    rules = [{"record": f"dashboard:query_{i}", "expr": as_prometheus(expr)} for i, (_, expr) in enumerate(found)]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = promtool("check", "rules", path)
    assert out.returncode == 0, out.stdout + out.stderr + "\n" + "\n".join(f"query_{i}: {w}" for i, (w, _) in enumerate(found))


def test_every_query_reads_only_metrics_the_services_serve() -> None:
    served = metrics.exported_names()
    for where, expr in dashboard_queries(dashboard()):
        names = metric_names(as_prometheus(expr))
        assert names, f"{where}: reads no metric: {expr}"
        assert names <= served, f"{where} reads {sorted(names - served)}, which no service serves: {expr}"


def test_every_gpuorch_metric_is_on_the_dashboard() -> None:
    shown = set().union(*(metric_names(as_prometheus(e)) for _, e in dashboard_queries(dashboard())))
    for family in metrics.REGISTRY.collect():
        if family.name.startswith("gpuorch_"):
            assert metrics.sample_names(family) & shown, f"{family.name} is on no panel of {DASHBOARD.name}"
