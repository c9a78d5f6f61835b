"""What the dispatcher reads from a Job and its pods (`service.observe`): a failed init container
of gpuorch's agent (staging, a checkpoint fetch, an input's result) gives the attempt's exit code
and names itself in the reason; the uploading sidecar's exit does not."""

from __future__ import annotations

from typing import Any

from gpuorch_dispatcher.service import observe

FAILED_JOB = {"spec": {"parallelism": 1}, "status": {"conditions": [
    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}}  # fmt: skip


def pod(init: list[dict[str, Any]], main: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {"nodeName": "n1", "initContainers": [{"name": "stage-0"}, {"name": "agent", "restartPolicy": "Always"}]}
    status: dict[str, Any] = {"phase": "Failed", "initContainerStatuses": init}
    if main is not None:
        status["containerStatuses"] = [main]
    return {"spec": spec, "status": status}


def terminated(name: str, code: int, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": "Error", "message": message}}}


def test_a_failed_staging_gives_its_exit_code_and_says_why() -> None:
    said = '{"error": "dataset imagenet@v3 at s3://lake/imagenet@v3/ does not match its SHA256SUMS"}'
    o = observe(FAILED_JOB, [pod([terminated("stage-0", 2, said)])])
    assert o.failed and o.exit_code == 2, o
    assert "init container stage-0 exited 2" in o.reason and "SHA256SUMS" in o.reason, o.reason


def test_the_sidecars_exit_is_not_the_attempts() -> None:
    o = observe(FAILED_JOB, [pod([terminated("stage-0", 0), terminated("agent", 143)], main=terminated("main", 3))])
    assert o.exit_code == 3 and "init container" not in o.reason and o.reason.endswith("(exit code 3)"), o.reason


def test_a_clean_run_has_no_exit_code() -> None:
    done = {"spec": {"parallelism": 1}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    o = observe(done, [pod([terminated("stage-0", 0), terminated("agent", 0)], main=terminated("main", 0))])
    assert o.complete and not o.failed and o.exit_code is None and o.reason == ""
