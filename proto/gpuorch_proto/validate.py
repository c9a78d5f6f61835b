"""Semantic validation of the workload contract: pure, every error names its field path."""

from __future__ import annotations

import math
import re

from .credentials import credential_errors, literal_secret_errors
from .events import MESSAGE_REF_PREFIX, FieldError
from .policy import AdmissionPolicy, FairShare
from .units import UnitError, parse_duration, parse_quantity
from .workload import (
    DatasetInput,
    Limits,
    ParamValue,
    Resources,
    Stage,
    Sweep,
    Workload,
    WorkloadSpecBody,
    interruptible,
)

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUEUE = re.compile(r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _resources(res: Resources, at: str, errors: list[FieldError]) -> None:
    g = res.gpus
    if g < 0:
        errors.append(FieldError(path=f"{at}.gpus", message=f"{g:g} is negative"))
    elif g != int(g):
        if res.sharing is None:
            errors.append(
                FieldError(
                    path=f"{at}.gpus",
                    message=f"{g:g} is not a whole number; fractional GPUs need a sharing mechanism "
                    "such as a MIG profile (set resources.sharing)",
                )
            )
        elif g > 1:
            errors.append(
                FieldError(path=f"{at}.gpus", message=f"{g:g}: a shared GPU request must be below 1")
            )
    if res.gpu_memory_gib is not None and res.gpu_memory_gib <= 0:
        errors.append(FieldError(path=f"{at}.gpu_memory_gib", message=f"{res.gpu_memory_gib:g} must be > 0"))
    if res.workers < 1:
        errors.append(FieldError(path=f"{at}.workers", message=f"{res.workers} must be at least 1"))
    for key in ("cpu", "memory"):
        try:
            if parse_quantity(getattr(res, key)) <= 0:
                errors.append(FieldError(path=f"{at}.{key}", message="must be > 0"))
        except UnitError as exc:
            errors.append(FieldError(path=f"{at}.{key}", message=str(exc)))
    if res.sharing is not None and res.sharing.mechanism == "mig" and not res.sharing.profile:
        errors.append(
            FieldError(path=f"{at}.sharing.profile", message="a MIG request names its profile, e.g. 1g.10gb")
        )


def _duration(value: str | None, at: str, errors: list[FieldError]) -> None:
    if value is None:
        return
    try:
        parse_duration(value)
    except UnitError as exc:
        errors.append(FieldError(path=at, message=str(exc)))


MAX_STAGES = 500
MAX_TRIALS = 10_000
PARAM_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
PLACEHOLDER = re.compile(r"\{\{\s*([^{}\s]*)\s*\}\}")


def _stage_fields(spec: WorkloadSpecBody, s: Stage, at: str, errors: list[FieldError]) -> None:
    """A stage's own fields (issue 13): each is routed as a workload of its own."""
    _resources(s.resources, f"{at}.resources", errors)
    _duration(s.timeout, f"{at}.timeout", errors)
    _duration(s.expected_runtime, f"{at}.expected_runtime", errors)
    if not s.command and not spec.command:
        errors.append(
            FieldError(path=f"{at}.command", message="is empty and so is spec.command: nothing to run")
        )
    if s.image is not None and not _DIGEST.match(s.image):
        errors.append(
            FieldError(
                path=f"{at}.image",
                message=f"{s.image!r} is not pinned by digest (expected repo@sha256:<64 hex>)",
            )
        )
    if s.queue is not None and not _QUEUE.match(s.queue):
        errors.append(
            FieldError(path=f"{at}.queue", message=f"{s.queue!r} is not of the form <agent>/<queue>")
        )
    _inputs(s.inputs, f"{at}.inputs", errors)
    if s.preferences is not None and (s.preferences.time_weight < 0 or s.preferences.cost_weight < 0):
        errors.append(FieldError(path=f"{at}.preferences", message="weights must be >= 0"))


def _cycle(order: list[str], deps: dict[str, list[str]]) -> list[str] | None:
    """One dependency cycle, as a path a -> b -> a, or None: iterative DFS, O(V+E)."""
    colour: dict[str, int] = {}  # absent: unseen, 1: on the path, 2: done
    for root in order:
        if root in colour:
            continue
        path: list[str] = [root]
        colour[root] = 1
        todo = [iter(deps[root])]
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                todo.pop()
            elif colour.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in colour:
                colour[nxt] = 1
                path.append(nxt)
                todo.append(iter(deps[nxt]))
    return None


# Bounds on what one document may ask for (a body is at most 1 MiB on the bus anyway).
MAX_ENV = 256
MAX_ARGS = 1024
MAX_STRING = 8192
# An encoded submit: its `submitted` event carries the workload (and more) and must fit in one
# message of the event stream (1 MiB, the server's max_payload), so the body gets half of that.
MAX_SUBMIT_BYTES = 512 * 1024


def body_size_error(size: int, limit: int = MAX_SUBMIT_BYTES) -> FieldError | None:
    """A submit body over the limit, named with its size and the limit (None: within it)."""
    if size <= limit:
        return None
    return FieldError(path="$", message=f"the submit body is {size:,} bytes: at most {limit:,} bytes ({limit // 1024} KiB)")


# Environment variables gpuorch or the GPU runtime own: a workload may not set them.
RESERVED_ENV_PREFIXES = ("GPUORCH_", "NVIDIA_", "CUDA_")
RESERVED_ENV = frozenset({"TRACEPARENT", "TRACESTATE"})


def _env_and_args(
    env: dict[str, str], args: list[str], command: list[str], at: str, errors: list[FieldError]
) -> None:
    if len(env) > MAX_ENV:
        errors.append(FieldError(path=f"{at}.env", message=f"{len(env)} variables: at most {MAX_ENV}"))
    for key, value in list(env.items())[:MAX_ENV]:
        upper = key.upper()
        if upper in RESERVED_ENV or upper.startswith(RESERVED_ENV_PREFIXES):
            errors.append(FieldError(
                path=f"{at}.env.{key[:80]}",
                message="is set by gpuorch or the GPU runtime (GPUORCH_*, NVIDIA_*, CUDA_*, TRACEPARENT): a workload may not set it",
            ))  # fmt: skip
        if len(value) > MAX_STRING:
            errors.append(
                FieldError(
                    path=f"{at}.env.{key[:80]}", message=f"{len(value)} characters: at most {MAX_STRING}"
                )
            )
    errors.extend(literal_secret_errors(env, f"{at}.env"))  # named credentials only (gpuorch_proto.credentials)
    for name, items in (("args", args), ("command", command)):
        if len(items) > MAX_ARGS:
            errors.append(FieldError(path=f"{at}.{name}", message=f"{len(items)} items: at most {MAX_ARGS}"))
        elif any(len(x) > MAX_STRING for x in items):
            errors.append(
                FieldError(path=f"{at}.{name}", message=f"an item longer than {MAX_STRING} characters")
            )


def _inputs(inputs: list[DatasetInput], at: str, errors: list[FieldError]) -> None:
    for i, inp in enumerate(inputs):
        if not _REF.match(inp.ref):
            errors.append(
                FieldError(
                    path=f"{at}[{i}].ref",
                    message=f"{inp.ref!r} is not an immutable versioned reference (name@version)",
                )
            )
        if inp.size_gb < 0:
            errors.append(FieldError(path=f"{at}[{i}].size_gb", message=f"{inp.size_gb:g} is negative"))


def _dag(wl: Workload, errors: list[FieldError]) -> None:
    """Stage names, references and cycles, O(V+E) (`_cycle`)."""
    spec = wl.spec
    stages = spec.stages
    if len(stages) > MAX_STAGES:
        errors.append(FieldError(path="spec.stages", message=f"{len(stages)} stages: at most {MAX_STAGES}"))
        return
    names = {s.name for s in stages}
    seen: set[str] = set()
    for i, s in enumerate(stages):
        at = f"spec.stages[{i}]"
        if s.name in seen:
            errors.append(FieldError(path=f"{at}.name", message=f"{s.name!r} is used twice"))
        seen.add(s.name)
        if not _NAME.match(s.name):
            errors.append(FieldError(path=f"{at}.name", message=f"{s.name!r} must be lowercase a-z0-9-"))
        for j, dep in enumerate(s.depends_on):
            if dep not in names:
                errors.append(FieldError(path=f"{at}.depends_on[{j}]", message=f"unknown stage {dep!r}"))
        _stage_fields(spec, s, at, errors)
        _env_and_args(s.env, s.args, s.command, at, errors)
        if s.requirements is not None:
            errors.extend(credential_errors(s.requirements.credentials, f"{at}.requirements.credentials"))
    order = list(dict.fromkeys(s.name for s in stages))
    deps: dict[str, list[str]] = {n: [] for n in order}
    for s in stages:
        deps[s.name] += [d for d in s.depends_on if d in names]
    cycle = _cycle(order, deps)
    if cycle is not None:
        errors.append(FieldError(path="spec.stages", message="dependency cycle: " + " -> ".join(cycle[:20])))


def validate_workload(wl: Workload) -> list[FieldError]:
    """Every rule the contract states beyond types; empty list = valid."""
    errors: list[FieldError] = []
    spec = wl.spec
    if wl.api_version != "gpuorch/v1":
        errors.append(FieldError(path="apiVersion", message=f"{wl.api_version!r}: only gpuorch/v1 is known"))
    if not _NAME.match(wl.metadata.name):
        errors.append(
            FieldError(
                path="metadata.name",
                message=f"{wl.metadata.name!r} must be 1-40 characters of a-z, 0-9 and '-'",
            )
        )
    elif wl.metadata.name.startswith(MESSAGE_REF_PREFIX):
        errors.append(
            FieldError(
                path="metadata.name",
                message=f"{wl.metadata.name!r}: the prefix {MESSAGE_REF_PREFIX!r} is reserved for records of messages",
            )
        )
    if not _DIGEST.match(spec.image):
        errors.append(
            FieldError(
                path="spec.image",
                message=f"{spec.image!r} is not pinned by digest (expected repo@sha256:<64 hex>)",
            )
        )
    if not spec.command and not spec.stages:
        errors.append(FieldError(path="spec.command", message="is empty: nothing to run"))
    _resources(spec.resources, "spec.resources", errors)
    _env_and_args(spec.env, spec.args, spec.command, "spec", errors)
    errors.extend(credential_errors(spec.requirements.credentials, "spec.requirements.credentials"))
    _inputs(spec.inputs, "spec.inputs", errors)
    if spec.queue is not None and not _QUEUE.match(spec.queue):
        errors.append(
            FieldError(path="spec.queue", message=f"{spec.queue!r} is not of the form <agent>/<queue>")
        )
    for path, value in (
        ("spec.timeout", spec.timeout),
        ("spec.expected_runtime", spec.expected_runtime),
        ("spec.retry.backoff", spec.retry.backoff),
        ("spec.checkpoint.interval", spec.checkpoint.interval),
        ("spec.lease", spec.lease),
    ):
        _duration(value, path, errors)
    if spec.retry.budget < 0:
        errors.append(FieldError(path="spec.retry.budget", message=f"{spec.retry.budget} is negative"))
    if spec.preemptible and not interruptible(wl):
        errors.append(
            FieldError(
                path="spec.checkpoint.path",
                message="preemptible work must declare checkpointing (spec.checkpoint.path)",
            )
        )
    if spec.preferences.time_weight < 0 or spec.preferences.cost_weight < 0:
        errors.append(FieldError(path="spec.preferences", message="weights must be >= 0"))
    _dag(wl, errors)
    _sweep(wl, errors)
    _limits(spec.limits, "spec.limits", errors)
    if spec.policy_queue is not None and not _NAME.match(spec.policy_queue):
        errors.append(
            FieldError(
                path="spec.policy_queue",
                message=f"{spec.policy_queue!r} must be a queue name: a-z, 0-9 and '-'",
            )
        )
    return errors


# ---- issue 13: sweeps, limits, the admission policy (docs/pipelines.md) ------------------


def _value_key(v: ParamValue) -> tuple[str, object]:
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("number", float(v))
    return ("str", v)


def sweep_size(sweep: Sweep) -> int:
    """How many trials a sweep makes (counted, never enumerated; capped just above MAX_TRIALS)."""
    if sweep.trials:
        return len(sweep.trials)
    if not sweep.grid:
        return 0
    n = 1
    for values in sweep.grid.values():
        n *= len(values)
        if n > MAX_TRIALS:
            return MAX_TRIALS + 1
    return n


def _param_name(name: str, at: str, errors: list[FieldError]) -> None:
    if not PARAM_NAME.match(name):
        errors.append(
            FieldError(path=at, message=f"{name!r} must be a-z, 0-9 and '_', not starting with a digit")
        )


def _sweep(wl: Workload, errors: list[FieldError]) -> None:
    """A sweep's parameters: one of grid or trials, at most MAX_TRIALS, every placeholder known.
    O(parameters + values + trials x parameters); the grid's size is counted, never enumerated."""
    spec, sw = wl.spec, wl.spec.sweep
    if sw is None:
        return
    if spec.stages:
        errors.append(
            FieldError(
                path="spec.sweep",
                message="a sweep of a workload with stages is not supported yet; sweep a single-stage workload",
            )
        )
    if sw.grid and sw.trials:
        errors.append(FieldError(path="spec.sweep", message="set grid or trials, not both"))
        return
    if not sw.grid and not sw.trials:
        errors.append(FieldError(path="spec.sweep", message="names no parameters: set grid or trials"))
        return
    params: set[str] = set()
    if sw.grid:
        params = set(sw.grid)
        for name, values in sw.grid.items():
            at = f"spec.sweep.grid.{name}"
            _param_name(name, at, errors)
            if not values:
                errors.append(FieldError(path=at, message="has no values"))
            keys: set[tuple[str, object]] = set()
            for j, v in enumerate(values):
                k = _value_key(v)
                if k in keys:
                    errors.append(FieldError(path=f"{at}[{j}]", message=f"{v!r} is listed twice"))
                keys.add(k)
        if sweep_size(sw) > MAX_TRIALS:
            sizes = " x ".join(str(len(v)) for v in sw.grid.values())
            errors.append(
                FieldError(path="spec.sweep.grid", message=f"{sizes} is more than {MAX_TRIALS} trials")
            )
    else:
        if len(sw.trials) > MAX_TRIALS:
            errors.append(
                FieldError(path="spec.sweep.trials", message=f"{len(sw.trials)} trials: at most {MAX_TRIALS}")
            )
            return
        params = set(sw.trials[0])
        first = sorted(params)
        for i, trial in enumerate(sw.trials):
            at = f"spec.sweep.trials[{i}]"
            if not trial:
                errors.append(FieldError(path=at, message="has no parameters"))
            for name in trial:
                _param_name(name, f"{at}.{name}", errors)
            if i and set(trial) != params:
                errors.append(
                    FieldError(path=at, message=f"has parameters {sorted(trial)}; trials[0] has {first}")
                )
    known = ", ".join(sorted(params))
    texts = [(f"spec.command[{j}]", t) for j, t in enumerate(spec.command)]
    texts += [(f"spec.args[{j}]", t) for j, t in enumerate(spec.args)]
    texts += [(f"spec.env.{k}", v) for k, v in spec.env.items()]
    for at, text in texts:
        for m in PLACEHOLDER.finditer(text):
            if m.group(1) not in params:
                errors.append(
                    FieldError(
                        path=at, message=f"{m.group(0)} names no parameter of spec.sweep (it has: {known})"
                    )
                )


def _limits(limits: Limits, at: str, errors: list[FieldError]) -> None:
    if limits.max_running is not None and limits.max_running < 1:
        errors.append(
            FieldError(path=f"{at}.max_running", message=f"{limits.max_running} must be at least 1")
        )
    if limits.max_gpus is not None and limits.max_gpus < 0:
        errors.append(FieldError(path=f"{at}.max_gpus", message=f"{limits.max_gpus:g} is negative"))


def validate_policy(policy: AdmissionPolicy) -> list[FieldError]:
    """The admission policy's rules beyond types (gpuorch_proto.policy); empty list = valid."""
    errors: list[FieldError] = []
    _limits(policy.organisation, "organisation", errors)
    names: set[str] = set()
    for i, q in enumerate(policy.queues):
        at = f"queues[{i}]"
        if not _NAME.match(q.name):
            errors.append(
                FieldError(
                    path=f"{at}.name", message=f"{q.name!r} must be 1-40 characters of a-z, 0-9 and '-'"
                )
            )
        if q.name in names:
            errors.append(FieldError(path=f"{at}.name", message=f"{q.name!r} is used twice"))
        names.add(q.name)
        if not q.owners:
            errors.append(
                FieldError(
                    path=f"{at}.owners", message="is empty: nobody could submit (use ['*'] for everyone)"
                )
            )
        _limits(q.limits, f"{at}.limits", errors)
        if q.budget is not None:
            if not q.budget.gpu_hours > 0:
                errors.append(
                    FieldError(path=f"{at}.budget.gpu_hours", message=f"{q.budget.gpu_hours:g} must be > 0")
                )
            try:
                if parse_duration(q.budget.window) <= 0:
                    errors.append(FieldError(path=f"{at}.budget.window", message="must be > 0"))
            except UnitError as exc:
                errors.append(FieldError(path=f"{at}.budget.window", message=str(exc)))
        if q.fair_share is not None:
            _fair_share(q.fair_share, f"{at}.fair_share", errors)
        for name, keys in (("allowed_taints", q.allowed_taints), ("allowed_node_labels", q.allowed_node_labels)):
            for j, k in enumerate(keys):
                if k != "*" and not _LABEL_KEY.match(k):
                    errors.append(FieldError(path=f"{at}.{name}[{j}]", message=f"{k[:80]!r} is neither '*' nor a label key"))
    if policy.default_queue not in names:
        errors.append(
            FieldError(
                path="default_queue",
                message=f"{policy.default_queue!r} is not one of the queues {sorted(names)}",
            )
        )
    return errors


def _fair_share(fs: FairShare, at: str, errors: list[FieldError]) -> None:
    for owner, w in fs.weights.items():
        if not (w > 0 and math.isfinite(w)):
            errors.append(FieldError(path=f"{at}.weights.{owner}", message=f"{w:g} must be a finite number > 0"))
    if not (fs.default_weight > 0 and math.isfinite(fs.default_weight)):
        errors.append(FieldError(path=f"{at}.default_weight", message=f"{fs.default_weight:g} must be a finite number > 0"))
    for name, value in (("window", fs.window), ("quantum", fs.quantum)):
        try:
            if parse_duration(value) <= 0:
                errors.append(FieldError(path=f"{at}.{name}", message="must be > 0"))
        except UnitError as exc:
            errors.append(FieldError(path=f"{at}.{name}", message=str(exc)))
