"""What a pipeline child's Job gets in its environment, besides its document's `env`.

Part of the contract between the router (which resolves a stage's inputs and a trial's
parameters) and the dispatcher (which builds the Job), and of the contract with the program in
the Job, which reads these variables (docs/pipelines.md). GPUORCH_* is gpuorch's own namespace:
a workload document may never set it (`gpuorch_proto.validate`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from . import events as ev
from .workload import ParamValue

PARAM_ENV = "GPUORCH_PARAM_"
INPUT_ENV = "GPUORCH_INPUT_"
INPUTS_ENV = "GPUORCH_INPUTS"


def format_param(v: ParamValue) -> str:
    """A parameter's value as text (the same in a Job's env and in `${name}` substitution)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def env_token(name: str) -> str:
    """A stage or parameter name as an environment variable suffix."""
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def job_env(
    parameters: Mapping[str, ParamValue], inputs: Sequence[ev.StageInput], paths: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A trial's parameters as `GPUORCH_PARAM_<NAME>`, and each dependency's promoted result as
    `GPUORCH_INPUT_<STAGE>` (the directory in the pod it is fetched into: `paths[stage]`, else its
    manifest URL), `GPUORCH_INPUT_<STAGE>_URL` (its manifest) and `GPUORCH_INPUT_<STAGE>_VERSION`
    (the promoted attempt), plus `GPUORCH_INPUTS` (all of them, JSON)."""
    env = {PARAM_ENV + env_token(k): format_param(v) for k, v in parameters.items()}
    where = dict(paths or {})
    for i in inputs:
        env[INPUT_ENV + env_token(i.stage)] = where.get(i.stage, i.result_path)
        env[INPUT_ENV + env_token(i.stage) + "_URL"] = i.result_path
        env[INPUT_ENV + env_token(i.stage) + "_VERSION"] = i.attempt_id
    if inputs:
        env[INPUTS_ENV] = json.dumps(
            {
                i.stage: {"path": where.get(i.stage, i.result_path), "url": i.result_path, "version": i.attempt_id, "store": i.store}
                for i in inputs
            },
            sort_keys=True,
        )
    return env
