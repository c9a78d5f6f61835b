"""The node-matching predicates of `gpuorch_proto.placement` on GPU Feature Discovery's names.

A product name is a GPU model and, for shared GPUs, what the device plugin appended: `-MIG-<profile>`
(MIG `single` strategy) or `-SHARED` (time-slicing / MPS with `renameByDefault`). A name in
`resources.accelerators` names the model; the sharing is the SHARING / GPU_SHARED checks' to judge
(issue 27, defect 3).
"""

from __future__ import annotations

import pytest

from gpuorch_proto.placement import accelerator_matches, mig_profile, sharing_ok
from gpuorch_proto.workload import Sharing

MIG_1G = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


@pytest.mark.parametrize(
    ("wanted", "product", "match"),
    [
        ("A100", "NVIDIA-A100-SXM4-40GB", True),
        ("L4", "NVIDIA-L40S", False),
        ("A100-SXM4-40GB", MIG_1G, True),  # the model; a whole-GPU request is refused by GPU_SHARED
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", MIG_1G, True),  # the full name, exactly
        ("40GB-MIG", MIG_1G, False),  # never a run into the slice's suffix
        ("MIG-1g.5gb", MIG_1G, False),
        ("1g.5gb", MIG_1G, False),
        ("L4", "NVIDIA-L4-SHARED", True),
        ("SHARED", "NVIDIA-L4-SHARED", False),
        ("L4-SHARED", "NVIDIA-L4-SHARED", False),
    ],
)
def test_an_accelerator_name_names_the_model_not_the_slice(wanted: str, product: str, match: bool) -> None:
    assert accelerator_matches(wanted, product) is match


@pytest.mark.parametrize(
    ("product", "profile"),
    [
        (MIG_1G, "1g.5gb"),
        ("A100-SXM4-40GB-MIG-3g.20gb", "3g.20gb"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA-A100-SXM4-40GB", None),
        ("NVIDIA-L4-SHARED", None),
        (None, None),
    ],
)
def test_the_mig_profile_of_a_product_name(product: str | None, profile: str | None) -> None:
    assert mig_profile(product) == profile


@pytest.mark.parametrize(
    ("sharing", "offered", "ok"),
    [
        (None, [], True),
        (None, ["time-slicing"], False),
        (None, ["mps"], False),
        (None, ["mig", "mig:1g.5gb"], False),
        (Sharing(mechanism="time-slicing"), ["time-slicing"], True),
        (Sharing(mechanism="time-slicing"), [], False),
        (Sharing(mechanism="time-slicing"), ["mps"], False),
        (Sharing(mechanism="time-slicing"), ["mig", "mig:1g.5gb", "time-slicing"], False),  # a slice of a slice
        (Sharing(mechanism="mig"), ["mig", "mig:1g.5gb"], True),
        (Sharing(mechanism="mig", profile="1g.5gb"), ["mig", "mig:1g.5gb"], True),
        (Sharing(mechanism="mig", profile="3g.20gb"), ["mig", "mig:1g.5gb"], False),
        (Sharing(mechanism="mig", profile="1g.5gb"), ["mig"], False),  # profile unknown: not promised
        (Sharing(mechanism="mps"), ["mps"], True),
    ],
)
def test_a_shared_gpu_serves_only_the_mechanism_named(sharing: Sharing | None, offered: list[str], ok: bool) -> None:
    assert sharing_ok(sharing, offered) is ok
