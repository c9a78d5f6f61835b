"""Reading device activity (gpuorch.observe.devices): the exporter's page as the local clusters
render it, Prometheus vectors, and every way a measurement becomes "unknown" with its reason."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest

from gpuorch.config import load_registry
from gpuorch.observe.activity import DeviceUse, Unknown
from gpuorch.observe.devices import (
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    Reader,
    prometheus_use,
    queries,
    use_from_exporter,
    use_from_vectors,
)
from gpuorch_localkube.dcgm import Device, Holder, render
from gpuorch_proto import MetricsSource
from gpuorch_proto.k8s import pod_name_regex


def test_pod_names_of_an_attempt_and_no_other() -> None:
    rx = re.compile(pod_name_regex("train-7f2c-a1"))
    assert rx.fullmatch("train-7f2c-a1-x7k2p") and rx.fullmatch("train-7f2c-a1-3-x7k2p")
    assert not rx.fullmatch("train-7f2c-a10-x7k2p") and not rx.fullmatch("train-7f2c-a1")
    assert re.compile(pod_name_regex("v1.2-a1")).fullmatch("v1.2-a1-abcde") and not re.fullmatch(pod_name_regex("v1.2-a1"), "v1x2-a1-abcde")


def test_the_exporters_page_is_attributed_by_namespace_and_pod() -> None:
    def held(pod: str, ns: str = "gpuorch") -> Holder:
        return Holder(namespace=ns, pod=pod, uid="u" * 36, container="main", alive=True, report=Path("/x"))

    devs = [Device("n-0", 0, "A100", 81920, held("w-a1-abcde")), Device("n-0", 1, "A100", 81920, held("w-a1-abcde")),
            Device("n-1", 0, "A100", 81920, held("w-a10-fghij")), Device("n-1", 1, "A100", 81920, None)]  # fmt: skip
    text = render("c", [(devs[0], 0.5, 1000), (devs[1], 0.25, 3000), (devs[2], 1.0, 10), (devs[3], 0.0, 0)])
    use = use_from_exporter(text, "w-a1", "exporter")
    assert isinstance(use, DeviceUse)
    assert (use.activity, use.devices, use.fb_used_mib, use.series) == (0.375, 2, 3000, GR_ENGINE_ACTIVE)
    assert isinstance(use_from_exporter(text, "w-a2", "exporter"), Unknown)
    assert "attributed" in use_from_exporter(text, "w-a2", "exporter").reason  # type: ignore[union-attr]
    assert "not the Prometheus text format" in use_from_exporter("DCGM{ 1", "w-a1", "x").reason  # type: ignore[union-attr]


def test_prometheus_vectors_weighted_by_samples_and_percent_read_as_a_ratio() -> None:
    def v(gpu: str, value: float) -> dict[str, object]:
        return {"metric": {"gpu": gpu, "Hostname": "n", "UUID": f"GPU-{gpu}"}, "value": [1.0, str(value)]}

    use = use_from_vectors(GPU_UTIL, [v("0", 80), v("1", 20)], [v("0", 30), v("1", 10)], [v("", 512)], "p")
    assert use is not None and use.activity == pytest.approx((0.8 * 30 + 0.2 * 10) / 40) and use.samples == 40
    assert use.devices == 2 and use.fb_used_mib == 512
    assert use_from_vectors(GR_ENGINE_ACTIVE, [], [], [], "p") is None
    q = queries(GR_ENGINE_ACTIVE, MetricsSource(prometheus="http://p", selector={"cluster": "east"}), "w-a1", 12.5)
    assert q["mean"] == 'avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{cluster="east",namespace="gpuorch",pod=~"w-a1-([0-9]+-)?[a-z0-9]{5}"}[12500ms])'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_down_and_no_source_are_unknown_with_the_reason(tmp_path: Path) -> None:
    down = asyncio.run(prometheus_use(MetricsSource(prometheus=f"http://127.0.0.1:{free_port()}"), "w-a1", (0.0, 10.0)))
    assert isinstance(down, Unknown) and "did not answer" in down.reason
    f = tmp_path / "clusters.yaml"
    f.write_text("clusters:\n  - name: east\n    registry: {}\n")
    got = asyncio.run(Reader(load_registry(f)).use("east", "w-a1", (0.0, 10.0), live=False))
    assert isinstance(got, Unknown) and "registry names no metrics source for east" in got.reason
    f.write_text("clusters:\n  - name: east\n    registry: {metrics: {exporter: {}}}\n")
    got = asyncio.run(Reader(load_registry(f)).use("east", "w-a1", (0.0, 10.0), live=False))
    assert isinstance(got, Unknown) and "needs a Prometheus" in got.reason


@pytest.mark.parametrize(("metrics", "message"), [
    ("{}", "clusters[0].registry.metrics: give prometheus"),
    ("{prometheus: 'prom:9090'}", "clusters[0].registry.metrics.prometheus: 'prom:9090' is not a Prometheus base URL"),
    ("{prometheus: 'http://p:9090', selector: {'bad-label': x}}", "clusters[0].registry.metrics.selector: 'bad-label'"),
])  # fmt: skip
def test_a_bad_metrics_source_stops_the_registry_with_the_field(tmp_path: Path, metrics: str, message: str) -> None:
    f = tmp_path / "clusters.yaml"
    f.write_text(f"clusters:\n  - name: east\n    registry: {{metrics: {metrics}}}\n")
    with pytest.raises(ValueError) as e:
        load_registry(f)
    assert message in str(e.value)
