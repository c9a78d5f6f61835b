"""Validation of pipelines, sweeps, limits and the admission policy: every error names its field path."""

from __future__ import annotations

from typing import Any

import pytest

from gpuorch_proto import ContractError, workload_from_obj
from gpuorch_proto.codec import policy_from_obj
from gpuorch_proto.policy import PolicyError

from .builders import DIGEST


def errors_of(**spec: Any) -> list[tuple[str, str]]:
    doc = {"metadata": {"name": "p"}, "spec": {"image": DIGEST, "command": ["run"], **spec}}
    try:
        workload_from_obj(doc)
    except ContractError as exc:
        return [(e.path, e.message) for e in exc.errors]
    return []


def s(name: str, *deps: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "depends_on": list(deps), **kw}


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        pytest.param(
            {"stages": [s("a", "b"), s("b", "c"), s("c", "a")]},
            "spec.stages",
            "dependency cycle: a -> b -> c -> a",
            id="cycle-named-as-a-path",
        ),
        pytest.param(
            {"stages": [s("a", "a")]}, "spec.stages", "dependency cycle: a -> a", id="self-dependency"
        ),
        pytest.param(
            {"stages": [s("a", "nope")]},
            "spec.stages[0].depends_on[0]",
            "unknown stage 'nope'",
            id="unknown-dependency",
        ),
        pytest.param(
            {"stages": [s("a"), s("a")]}, "spec.stages[1].name", "'a' is used twice", id="name-twice"
        ),
        pytest.param(
            {"command": [], "stages": [s("a", command=["x"]), s("b")]},
            "spec.stages[1].command",
            "is empty and so is spec.command: nothing to run",
            id="stage-with-nothing-to-run",
        ),
        pytest.param(
            {"stages": [s("a", image="train:latest")]},
            "spec.stages[0].image",
            "'train:latest' is not pinned by digest (expected repo@sha256:<64 hex>)",
            id="stage-image-by-tag",
        ),
        pytest.param(
            {"sweep": {"grid": {"lr": [0.1]}}, "stages": [s("a")]},
            "spec.sweep",
            "a sweep of a workload with stages is not supported yet; sweep a single-stage workload",
            id="sweep-of-stages",
        ),
        pytest.param(
            {"sweep": {"grid": {f"p{i}": list(range(10)) for i in range(5)}}},
            "spec.sweep.grid",
            "10 x 10 x 10 x 10 x 10 is more than 10000 trials",
            id="grid-too-large",
        ),
        pytest.param(
            {"sweep": {"grid": {"lr": [0.1, 0.10]}}},
            "spec.sweep.grid.lr[1]",
            "0.1 is listed twice",
            id="value-twice",
        ),
        pytest.param({"sweep": {"grid": {"lr": []}}}, "spec.sweep.grid.lr", "has no values", id="no-values"),
        pytest.param(
            {"sweep": {}}, "spec.sweep", "names no parameters: set grid or trials", id="empty-sweep"
        ),
        pytest.param(
            {"sweep": {"trials": [{"lr": 1}, {"seed": 2}]}},
            "spec.sweep.trials[1]",
            "has parameters ['seed']; trials[0] has ['lr']",
            id="trials-differ",
        ),
        pytest.param(
            {"args": ["--lr", "{{ rate }}"], "sweep": {"grid": {"lr": [1]}}},
            "spec.args[1]",
            "{{ rate }} names no parameter of spec.sweep (it has: lr)",
            id="unknown-placeholder",
        ),
        pytest.param(
            {"limits": {"max_running": 0}}, "spec.limits.max_running", "0 must be at least 1", id="limit-zero"
        ),
        pytest.param(
            {"policy_queue": "Research"},
            "spec.policy_queue",
            "'Research' must be a queue name: a-z, 0-9 and '-'",
            id="queue-name",
        ),
    ],
)
def test_a_bad_pipeline_is_refused_with_its_field_path(spec: dict[str, Any], path: str, message: str) -> None:
    assert (path, message) in errors_of(**spec)


def test_true_and_one_are_different_values() -> None:
    assert errors_of(sweep={"grid": {"flag": [True, 1, "1"]}}) == []


def test_a_long_chain_and_a_wide_join_are_valid() -> None:
    chain = [s("s0")] + [s(f"s{i}", f"s{i - 1}") for i in range(1, 500)]
    assert errors_of(stages=chain) == []
    join = [s(f"w{i}") for i in range(499)] + [s("join", *(f"w{i}" for i in range(499)))]
    assert errors_of(stages=join) == []
    assert errors_of(stages=[*chain, s("extra")])[0] == ("spec.stages", "501 stages: at most 500")


def test_a_cycle_deep_in_a_long_chain_is_found() -> None:
    chain = [s("s0", "s499")] + [s(f"s{i}", f"s{i - 1}") for i in range(1, 500)]
    [(path, message)] = errors_of(stages=chain)
    assert path == "spec.stages" and message.startswith("dependency cycle: s0 -> s499 -> s498")


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        pytest.param(
            {"queues": [{"name": "a"}, {"name": "a"}], "default_queue": "a"},
            "queues[1].name",
            id="queue-twice",
        ),
        pytest.param({"queues": [{"name": "a"}]}, "default_queue", id="default-queue-missing"),
        pytest.param(
            {"queues": [{"name": "default", "budget": {"gpu_hours": 0}}]},
            "queues[0].budget.gpu_hours",
            id="zero-budget",
        ),
        pytest.param(
            {"queues": [{"name": "default", "budget": {"gpu_hours": 5, "window": "a week"}}]},
            "queues[0].budget.window",
            id="window-not-a-duration",
        ),
        pytest.param(
            {"queues": [{"name": "default", "owners": []}]}, "queues[0].owners", id="nobody-may-submit"
        ),
        pytest.param({"organisation": {"max_gpus": -1}}, "organisation.max_gpus", id="negative-limit"),
        pytest.param({"queues": [{"name": "default", "limit": {}}]}, "queues[0].limit", id="unknown-field"),
    ],
)
def test_a_bad_policy_is_refused_with_its_field_path(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_obj(doc)
    assert path in [e.path for e in info.value.errors]


def test_the_example_policy_is_valid() -> None:
    from pathlib import Path

    from gpuorch_proto.codec import load_policy_yaml

    root = Path(__file__).resolve().parents[2]
    p = load_policy_yaml((root / "examples/pipelines/queues.yaml").read_text())
    assert [q.name for q in p.queues] == ["default", "production", "research"]
    assert p.queue(None) is p.queues[0] and p.queue("research").budget.gpu_hours == 1000  # type: ignore[union-attr]
