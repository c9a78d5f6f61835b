"""Where things are inside an attempt's pod (issue 28, docs/storage.md "What runs where").

The pod shares no disk with the control plane: everything it reads or writes is under two volumes
the Job declares, and gpuorch's agent (its own image) moves bytes between them and the stores.

| path                     | volume                          | what                                  |
|--------------------------|---------------------------------|---------------------------------------|
| /gpuorch/out             | emptyDir ``gpuorch-work``       | outputs ($GPUORCH_OUTPUT_DIR)         |
| /gpuorch/checkpoints     | same                            | checkpoints ($GPUORCH_CHECKPOINT_DIR) |
| /gpuorch/resume/<file>   | same                            | the fetched checkpoint ($GPUORCH_RESUME_FROM) |
| /gpuorch/inputs/<n>      | same                            | a pipeline stage input (a promoted result) |
| /gpuorch-cache/<ds@v>    | the cluster's cache claim (PVC) | staged datasets ($GPUORCH_INPUT_<REF>) |

Paths reach the containers as ``$(GPUORCH_POD_ROOT)/gpuorch/...``: the Job sets
``GPUORCH_POD_ROOT`` to "" (so a real cluster sees ``/gpuorch/...``), and the embedded clusters,
which run a container as a process, set it to the pod's private root, where they mount the
volumes. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

#: gpuorch's agent image (its own, never the user's: `gpuorch.workloads.agent`), unless the
#: installation names another (GPUORCH_AGENT_IMAGE).
AGENT_IMAGE: Final = "ghcr.io/gpuorch/agent:0.1"
POD_ROOT: Final = "GPUORCH_POD_ROOT"
WORK_VOLUME: Final = "gpuorch-work"
CACHE_VOLUME: Final = "gpuorch-cache"
WORK: Final = "/gpuorch"
CACHE: Final = "/gpuorch-cache"
OUT: Final = f"{WORK}/out"
CHECKPOINTS: Final = f"{WORK}/checkpoints"
RESUME: Final = f"{WORK}/resume"
INPUTS: Final = f"{WORK}/inputs"
AGENT_READY: Final = f"{WORK}/.agent-ready"  # the sidecar's startupProbe looks for it
#: the container's termination message (Kubernetes' default terminationMessagePath): the kubelet
#: creates it before the container starts and reports what it holds in the container's status
TERMINATION_LOG: Final = "/dev/termination-log"
#: Kubernetes keeps at most this many bytes of a termination message
TERMINATION_MESSAGE_LIMIT: Final = 4096


def in_pod(path: str) -> str:
    """A pod path as a Job's env value: Kubernetes expands ``$(GPUORCH_POD_ROOT)``."""
    return f"$({POD_ROOT}){path}"


def local(path: str, env: Mapping[str, str]) -> Path:
    """A pod path as the process inside the pod opens it (gpuorch's agent)."""
    return Path(env.get(POD_ROOT, "") + path)
