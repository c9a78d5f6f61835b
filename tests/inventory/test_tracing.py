"""The cluster-queue span inventory adds to a workload's trace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuorch.runtime import telemetry
from gpuorch_inventory.core import PodStart
from gpuorch_inventory.service import trace_cluster_queue

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = telemetry.setup_tracing("inventory", exporter)
    try:
        yield exporter
    finally:
        telemetry.shutdown_tracing(provider)


def test_an_attempts_wait_on_its_cluster_is_a_child_span_of_the_workloads_trace(spans):
    start = PodStart(
        key="uid", name="wl-1-a1-abcde", queue="default", gpus=8, created=1000.0, started=1002.5,
        delay_s=1500.0, workload="wl-1", attempt="wl-1-a1", traceparent=f"00-{TRACE_ID}-{PARENT}-01",
    )
    trace_cluster_queue("primary", start)
    (span,) = spans.get_finished_spans()
    assert span.name == "cluster.queue_wait"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT
    assert (span.start_time, span.end_time) == (1000 * 10**9, 1002_500_000_000)
    attrs = dict(span.attributes or {})
    assert attrs["gpuorch.workload"] == "wl-1" and attrs["gpuorch.attempt"] == "wl-1-a1"
    assert attrs["gpuorch.cluster"] == "primary" and attrs["gpuorch.queue_wait_simulated_s"] == 1500.0
    assert span.resource.attributes["service.name"] == "inventory"
