"""gpuorch.observe.targets: the scrape targets of a running system, from system.json and the
metrics files the services write (pure), rendered as Prometheus reads them; `promtool check config`
accepts the whole prometheus.yml it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuorch.observe import targets as t
from tests.support.prometheus import RULES, promtool


def system_doc(**procs: int) -> dict[str, Any]:
    return {"nats_url": "nats://127.0.0.1:4222", "procs": {n: {"pid": pid, "log": f"/x/{n}.log"} for n, pid in procs.items()}}


def endpoint(service: str, pid: int, port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    return {"service": service, "pid": pid, "url": f"http://{host}:{port}/metrics"}


def test_every_service_process_with_its_endpoint_in_service_order() -> None:
    system = system_doc(nats=1, localkube=2, fencer=10, router=11, **{"router-1": 12}, dispatcher=13, inventory=14)
    eps = [endpoint("router", 11, 9001), endpoint("router", 12, 9002), endpoint("dispatcher", 13, 9003),
           endpoint("fencer", 10, 9004), endpoint("inventory", 14, 9005)]  # fmt: skip
    found, missing = t.targets(system, eps)
    assert [(x.process, x.service, x.address) for x in found] == [
        ("inventory", "inventory", "127.0.0.1:9005"), ("router", "router", "127.0.0.1:9001"),
        ("router-1", "router", "127.0.0.1:9002"), ("dispatcher", "dispatcher", "127.0.0.1:9003"),
        ("fencer", "fencer", "127.0.0.1:9004"),
    ]  # fmt: skip
    assert missing == []


def test_a_restarted_process_is_scraped_at_its_new_endpoint_not_the_old_one() -> None:
    system = system_doc(router=21)  # restarted: pid 20 was the one before
    found, _ = t.targets(system, [endpoint("router", 20, 9001), endpoint("router", 21, 9111)])
    assert [x.address for x in found] == ["127.0.0.1:9111"]


@pytest.mark.parametrize("eps", [
    pytest.param([], id="not-written-yet"),
    pytest.param([endpoint("router", 5, 9001)], id="reused-pid-of-another-service"),
])  # fmt: skip
def test_a_process_without_its_endpoint_is_reported_missing(eps: list[dict[str, Any]]) -> None:
    found, missing = t.targets(system_doc(dispatcher=5), eps)
    assert found == [] and missing == ["dispatcher"]


@pytest.mark.parametrize(("system", "eps", "says"), [
    pytest.param({"nats_url": "x"}, [], "no `procs`", id="not-a-system"),
    pytest.param(system_doc(router=1), [{"service": "router", "url": "http://h:1/metrics"}], "without a pid", id="endpoint-without-pid"),
    pytest.param(system_doc(router=1), [endpoint("router", 1, 0) | {"url": "metrics.sock"}], "router (pid 1)", id="not-a-url"),
    pytest.param({"procs": {"router": {"log": "x"}}}, [], "process router has no pid", id="process-without-pid"),
    pytest.param(system_doc(router=1), [endpoint("router", 1, 0) | {"url": "http://h:x/m"}], "'http://h:x/m'", id="bad-port"),
])  # fmt: skip
def test_bad_documents_are_errors_that_say_where(system: dict[str, Any], eps: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(t.TargetsError, match=says.replace("(", r"\(").replace(")", r"\)")):
        t.targets(system, eps)


def test_file_sd_labels_each_group_with_service_and_process() -> None:
    found = [t.Target("router-1", "router", "10.0.0.5:8000", "/metrics"), t.Target("fencer", "fencer", "h:1", "/m")]
    assert t.file_sd(found) == [
        {"targets": ["10.0.0.5:8000"], "labels": {"service": "router", "process": "router-1"}},
        {"targets": ["h:1"], "labels": {"service": "fencer", "process": "fencer", "__metrics_path__": "/m"}},
    ]


def _state(tmp_path: Path, system: dict[str, Any], eps: list[dict[str, Any]]) -> Path:
    (tmp_path / "metrics").mkdir(parents=True)
    (tmp_path / "system.json").write_text(json.dumps(system))
    for e in eps:
        (tmp_path / "metrics" / f"{e['service']}-{e['pid']}.json").write_text(json.dumps(e))
    return tmp_path


def test_the_command_writes_a_config_promtool_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(tmp_path / "state", system_doc(router=1, inventory=2, fencer=3),
                   [endpoint("router", 1, 9001), endpoint("inventory", 2, 9002)])  # fmt: skip
    out = tmp_path / "prometheus.yml"
    rc = t.main(["--state", str(state), "--format", "config", "--rules", str(RULES), "-o", str(out), "--scrape-interval", "5s"])
    assert rc == 0
    assert "process fencer has no metrics endpoint" in capsys.readouterr().err
    doc = yaml.safe_load(out.read_text())
    assert doc["global"]["scrape_interval"] == "5s" and doc["rule_files"] == [str(RULES)]
    [job] = doc["scrape_configs"]
    assert job["job_name"] == "gpuorch"
    assert [g["targets"] for g in job["static_configs"]] == [["127.0.0.1:9002"], ["127.0.0.1:9001"]]
    checked = promtool("check", "config", out)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_command_writes_file_sd_and_says_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(tmp_path / "state", system_doc(dispatcher=7), [endpoint("dispatcher", 7, 9007)])
    out = tmp_path / "gpuorch.json"
    assert t.main(["--state", str(state), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == [{"targets": ["127.0.0.1:9007"], "labels": {"service": "dispatcher", "process": "dispatcher"}}]

    assert t.main(["--state", str(tmp_path / "nowhere")]) == 2
    assert "system.json does not exist" in capsys.readouterr().err
    (state / "metrics" / "dispatcher-7.json").write_text("{")
    assert t.main(["--state", str(state)]) == 2
    assert "dispatcher-7.json: unreadable metrics endpoint" in capsys.readouterr().err
