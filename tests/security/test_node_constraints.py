"""Tolerations and node selectors pass only where the workload's queue allows them (issue 11).

The rule is `gpuorch_proto.policy.node_constraint_errors`; the router refuses a submit that breaks
it (tests/security/test_workload_input.py shows it against the running system).
"""

from __future__ import annotations

import pytest

from gpuorch_proto import workload_from_obj
from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.policy import PolicyError, node_constraint_errors

DIGEST = "example.org/train@sha256:" + "ab" * 32

POLICY = load_policy_yaml(
    """
queues:
  - name: default
  - name: research
    allowed_taints: [gpuorch.io/short-only]
    allowed_node_labels: [topology.kubernetes.io/zone]
  - name: locked
    allowed_taints: []
    allowed_node_labels: []
"""
)


def wl(queue: str | None = "research", **requirements: object) -> object:
    spec: dict[str, object] = {"image": DIGEST, "command": ["true"], "requirements": requirements}
    if queue:
        spec["policy_queue"] = queue
    return workload_from_obj({"metadata": {"name": "w"}, "spec": spec})


def errors(w: object) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in node_constraint_errors(POLICY, w)]  # type: ignore[arg-type]


def test_a_toleration_the_queue_does_not_allow_is_named_with_its_path() -> None:
    got = errors(wl(tolerations=[{"key": "gpuorch.io/short-only", "operator": "Exists"}, {"key": "dedicated", "value": "ml"}]))
    assert got == [("spec.requirements.tolerations[1]", 'queue research does not allow toleration for taint key "dedicated" (it allows: "gpuorch.io/short-only")')]


def test_a_keyless_toleration_tolerates_every_taint_so_only_star_allows_it() -> None:
    got = errors(wl(tolerations=[{"operator": "Exists"}]))
    assert [p for p, _ in got] == ["spec.requirements.tolerations[0]"] and "every taint" in got[0][1]
    assert errors(wl(queue=None, tolerations=[{"operator": "Exists"}])) == []  # the default queue allows "*"


@pytest.mark.parametrize(
    ("queue", "selector", "bad"),
    [
        pytest.param("research", {"topology.kubernetes.io/zone": "site-a"}, [], id="allowed-key"),
        pytest.param("research", {"kubernetes.io/hostname": "n1"}, ["spec.requirements.node_selector.kubernetes.io/hostname"], id="key-not-allowed"),
        pytest.param("locked", {"topology.kubernetes.io/zone": "site-a"}, ["spec.requirements.node_selector.topology.kubernetes.io/zone"], id="queue-allows-none"),
        pytest.param(None, {"anything": "x"}, [], id="default-queue-allows-any"),
    ],
)
def test_node_selector_keys_only_where_the_queue_allows_them(queue: str | None, selector: dict[str, str], bad: list[str]) -> None:
    got = errors(wl(queue=queue, node_selector=selector))
    assert [p for p, _ in got] == bad
    assert all(f"queue {queue} does not allow node selector key" in m for _, m in got)


def test_each_stage_is_checked_against_the_pipelines_queue() -> None:
    w = workload_from_obj({"metadata": {"name": "p"}, "spec": {
        "image": DIGEST, "command": ["true"], "policy_queue": "locked",
        "stages": [{"name": "a"}, {"name": "b", "depends_on": ["a"], "requirements": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}],
    }})  # fmt: skip
    assert [p for p, _ in errors(w)] == ["spec.stages[1].requirements.tolerations[0]"]


def test_an_unknown_queue_is_left_to_the_queue_check() -> None:
    assert errors(wl(queue="nope", tolerations=[{"key": "dedicated"}])) == []


def test_the_policy_rejects_allowed_keys_that_are_not_label_keys() -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_yaml("queues:\n  - {name: default, allowed_taints: ['no spaces allowed'], allowed_node_labels: ['*', '/x']}\n")
    assert sorted(e.path for e in err.value.errors) == ["queues[0].allowed_node_labels[1]", "queues[0].allowed_taints[0]"]
