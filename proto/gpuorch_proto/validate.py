"""Semantic validation of the workload contract: pure, every error names its field path."""

from __future__ import annotations

import re

from .events import MESSAGE_REF_PREFIX, FieldError
from .units import UnitError, parse_duration, parse_quantity
from .workload import Resources, Workload

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUEUE = re.compile(r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]*$")


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


def _dag(wl: Workload, errors: list[FieldError]) -> None:
    stages = wl.spec.stages
    names = [s.name for s in stages]
    seen: set[str] = set()
    for i, s in enumerate(stages):
        if s.name in seen:
            errors.append(FieldError(path=f"spec.stages[{i}].name", message=f"{s.name!r} is used twice"))
        seen.add(s.name)
        if not _NAME.match(s.name):
            errors.append(
                FieldError(path=f"spec.stages[{i}].name", message=f"{s.name!r} must be lowercase a-z0-9-")
            )
        for j, dep in enumerate(s.depends_on):
            if dep not in names:
                errors.append(
                    FieldError(path=f"spec.stages[{i}].depends_on[{j}]", message=f"unknown stage {dep!r}")
                )
        _resources(s.resources, f"spec.stages[{i}].resources", errors)
        _duration(s.timeout, f"spec.stages[{i}].timeout", errors)
    # cycle check (Kahn)
    deps = {s.name: set(d for d in s.depends_on if d in names) for s in stages}
    ready = [n for n, d in deps.items() if not d]
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        for m, d in deps.items():
            if n in d:
                d.discard(n)
                if not d:
                    ready.append(m)
    if done < len(deps):
        cyclic = sorted(n for n, d in deps.items() if d)
        errors.append(FieldError(path="spec.stages", message=f"dependency cycle among {cyclic}"))


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
    for i, inp in enumerate(spec.inputs):
        if not _REF.match(inp.ref):
            errors.append(
                FieldError(
                    path=f"spec.inputs[{i}].ref",
                    message=f"{inp.ref!r} is not an immutable versioned reference (name@version)",
                )
            )
        if inp.size_gb < 0:
            errors.append(FieldError(path=f"spec.inputs[{i}].size_gb", message=f"{inp.size_gb:g} is negative"))
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
    if spec.preemptible and not spec.checkpoint.path:
        errors.append(
            FieldError(
                path="spec.checkpoint.path",
                message="preemptible work must declare checkpointing (spec.checkpoint.path)",
            )
        )
    if spec.preferences.time_weight < 0 or spec.preferences.cost_weight < 0:
        errors.append(FieldError(path="spec.preferences", message="weights must be >= 0"))
    _dag(wl, errors)
    return errors
