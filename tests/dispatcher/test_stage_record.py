"""A stage container's termination message as the dispatcher reads it (issue 28: measured staging
throughput): a pod is not trusted, so anything malformed is no measurement."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuorch.workloads.agent import stage_message
from gpuorch_dispatcher.core import StageMeasurement, parse_stage_record, stage_measurements

GOOD: dict[str, Any] = {
    "dataset": "mnist@v2", "cache_hit": False, "store": "eu-data", "bytes": 70_000, "size_gb": 0.07,
    "simulated_seconds": 0.624, "real_seconds": 0.006, "source": "s3://bucket/mnist@v2/", "staged_at": 1.7e9,
}  # fmt: skip


def msg(**change: Any) -> str:
    doc = {**GOOD, **change}
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


def test_the_agents_own_record_parses() -> None:
    agent = {k: v for k, v in GOOD.items() if k != "store"} | {"objects": {"part-0": {"size": 1}}, "files": 1}
    m = parse_stage_record(stage_message(agent, "eu-data").decode(), "mnist@v2")
    assert m == StageMeasurement("eu-data", 70_000, 0.07, 0.624)
    assert m.doc() == {"location": "eu-data", "bytes": 70_000, "size_gb": 0.07, "simulated_seconds": 0.624}


@pytest.mark.parametrize(
    "message",
    [
        None, 42, b"{}", "", "not json", "[]", '"a string"', "null",
        msg(cache_hit=True), msg(cache_hit=...), msg(cache_hit=0), msg(cache_hit="false"),
        msg(dataset="other@v1"), msg(dataset=...),
        msg(store=...), msg(store=""), msg(store=7), msg(store="has space"), msg(store="x" * 200), msg(store="-lead"),
        msg(bytes=-1), msg(bytes=1.5), msg(bytes=True), msg(bytes="70000"), msg(bytes=2**60), msg(bytes=...),
        msg(size_gb=0), msg(size_gb=-0.07), msg(size_gb="0.07"), msg(size_gb=True), msg(size_gb=1e12), msg(size_gb=...),
        msg(simulated_seconds=0), msg(simulated_seconds=-1), msg(simulated_seconds=None), msg(simulated_seconds=1e300),
        msg(simulated_seconds=False), msg(simulated_seconds=...),
        msg(source="x" * 5000),  # over what Kubernetes keeps: not the agent's record
        '{"dataset": "mnist@v2", "cache_hit": false, "store": "eu-data", "bytes": 1, "size_gb": NaN, "simulated_seconds": 1}',
        '{"dataset": "mnist@v2", "cache_hit": false, "store": "eu-data", "bytes": 1, "size_gb": 1, "simulated_seconds": Infinity}',
        msg()[:-1],  # cut
    ],
)
def test_a_malformed_record_is_no_measurement(message: Any) -> None:
    assert parse_stage_record(message, "mnist@v2") is None


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=6),
                    max_leaves=20))  # fmt: skip
def test_any_json_gives_none_or_a_bounded_measurement(doc: Any) -> None:
    try:
        text = json.dumps(doc)
    except ValueError:
        return
    for message in (text, json.dumps({**GOOD, **doc}) if isinstance(doc, dict) else text):
        m = parse_stage_record(message, "mnist@v2")
        if m is not None:
            assert isinstance(m.bytes, int) and 0 <= m.bytes
            assert math.isfinite(m.size_gb) and m.size_gb > 0 and math.isfinite(m.simulated_seconds) and m.simulated_seconds > 0


def _pod(*statuses: tuple[str, int, str | None]) -> dict[str, Any]:
    return {"status": {"initContainerStatuses": [
        {"name": name, "state": {"terminated": {"exitCode": code, **({"message": m} if m is not None else {})}}}
        for name, code, m in statuses
    ]}}  # fmt: skip


def test_measurements_come_from_stage_n_for_input_n_exit_0_and_a_copy() -> None:
    refs = ["mnist@v2", "cifar@v1", "imagenet@v3"]
    pods = [
        _pod(
            ("stage-0", 0, msg()),
            ("stage-1", 1, msg(dataset="cifar@v1")),  # failed: not believed
            ("stage-2", 0, msg(dataset="mnist@v2")),  # names another input than the one it stages
            ("fetch", 0, msg()),
            ("agent", 0, msg()),
        ),
        {"status": {"initContainerStatuses": [{"name": "stage-1", "state": {"running": {}}}, "junk"]}},
        _pod(("stage-1", 0, msg(dataset="cifar@v1", cache_hit=True)), ("stage-9", 0, msg())),
        _pod(("stage-1", 0, msg(dataset="cifar@v1", store="us-data", bytes=5))),  # a second worker that copied
        {},
    ]
    got = stage_measurements(pods, refs)
    assert got == {
        "mnist@v2": StageMeasurement("eu-data", 70_000, 0.07, 0.624),
        "cifar@v1": StageMeasurement("us-data", 5, 0.07, 0.624),
    }
