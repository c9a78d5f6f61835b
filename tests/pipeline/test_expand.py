"""expand: stages and sweeps become child workloads with deterministic ids, in a deterministic order."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_proto import decode_event, encode, validate
from gpuorch_proto import events as ev
from gpuorch_proto.jobenv import job_env
from gpuorch_proto.subjects import valid_token
from gpuorch_router import pipeline as pl

from .builders import NOW, make_dag, make_sweep, make_workload

THREE = {"prep": [], "train": ["prep"], "eval": ["train", "prep"]}


def test_three_stages_become_three_children_each_with_its_own_resources() -> None:
    wl = make_dag(THREE, gpus={"train": 8}, inputs=[{"ref": "imagenet@v3", "locations": ["nfs"]}])
    x = pl.expand("pipe-1", wl, NOW)
    assert [c.workload_id for c in x.children] == ["pipe-1--prep", "pipe-1--train", "pipe-1--eval"]
    gpus = {c.stage: c.workload.spec.resources.gpus for c in x.children}
    assert gpus == {"prep": 0, "train": 8, "eval": 0}  # the CPU stages hold no GPU
    train = x.children[1].workload
    assert train.spec.stages == [] and train.spec.inputs[0].ref == "imagenet@v3"
    assert (
        train.metadata.labels[pl.LABEL_PIPELINE] == "pipe-1"
        and train.metadata.labels[pl.LABEL_STAGE] == "train"
    )
    assert train.metadata.workload_class == "dag/train"  # run times are learnt per stage
    assert x.children[2].depends_on == ("train", "prep")


def test_expansion_records_the_children_then_submits_each() -> None:
    x = pl.expand("pipe-1", make_dag(THREE), NOW)
    record, *subs = x.events
    assert isinstance(record, ev.PipelineExpanded) and record.event_id == "pipe-1.pipeline-expanded"
    assert [c.workload_id for c in record.children] == [c.workload_id for c in x.children]
    assert all(isinstance(s, ev.Submitted) for s in subs)
    assert [s.event_id for s in subs] == [f"{c.workload_id}.submitted" for c in x.children]
    for e in x.events:  # every event is a valid message every reader accepts
        assert decode_event(encode(e)) == e


@pytest.mark.parametrize(
    ("stage_fields", "field", "expected"),
    [
        pytest.param({}, "image", "inherits", id="no-image-runs-the-pipelines"),
        pytest.param(
            {"command": ["prep.sh"]}, "command", ["prep.sh"], id="own-command-replaces-the-pipelines"
        ),
        pytest.param({"queue": "primary/cpu"}, "queue", "primary/cpu", id="own-queue-pins-its-own-cluster"),
        pytest.param({"env": {"A": "stage"}}, "env", {"A": "stage", "B": "spec"}, id="env-merged-stage-wins"),
        pytest.param({}, "expected_runtime", None, id="never-the-pipelines-run-time"),
        pytest.param({"timeout": "1h"}, "timeout", "1h", id="own-timeout"),
    ],
)
def test_a_stage_inherits_what_it_does_not_set(
    stage_fields: dict[str, object], field: str, expected: object
) -> None:
    wl = make_workload(
        "p",
        env={"A": "spec", "B": "spec"},
        expected_runtime="4h",
        timeout="9h",
        stages=[{"name": "s", **stage_fields}],
    )
    child = pl.expand("p-1", wl, NOW).children[0].workload
    value = getattr(child.spec, field)
    assert value == (wl.spec.image if expected == "inherits" else expected)


def test_a_grid_becomes_its_product_with_the_last_parameter_varying_fastest() -> None:
    wl = make_sweep(
        grid={"lr": [0.1, 0.01], "batch": [32, 64, 128]}, args=["--lr={{lr}}", "--batch", "{{ batch }}"]
    )
    x = pl.expand("s-1", wl, NOW)
    assert [c.workload_id for c in x.children] == [f"s-1--t{i:04d}" for i in range(6)]
    assert [dict(c.parameters) for c in x.children[:4]] == [
        {"lr": 0.1, "batch": 32},
        {"lr": 0.1, "batch": 64},
        {"lr": 0.1, "batch": 128},
        {"lr": 0.01, "batch": 32},
    ]
    assert x.children[3].workload.spec.args == ["--lr=0.01", "--batch", "32"]
    assert x.children[3].workload.metadata.labels[pl.LABEL_TRIAL] == "3"
    assert all(c.workload.spec.sweep is None for c in x.children)


def test_a_trial_list_keeps_its_order_and_values() -> None:
    wl = make_sweep(
        trials=[{"opt": "adam", "warm": True}, {"opt": "sgd", "warm": False}], env={"OPT": "{{opt}}"}
    )
    x = pl.expand("s-1", wl, NOW)
    assert [c.workload.spec.env["OPT"] for c in x.children] == ["adam", "sgd"]
    assert job_env(x.children[0].parameters, []) == {
        "GPUORCH_PARAM_OPT": "adam",
        "GPUORCH_PARAM_WARM": "true",
    }


def test_the_200_trial_example_makes_200_valid_children() -> None:
    from pathlib import Path

    from gpuorch_proto import load_workload_yaml

    root = Path(__file__).resolve().parents[2]
    wl = load_workload_yaml((root / "examples/pipelines/sweep-200.yaml").read_text())
    x = pl.expand("lr-sweep-0123456789", wl, NOW)
    assert len(x.children) == 200 and x.children[-1].stage == "t0199"
    assert all(validate.validate_workload(c.workload) == [] for c in x.children)
    assert x.children[0].workload.spec.args[-6:] == ["--lr", "0.0001", "--batch", "32", "--seed", "1"]


def test_a_plain_workload_has_no_children() -> None:
    assert pl.expand("w-1", make_workload(), NOW) == pl.Expansion("w-1", (), ())


def test_a_too_long_child_id_is_shortened_deterministically() -> None:
    parent = "p" * 50
    a, b = pl.child_id(parent, "stage-" + "x" * 30), pl.child_id(parent, "stage-" + "y" * 30)
    assert valid_token(a) and valid_token(b) and a != b
    assert a == pl.child_id(parent, "stage-" + "x" * 30)


_names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", fullmatch=True)
_ids = st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True)


@given(parent=_ids, names=st.lists(_names, min_size=1, max_size=8, unique=True))
@settings(max_examples=150, deadline=None)
def test_child_ids_are_valid_distinct_and_independent_of_stage_order(parent: str, names: list[str]) -> None:
    ids = [pl.child_id(parent, n) for n in names]
    assert all(valid_token(i) for i in ids)
    assert len(set(ids)) == len(ids)
    stages = [{"name": n} for n in names]
    wl = make_workload("p", stages=stages)
    rev = make_workload("p", stages=list(reversed(stages)))
    fwd = {c.stage: c.workload_id for c in pl.expand(parent, wl, NOW).children}
    back = {c.stage: c.workload_id for c in pl.expand(parent, rev, NOW).children}
    assert fwd == back == dict(zip(names, ids, strict=True))


@given(
    grid=st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
        st.lists(st.integers(-5, 50), min_size=1, max_size=4, unique=True),
        min_size=1,
        max_size=3,
    )
)
@settings(max_examples=100, deadline=None)
def test_a_sweep_expands_the_same_way_every_time_into_valid_children(grid: dict[str, list[int]]) -> None:
    wl = make_sweep(grid=grid, args=[f"--{k}={{{{{k}}}}}" for k in grid])
    one, two = pl.expand("s-1", wl, NOW), pl.expand("s-1", wl, NOW)
    assert msgspec.json.encode(list(one.events)) == msgspec.json.encode(list(two.events))
    n = 1
    for v in grid.values():
        n *= len(v)
    assert len(one.children) == n == validate.sweep_size(wl.spec.sweep)  # type: ignore[arg-type]
    assert len({tuple(sorted(c.parameters.items())) for c in one.children}) == n  # every combination once
    assert [c.workload_id for c in one.children] == sorted(c.workload_id for c in one.children)
    assert all(validate.validate_workload(c.workload) == [] for c in one.children)
