"""Kubernetes scheduling semantics (gpuorch_proto.kubesem): grids with narrative ids."""

from __future__ import annotations

from typing import Any

import pytest

from gpuorch_proto import Taint
from gpuorch_proto.kubesem import (
    UNSCHEDULABLE_TAINT,
    affinity_terms,
    blocking_taints,
    job_finished,
    node_affinity_matches,
    node_selector_matches,
    pod_is_terminal,
    requirement_matches,
    selector_term_matches,
    tolerates,
    toleration_matches,
    untolerated_taints,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def tol(key: str = "", operator: str | None = None, value: str | None = None, effect: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (("key", key), ("operator", operator), ("value", value), ("effect", effect)):
        if v:
            out[k] = v
    return out


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param(tol("nvidia.com/gpu", "Equal", "present", "NoSchedule"), GPU_TAINT, True, id="equal-key-value-effect"),
        pytest.param(tol("nvidia.com/gpu", value="present"), GPU_TAINT, True, id="operator-defaults-to-equal-effect-empty-matches-all"),
        pytest.param(tol("nvidia.com/gpu", "Equal", "absent"), GPU_TAINT, False, id="equal-other-value"),
        pytest.param(tol("nvidia.com/gpu", "Equal"), GPU_TAINT, False, id="equal-without-value-vs-valued-taint"),
        pytest.param(tol("dedicated", "Equal"), {"key": "dedicated", "effect": "NoSchedule"}, True, id="equal-missing-and-empty-values"),
        pytest.param(tol("nvidia.com/gpu", "Exists"), GPU_TAINT, True, id="exists-ignores-value"),
        pytest.param(tol("other", "Exists"), GPU_TAINT, False, id="exists-other-key"),
        pytest.param(tol(operator="Exists"), GPU_TAINT, True, id="empty-key-exists-tolerates-everything"),
        pytest.param(tol(operator="Exists", effect="NoExecute"), GPU_TAINT, False, id="empty-key-exists-limited-to-one-effect"),
        pytest.param(tol(value="present"), GPU_TAINT, False, id="empty-key-equal-tolerates-nothing"),
        pytest.param(tol("nvidia.com/gpu", "Exists", effect="NoExecute"), GPU_TAINT, False, id="effect-mismatch"),
        pytest.param(tol("nvidia.com/gpu", "Exists", effect="PreferNoSchedule"),
                     dict(GPU_TAINT, effect="PreferNoSchedule"), True, id="prefer-no-schedule-effect-matches"),
        pytest.param(tol("nvidia.com/gpu", "Gt", "1"), GPU_TAINT, False, id="unknown-operator-tolerates-nothing"),
    ],
)
def test_one_toleration_against_one_taint(toleration: dict[str, Any], taint: dict[str, Any], expected: bool) -> None:
    assert toleration_matches(toleration, taint) is expected
    assert tolerates([toleration], taint) is expected


def test_structs_are_read_by_attribute() -> None:
    taint = Taint(key="pool", value="train", effect="NoExecute")
    assert tolerates([tol("pool", "Equal", "train")], taint)
    assert not tolerates([tol("pool", "Equal", "serve")], taint)
    assert blocking_taints([], [taint]) == [taint]


def test_no_tolerations_tolerate_nothing() -> None:
    assert not tolerates(None, GPU_TAINT)
    assert not tolerates([], GPU_TAINT)


def test_only_no_schedule_and_no_execute_block_scheduling() -> None:
    taints = [
        {"key": "a", "effect": "NoSchedule"},
        {"key": "b", "effect": "PreferNoSchedule"},
        {"key": "c", "effect": "NoExecute"},
    ]
    assert [t["key"] for t in blocking_taints([], taints)] == ["a", "c"]
    assert [t["key"] for t in blocking_taints([tol("c", "Exists")], taints)] == ["a"]
    assert [t["key"] for t in untolerated_taints([], taints, ("PreferNoSchedule",))] == ["b"]
    assert blocking_taints([tol(operator="Exists")], taints) == []


def test_cordoned_node_taint_is_tolerated_by_name() -> None:
    assert not tolerates([tol("nvidia.com/gpu", "Exists")], UNSCHEDULABLE_TAINT)
    assert tolerates([tol("node.kubernetes.io/unschedulable", "Exists", effect="NoSchedule")], UNSCHEDULABLE_TAINT)


LABELS = {"pool": "train", "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8", "zone": "a"}


@pytest.mark.parametrize(
    ("key", "operator", "values", "expected"),
    [
        pytest.param("pool", "In", ["train", "serve"], True, id="in-listed"),
        pytest.param("pool", "In", ["serve"], False, id="in-unlisted"),
        pytest.param("missing", "In", ["x"], False, id="in-needs-the-label"),
        pytest.param("pool", "NotIn", ["serve"], True, id="notin-unlisted"),
        pytest.param("pool", "NotIn", ["train"], False, id="notin-listed"),
        pytest.param("missing", "NotIn", ["x"], True, id="notin-absent-label-matches"),
        pytest.param("zone", "Exists", [], True, id="exists"),
        pytest.param("missing", "Exists", [], False, id="exists-absent"),
        pytest.param("missing", "DoesNotExist", [], True, id="doesnotexist"),
        pytest.param("zone", "DoesNotExist", [], False, id="doesnotexist-present"),
        pytest.param("nvidia.com/gpu.memory", "Gt", ["40959"], True, id="gt-integer"),
        pytest.param("nvidia.com/gpu.memory", "Gt", ["81920"], False, id="gt-is-strict"),
        pytest.param("nvidia.com/gpu.count", "Lt", ["9"], True, id="lt-integer"),
        pytest.param("nvidia.com/gpu.count", "Lt", ["8"], False, id="lt-is-strict"),
        pytest.param("pool", "Gt", ["1"], False, id="gt-non-integer-label"),
        pytest.param("nvidia.com/gpu.count", "Gt", ["1", "2"], False, id="gt-needs-exactly-one-value"),
        pytest.param("missing", "Lt", ["1"], False, id="lt-absent-label"),
        pytest.param("pool", "Like", ["train"], False, id="unknown-operator"),
    ],
)
def test_node_selector_requirements(key: str, operator: str, values: list[str], expected: bool) -> None:
    assert requirement_matches(key, operator, values, LABELS) is expected
    term = {"matchExpressions": [{"key": key, "operator": operator, "values": values}]}
    assert selector_term_matches(term, LABELS, "n1") is expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(None, True, id="no-selector"),
        pytest.param({}, True, id="empty-selector"),
        pytest.param({"pool": "train"}, True, id="one-pair"),
        pytest.param({"pool": "train", "zone": "a"}, True, id="all-pairs"),
        pytest.param({"pool": "train", "zone": "b"}, False, id="one-pair-differs"),
        pytest.param({"rack": ""}, False, id="absent-is-not-empty"),
    ],
)
def test_node_selector_map(selector: dict[str, str] | None, expected: bool) -> None:
    assert node_selector_matches(selector, LABELS) is expected


def test_terms_and_within_or_across() -> None:
    in_train = {"key": "pool", "operator": "In", "values": ["train"]}
    in_b = {"key": "zone", "operator": "In", "values": ["b"]}
    assert not selector_term_matches({"matchExpressions": [in_train, in_b]}, LABELS)
    assert node_affinity_matches([{"matchExpressions": [in_b]}, {"matchExpressions": [in_train]}], LABELS)
    assert not node_affinity_matches([{"matchExpressions": [in_b]}], LABELS)
    assert node_affinity_matches([], LABELS)
    assert not selector_term_matches({}, LABELS), "an empty term matches nothing"
    assert not node_affinity_matches([{}], LABELS)


def test_match_fields_select_the_node_name() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-0"]}]}
    assert selector_term_matches(term, LABELS, "gpu-0")
    assert not selector_term_matches(term, LABELS, "gpu-1")


def test_affinity_terms_from_a_pod_spec() -> None:
    terms = [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    assert affinity_terms(affinity) == terms
    assert affinity_terms(None) == []
    assert affinity_terms({"nodeAffinity": {}}) == []


@pytest.mark.parametrize(
    ("phase", "expected"),
    [("Succeeded", True), ("Failed", True), ("Running", False), ("Pending", False), ("Unknown", False), (None, False)],
)
def test_terminal_pod_phases(phase: str | None, expected: bool) -> None:
    assert pod_is_terminal(phase) is expected
    assert pod_is_terminal({"status": {"phase": phase}} if phase else {}) is expected


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param([], None, id="no-conditions"),
        pytest.param([{"type": "Complete", "status": "True"}], "Complete", id="complete"),
        pytest.param([{"type": "Failed", "status": "True"}], "Failed", id="failed"),
        pytest.param([{"type": "Failed", "status": "False"}], None, id="condition-false"),
        pytest.param([{"type": "Suspended", "status": "True"}], None, id="suspended-is-not-finished"),
        pytest.param([{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}],
                     "Complete", id="among-others"),
    ],
)
def test_finished_jobs(conditions: list[dict[str, str]], expected: str | None) -> None:
    assert job_finished({"status": {"conditions": conditions}}) == expected
