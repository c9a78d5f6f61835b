"""The seed's workloads parse under the contract; the bad ones fail for the stated reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuorch_proto import ContractError, load_workload_yaml
from gpuorch_proto.units import parse_duration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(rel: str):
    return load_workload_yaml((EXAMPLES / rel).read_text())


def test_train_imagenet_is_the_seed_job():
    wl = load("seed/train-imagenet.yaml")
    s = wl.spec
    assert (s.resources.gpus, s.resources.gpu_memory_gib, s.resources.same_node) == (8, 80, True)
    (inp,) = s.inputs
    assert (inp.ref, inp.size_gb, inp.locations) == ("imagenet@v3", 1350, ["primary-nfs"])
    assert s.output.store == "prod" and s.checkpoint.portable
    assert parse_duration(s.expected_runtime) == 3600 and s.reference_accelerator == "NVIDIA-A100-SXM4-80GB"
    args = s.args
    steps, step_s = int(args[args.index("--steps") + 1]), float(args[args.index("--step-seconds") + 1])
    assert steps * step_s == 3600  # the trainer's simulated run time is the declared one


def test_eval_short_and_finetune():
    ev = load("seed/eval-short.yaml").spec
    assert ev.resources.gpus == 1 and ev.output.store == "scratch"
    assert [t.key for t in ev.requirements.tolerations] == ["gpuorch.io/short-only"]
    ft = load("seed/finetune-40g.yaml").spec
    assert (ft.resources.gpus, ft.resources.gpu_memory_gib, ft.resources.same_node) == (4, 40, True)
    assert ft.output.store == "prod"  # the 40 GB cluster of deploy/local reaches prod only


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(EXAMPLES)) for p in (EXAMPLES / "seed").glob("*.yaml")))
def test_seed_commands_are_location_independent(rel):
    s = load(rel).spec
    assert s.command == ["python", "-m", "gpuorch.workloads.train"]


def test_fractional_gpu_is_rejected_with_the_field_path():
    with pytest.raises(ContractError) as exc:
        load("bad/fractional.yaml")
    assert [e.path for e in exc.value.errors] == ["spec.resources.gpus"]
    assert "sharing" in exc.value.errors[0].message


def test_pinned_ineligible_is_a_valid_contract_that_routing_must_refuse():
    s = load("bad/pinned-ineligible.yaml").spec
    # pinned to the short cluster's own queue (deploy/local/clusters.yaml), writing to `prod`,
    # which that cluster cannot reach: an error with reasons, never a silent fallback
    assert s.queue == "short/short" and s.output.store == "prod"
