"""The local clusters' dcgm-exporter (gpuorch_localkube.dcgm): NVIDIA's text format with pod
attribution, read through the API server's service proxy by the official client and parsed by
prometheus_client's parser; per-pod values from what the pods' programs report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpuorch_localkube import ConfigError, parse_cluster
from gpuorch_localkube.dcgm import DcgmConfig, Device, Exporter, Holder, busy_at

from .helpers import TIMEOUT, K8s, job_body, job_finished, job_pods, node_group, wait_for

SERVICE = "nvidia-dcgm-exporter:gpu-metrics"
NAMESPACE = "gpu-operator"


def scrape(c: K8s) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = c.core.connect_get_namespaced_service_proxy_with_path(SERVICE, NAMESPACE, "metrics", _request_timeout=TIMEOUT)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        assert fam.type == "gauge", fam
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def of_pod(series: list[tuple[dict[str, str], float]], pod: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for labels, v in series if labels.get("pod") == pod]


# --- the pure parts -------------------------------------------------------------------------------


def holder(alive: bool = True) -> Holder:
    return Holder(namespace="ns", pod="p-abcde", uid="u" * 36, container="main", alive=alive, report=Path("/r"))


def test_activity_is_the_share_of_the_window_the_holder_computed() -> None:
    reports: dict[Path, Any] = {Path("/r"): {"busy_seconds": 0.0, "busy_since": None, "fb_used_mib": 512}}
    ex = Exporter("c", DcgmConfig(collect_interval=0.5), read=lambda p: json.dumps(reports[p]).encode())
    dev = Device("n-0", 0, "A100", 81920, holder())
    assert ex.collect([dev], 100.0) == [(dev, 0.0, 512)]  # first sight: no window yet
    reports[Path("/r")] = {"busy_seconds": 3.0, "busy_since": None, "fb_used_mib": 512}
    [(_, value, fb)] = ex.collect([dev], 104.0)
    assert value == pytest.approx(0.75) and fb == 512
    reports[Path("/r")] = {"busy_seconds": 3.0, "busy_since": 105.0, "fb_used_mib": 512}  # computing since 105
    [(_, value, _)] = ex.collect([dev], 106.0)
    assert value == pytest.approx(0.5)


def test_the_first_look_at_a_running_holder_reads_its_share_since_its_container_started() -> None:
    # one look, as `gpuorch explain` takes in exporter mode: 6 s of compute in the 8 s since start
    report = {"busy_seconds": 6.0, "busy_since": None, "fb_used_mib": 0}
    ex = Exporter("c", DcgmConfig(collect_interval=0.5), read=lambda p: json.dumps(report).encode())
    started = Holder(namespace="ns", pod="p-abcde", uid="u" * 36, container="main", alive=True, report=Path("/r"), started=92.0)
    [(_, value, _)] = ex.collect([Device("n-0", 0, "A100", 81920, started)], 100.0)
    assert value == pytest.approx(0.75)
    # the next look measures the window since this one, as before
    report["busy_seconds"] = 7.0
    [(_, value, _)] = ex.collect([Device("n-0", 0, "A100", 81920, started)], 104.0)
    assert value == pytest.approx(0.25)


def test_a_stopped_holder_computes_no_more_and_a_free_device_is_idle() -> None:
    report = {"busy_seconds": 2.0, "busy_since": 10.0}
    assert busy_at(report, 20.0, alive=True) == 12.0
    assert busy_at(report, 20.0, alive=False) == 2.0
    assert busy_at(None, 20.0) == 0.0
    ex = Exporter("c", DcgmConfig(), read=lambda p: None)
    free = Device("n-0", 1, "A100", 81920, None)
    assert ex.collect([free], 1.0) == [(free, 0.0, 0)]
    assert "pod" not in free.labels("c") and free.labels("c")["Hostname"] == "n-0"


def test_scrapes_between_collections_get_the_last_collection() -> None:
    calls = []

    def current() -> list[Device]:
        calls.append(1)
        return []

    ex = Exporter("c", DcgmConfig(collect_interval=1.0), read=lambda p: None)
    first = ex.scrape(current, 10.0)
    assert ex.scrape(current, 10.5) is first and len(calls) == 1
    ex.scrape(current, 11.0)
    assert len(calls) == 2


@pytest.mark.parametrize(("raw", "message"), [
    ({"collect_interval": 0}, "dcgm_exporter.collect_interval: must be > 0"),
    ({"sevice": "x"}, "dcgm_exporter: unknown field 'sevice'"),
    ({"namespace": "Not_A_Name"}, "dcgm_exporter.namespace: 'Not_A_Name' is not a DNS-1123 name"),
    ("yes", "dcgm_exporter: expected true, false or a mapping"),
])  # fmt: skip
def test_a_bad_exporter_config_says_what_and_where(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_cluster({"name": "a", "dcgm_exporter": raw})
    assert message in str(e.value)
    assert parse_cluster({"name": "a", "dcgm_exporter": False}).dcgm_exporter is None


# --- a cluster ------------------------------------------------------------------------------------


def test_the_exporter_attributes_devices_to_pods_with_what_their_programs_did(lk: Any, tmp_path: Path) -> None:
    h = lk({"name": "gpus", "nodes": [node_group(count=1, gpus=4)], "dcgm_exporter": {"collect_interval": 0.2}},
           time_scale=100)  # fmt: skip
    c = h.client("gpus")
    # half of each step waits for input (0.1 s real), half computes (0.1 s real)
    train = ["python", "-m", "gpuorch.workloads.train", "--steps", "40", "--step-seconds", "10",
             "--input-wait-seconds", "10", "--gpu-memory-mib", "3000", "--checkpoint-every", "1000",
             "--output-dir", "out"]  # fmt: skip
    c.batch.create_namespaced_job("default", job_body("busy", train, gpus=2), _request_timeout=TIMEOUT)
    c.batch.create_namespaced_job("default", job_body("idle", ["sleep", "30"], gpus=1), _request_timeout=TIMEOUT)
    busy = wait_for(lambda: [p for p in job_pods(c, "busy") if p.status.phase == "Running"], what="the trainer runs")[0]
    idle = wait_for(lambda: [p for p in job_pods(c, "idle") if p.status.phase == "Running"], what="sleep runs")[0]

    def steady() -> Any:
        m = scrape(c)
        mine = of_pod(m["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], busy.metadata.name)
        return m if mine and all(0.3 < v < 0.7 for _, v in mine) else None

    m = wait_for(steady, timeout=20, interval=0.3, what="the trainer's devices about half active")
    assert {k: len(v) for k, v in m.items()} == {s: 4 for s in (
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")}
    held = of_pod(m["DCGM_FI_DEV_FB_USED"], busy.metadata.name)
    assert len(held) == 2 and all(v == 3000 for _, v in held)
    labels = held[0][0]
    assert labels["namespace"] == "default" and labels["container"] == "main" and labels["Hostname"] == "gpu-0"
    assert labels["modelName"] == "NVIDIA-A100-SXM4-80GB" and labels["UUID"].startswith("GPU-")
    assert [v for _, v in of_pod(m["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], idle.metadata.name)] == [0.0]  # held, never used
    assert [v for _, v in of_pod(m["DCGM_FI_DEV_FB_USED"], idle.metadata.name)] == [0.0]
    free = [labels for labels, _ in m["DCGM_FI_DEV_GPU_UTIL"] if "pod" not in labels]
    assert len(free) == 1
    wait_for(lambda: job_finished(c, "busy"), timeout=30, what="the trainer finishes")
    after = wait_for(lambda: (lambda x: x if not of_pod(x["DCGM_FI_DEV_GPU_UTIL"], busy.metadata.name) else None)(scrape(c)),
                     what="its devices released")  # fmt: skip
    assert len([lab for lab, _ in after["DCGM_FI_DEV_GPU_UTIL"] if "pod" not in lab]) == 3


def test_a_cluster_without_the_exporter_answers_not_found(lk: Any) -> None:
    h = lk({"name": "bare", "nodes": [node_group(count=1, gpus=1)], "dcgm_exporter": False})
    with pytest.raises(ApiException) as e:
        scrape(h.client("bare"))
    assert e.value.status == 404 and "nvidia-dcgm-exporter" in str(e.value.body)
