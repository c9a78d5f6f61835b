"""deploy/prometheus/rules.yml, the documented alert rules: Prometheus's own `promtool` checks them
and runs their unit tests (deploy/prometheus/rules_test.yml); each alert has a case where it fires
and one where it does not, and its firing case fails when the alert can no longer fire; every
metric they read is one the services serve; docs/operations.md names each alert."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuorch.observe import metrics
from tests.support.prometheus import ROOT, RULES, RULES_TEST, alert_rules, metric_names, promtool

ALERTS = sorted(alert_rules())


def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout, out.stdout


def test_promtool_test_rules() -> None:
    out = promtool("test", "rules", RULES_TEST)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_documented_alerts_are_all_there() -> None:
    assert {"GpuorchClusterLost", "GpuorchConsumerLagging", "GpuorchRoutingSlow", "GpuorchPromotionsRejected",
            "GpuorchOrphansKeepAppearing", "GpuorchWorkloadsWaiting", "GpuorchDeadLetters"} <= set(ALERTS)  # fmt: skip
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert "deploy/prometheus/rules.yml" in doc
    assert "- alert:" not in doc, "the rules live in deploy/prometheus/rules.yml, not as a copy in the doc"
    for name in ALERTS:
        assert f"`{name}`" in doc, f"docs/operations.md does not describe {name}"


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_has_a_firing_and_a_quiet_case(alert: str) -> None:
    cases = [c for t in yaml.safe_load(RULES_TEST.read_text())["tests"] for c in t.get("alert_rule_test", [])
             if c["alertname"] == alert]  # fmt: skip
    assert any(c["exp_alerts"] for c in cases), f"no case where {alert} fires"
    assert any(not c["exp_alerts"] for c in cases), f"no case where {alert} stays quiet"


@pytest.mark.parametrize("alert", ALERTS)
def test_the_unit_tests_fail_when_the_alert_cannot_fire(alert: str, tmp_path: Path) -> None:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) < 0"  # never true
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc))
    (tmp_path / "rules_test.yml").write_text(RULES_TEST.read_text())
    out = promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert out.returncode != 0 and f"alertname: {alert}" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_reads_only_metrics_the_services_serve(alert: str) -> None:
    names = metric_names(alert_rules()[alert]["expr"])
    assert names, "an alert on no metric"
    unknown = names - metrics.exported_names()
    assert not unknown, f"{alert} reads {sorted(unknown)}, which no service serves (gpuorch/observe/metrics.py)"


@pytest.mark.parametrize(("expr", "names"), [
    ("max by (cluster) (gpuorch_cluster_reachable) == 0", {"gpuorch_cluster_reachable"}),
    ('sum by (handler) (increase(gpuorch_messages_handled_total{result="dead_lettered", handler=~"a|b"}[15m])) > 0',
     {"gpuorch_messages_handled_total"}),
    ("histogram_quantile(0.99, sum(rate(x_bucket[5m] offset 1h)) by (le)) > 1e3", {"x_bucket"}),
    ("a / on (instance) group_left (version) b unless c and bool d", {"a", "b", "c", "d"}),
    ('{__name__="up", job="x"} or absent(gpuorch_workloads)', {"up", "gpuorch_workloads"}),
    ("rate(process_cpu_seconds_total[$__rate_interval]) * 100", {"process_cpu_seconds_total"}),
    ('label_replace(m:recorded, "dst", "$1", "src", "(.*)")', {"m:recorded"}),
])  # fmt: skip
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_misspelt_metric_is_caught() -> None:
    assert metric_names("gpuorch_cluster_reachble == 0") - metrics.exported_names() == {"gpuorch_cluster_reachble"}


def test_the_counters_the_alerts_increase_over_start_at_zero() -> None:
    """`increase()` needs a sample before the first count: a service exports them at 0 for every
    cluster it has a client of and for every result of every consumer."""
    from prometheus_client import generate_latest

    metrics.cluster_seen("zeta")
    metrics.consumer_started("zeta-events")
    text = generate_latest(metrics.REGISTRY).decode()
    for line in ('gpuorch_promotion_rejections_total{cluster="zeta"} 0.0', 'gpuorch_orphan_deletions_total{cluster="zeta"} 0.0',
                 'gpuorch_messages_handled_total{handler="zeta-events",result="dead_lettered"} 0.0'):  # fmt: skip
        assert line in text.splitlines(), line
