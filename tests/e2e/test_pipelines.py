"""Pipelines and queues on the real embedded system (issue 13 items 1-4; docs/pipelines.md).

The seed's three clusters (deploy/local/clusters.yaml) with the admission policy it names
(examples/pipelines/queues.yaml), a real nats-server with the production permissions, and one
extra client identity, `intern`, that may submit only as owner `interns`.

* the seed's three-stage pipeline runs end to end: CPU stages hold no GPU (read from the Jobs
  through the official kubernetes client), training is released only after preprocessing is
  promoted, evaluation gets training's promoted result by version; `gpuorch get` shows the graph;
* a failed stage stops its dependents with a reason; cancelling a pipeline cancels every stage;
* a 200-trial sweep with a limit of 5: never more than 5 released-and-unfinished (nor running)
  at once, from the events; all 200 finish; `gpuorch explain` of a held trial names the limit;
* a submit to a queue the submitter may not use is `rejected` with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from gpuorch.client import Client
from gpuorch.kube import make_clients
from gpuorch.projection import Projection, WorkloadView
from gpuorch.system import System
from gpuorch_fencer.publish import resolve_result
from gpuorch_proto import (
    Event,
    Workload,
    k8s,
    load_workload_yaml,
    type_tag,
    workload_from_obj,
    workload_to_builtins,
)
from gpuorch_proto import events as ev
from tests.support.system import result_object, running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pipelines"
K = 5  # the sweep's limit


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    state = tmp_path_factory.mktemp("pipelines")
    with running(state, ROOT / "deploy" / "local" / "clusters.yaml", clients={"intern": ["interns"]},
                 env_extra={"GPUORCH_TRACE_FILE": str(state / "spans.jsonl")}) as s:  # fmt: skip
        yield s


def gpuorch(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "gpuorch"
    return subprocess.run([str(cli), "--state", str(system.state_dir), *args], capture_output=True, text=True, timeout=180)


async def family(client: Client, pipeline: str) -> tuple[Projection, list[tuple[int, Event]]]:
    """The pipeline's events and its children's, in stream order, folded."""
    events = await client.pipeline_events(pipeline)
    p = Projection.of(events)
    view = p.get(pipeline)
    assert view is not None and view.children, f"{pipeline} was not expanded"
    return p, events


async def every_stage_terminal(client: Client, pipeline: str) -> tuple[Projection, list[tuple[int, Event]]]:
    p, events = await family(client, pipeline)
    views = {s: p.get(w) for s, w in stage_ids(p, pipeline).items()}
    unfinished = {s: v.status for s, v in views.items() if v is None or not v.terminal}
    assert not unfinished, unfinished
    return p, events


def stage_ids(p: Projection, pipeline: str) -> dict[str, str]:
    view = p.get(pipeline)
    assert view is not None
    return {c.stage: c.workload_id for c in view.children}


def most_at_once(events: list[tuple[int, Event]], ids: set[str], until: int | None = None) -> tuple[int, int]:
    """The most of `ids` released and not finished, and attempts of them running (from `running`
    until they succeed, fail or are confirmed gone: a lost one may still run), at once in the log
    (up to stream sequence `until`). Sets, not counters: an attempt that fails before it runs, or
    an event seen twice, cannot hide one."""
    released: set[str] = set()
    running: set[str] = set()
    most_released = most_running = 0
    for seq, e in events:
        if until is not None and seq > until:
            break
        if e.workload_id not in ids:
            continue
        if isinstance(e, ev.Released):
            released.add(e.workload_id)
        elif isinstance(e, ev.Completed | ev.WorkloadFailed | ev.Cancelled):
            released.discard(e.workload_id)
        elif isinstance(e, ev.Running):
            running.add(e.attempt_id)
        elif isinstance(e, ev.Succeeded | ev.Failed | ev.CancelConfirmed):
            running.discard(e.attempt_id)
        most_released, most_running = max(most_released, len(released)), max(most_running, len(running))
    return most_released, most_running


def first(events: list[tuple[int, Event]], wid: str, kind: str) -> int:
    seqs = [seq for seq, e in events if e.workload_id == wid and type_tag(e) == kind]
    assert seqs, f"{wid} has no {kind}"
    return seqs[0]


class JobRecorder:
    """Every Job the clusters see while it runs, as their API serves it (a watch per cluster,
    through the official kubernetes client): finished Jobs are deleted, so we keep them here."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kube = make_clients(kubeconfig)
        self.jobs: dict[str, Any] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.follow, args=(c,), daemon=True) for c in self.kube.values()]

    def follow(self, cc: Any) -> None:
        while not self.stop.is_set():
            try:
                for got in watch.Watch().stream(cc.batch.list_namespaced_job, k8s.NAMESPACE, timeout_seconds=2):
                    self.jobs.setdefault(got["object"].metadata.name, got["object"])
                    if self.stop.is_set():
                        return
            except Exception:  # a watch that ends badly is started again
                continue

    def __enter__(self) -> JobRecorder:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)

    def of(self, v: WorkloadView) -> Any:
        a = v.attempts[v.promoted_attempt or ""]
        assert a.job_name in self.jobs, f"the Job {a.job_name} was never seen"
        return self.jobs[a.job_name]


def env_of(job: Any) -> dict[str, str]:
    return {e.name: e.value for e in job.spec.template.spec.containers[0].env}


def requests_of(job: Any) -> dict[str, str]:
    return dict(job.spec.template.spec.containers[0].resources.requests)


async def test_the_seeds_three_stage_pipeline_runs_end_to_end(system: System, client: Client) -> None:
    wl = load_workload_yaml((EXAMPLES / "three-stage.yaml").read_text())
    with JobRecorder(system.kubeconfig) as recorder:
        pid = await client.submit(wl)
        final = await client.wait(pid, timeout=300)
    p, events = await family(client, pid)
    ids = stage_ids(p, pid)
    views = {s: p.get(w) for s, w in ids.items()}
    assert final.status == "completed", (final.reason, {s: (v.status, v.reason) for s, v in views.items() if v})
    assert set(ids) == {"preprocess", "train", "evaluate"}
    for s, v in views.items():
        assert v is not None and v.status == "completed" and v.promoted_attempt, (s, v and v.reason)
    pre, train, evaluate = (views[s] for s in ("preprocess", "train", "evaluate"))
    assert pre and train and evaluate
    # the order: training is released (and its Job created) only after preprocessing is promoted
    assert first(events, ids["preprocess"], "promoted") < first(events, ids["train"], "stage-ready")
    assert first(events, ids["train"], "stage-ready") < first(events, ids["train"], "released")
    assert first(events, ids["train"], "released") < first(events, ids["train"], "attempt-created")
    assert first(events, ids["train"], "promoted") < first(events, ids["evaluate"], "attempt-created")
    # CPU stages hold no GPU; training holds its 8, as the cluster's own Job objects say
    jobs = {s: recorder.of(v) for s, v in (("preprocess", pre), ("train", train), ("evaluate", evaluate))}
    assert k8s.GPU_RESOURCE not in requests_of(jobs["preprocess"]), requests_of(jobs["preprocess"])
    assert k8s.GPU_RESOURCE not in requests_of(jobs["evaluate"]), requests_of(jobs["evaluate"])
    assert requests_of(jobs["train"])[k8s.GPU_RESOURCE] == "8"
    # evaluation reads training's promoted output, by version (and preprocessing's)
    env = env_of(jobs["evaluate"])
    assert env["GPUORCH_INPUT_TRAIN_URL"] == train.result_path and env["GPUORCH_INPUT_TRAIN_VERSION"] == train.promoted_attempt
    assert env["GPUORCH_INPUT_TRAIN"] == "$(GPUORCH_POD_ROOT)/gpuorch/inputs/train"  # a pod path: the agent fetched it
    assert env["GPUORCH_INPUT_PREPROCESS_VERSION"] == pre.promoted_attempt
    assert json.loads(env["GPUORCH_INPUTS"])["train"]["version"] == train.promoted_attempt
    fetches = {c.name: [*(c.command or []), *(c.args or [])] for c in jobs["evaluate"].spec.template.spec.init_containers or []}
    assert any("fetch-result" in a and "inputs/train" in " ".join(a) for a in fetches.values()), fetches
    assert json.loads(await result_object(system, train.result_path, "metrics.json"))["attempt_id"] == train.promoted_attempt
    assert env_of(jobs["train"])["GPUORCH_INPUT_PREPROCESS_URL"] == pre.result_path
    # the size of a promoted result is on record (the fencer measured it) and is a routed input
    promoted = {e.workload_id: e for _, e in events if isinstance(e, ev.Promoted)}
    size = promoted[ids["train"]].result_bytes
    from gpuorch.config import load_registry
    from gpuorch.stores import stores_of

    st = system.settings
    manifest = await resolve_result(stores_of(st, load_registry(st.registry) if st.registry else None), train.result_path or "")
    assert size == manifest.total_bytes > 0, size  # the manifest's total: what the agent uploaded
    ready = next(e for _, e in events if isinstance(e, ev.StageReady) and e.workload_id == ids["evaluate"])
    assert {i.stage: i.size_bytes for i in ready.inputs}["train"] == size
    routed = next(e for _, e in events if isinstance(e, ev.Routed) and e.workload_id == ids["evaluate"])
    chosen = next(v for v in routed.decision.verdicts if v.cluster == routed.decision.cluster)
    reads = next(c for c in chosen.checks if c.code == "INPUT_DATA")
    assert f"train@{train.promoted_attempt}" in reads.message and f"preprocess@{pre.promoted_attempt}" in reads.message, reads
    finished = [e for _, e in events if isinstance(e, ev.PipelineFinished)]
    assert len(finished) == 1 and finished[0].outcome == "completed"
    assert finished[0].stages == {"preprocess": "completed", "train": "completed", "evaluate": "completed"}
    # `gpuorch get <pipeline>` shows the graph and each stage's state
    system.save()
    out = gpuorch(system, "get", pid)
    assert out.returncode == 0, out.stderr
    assert "3 of 3 stages completed" in out.stdout, out.stdout
    for s in ids:
        line = next(x for x in out.stdout.splitlines() if x.strip().startswith(s))
        assert "completed" in line and ids[s] in line, line
    assert "after train, preprocess" in out.stdout and "no GPU" in out.stdout and "8 GPU" in out.stdout
    explained = gpuorch(system, "explain", pid)
    assert explained.returncode == 0 and "3 of 3 stages completed" in explained.stdout, explained.stdout
    got = json.loads(gpuorch(system, "get", pid, "-o", "json").stdout)
    assert got["pipeline"]["stages"]["evaluate"]["depends_on"] == ["train", "preprocess"]


def small_dag(name: str, prep_args: list[str], **spec: Any) -> Workload:
    """prep -> (train -> evaluate), and an independent `side` branch: short CPU stages."""
    stage = {"resources": {"cpu": "1", "memory": "1Gi"}}
    steps = ["--steps", "3", "--step-seconds", "60"]
    return workload_from_obj({
        "metadata": {"name": name, "owner": "tests"},
        "spec": {
            "image": "example.org/gpuorch/train@sha256:" + "5e" * 32,
            "command": ["python", "-m", "gpuorch.workloads.train"],
            "output": {"store": "prod"},
            "stages": [
                {"name": "prep", "args": prep_args, **stage},
                {"name": "train", "depends_on": ["prep"], "args": steps, **stage},
                {"name": "evaluate", "depends_on": ["train"], "args": steps, **stage},
                {"name": "side", "args": steps, **stage},
            ],
            **spec,
        },
    })


async def test_a_failed_stage_stops_its_dependents_with_a_reason(client: Client) -> None:
    wl = small_dag("fails", ["--steps", "5", "--fail-at-step", "1", "--exit-code", "2"])  # 2: permanent
    pid = await client.submit(wl)
    final = await client.wait(pid, timeout=180)
    assert final.status == "failed", final.reason
    p, events = await assert_eventually(lambda: every_stage_terminal(client, pid), timeout=60, interval=0.3)
    ids = stage_ids(p, pid)
    status = {s: p.get(w).status for s, w in ids.items()}  # type: ignore[union-attr]
    assert status == {"prep": "failed", "train": "cancelled", "evaluate": "cancelled", "side": "completed"}, status
    blocked = {e.stage: e for _, e in events if isinstance(e, ev.StageBlocked)}
    assert set(blocked) == {"train", "evaluate"}
    assert blocked["train"].failed_stage == "prep" and "depends on stage prep, which failed" in blocked["train"].reason
    assert blocked["evaluate"].failed_stage == "prep" and "(through train)" in blocked["evaluate"].reason
    for s in ("train", "evaluate"):  # never released, never a Job
        kinds = [type_tag(e) for _, e in events if e.workload_id == ids[s]]
        assert "released" not in kinds and "attempt-created" not in kinds, kinds
        assert "depends on stage prep" in (p.get(ids[s]).reason or ""), p.get(ids[s])  # type: ignore[union-attr]
    assert "stage prep failed" in final.reason, final.reason


async def test_cancelling_a_pipeline_cancels_every_stage(client: Client) -> None:
    wl = small_dag("cancelled", ["--steps", "200", "--step-seconds", "600"])  # prep runs ~200 s
    pid = await client.submit(wl)

    async def prep_running() -> bool:
        p, _ = await family(client, pid)
        return p.get(stage_ids(p, pid)["prep"]).status == "running"  # type: ignore[union-attr]

    await assert_eventually(prep_running, timeout=120, interval=0.3)
    await client.cancel(pid, "changed my mind")

    final = await client.wait(pid, timeout=120)
    assert final.status == "cancelled", final.reason

    async def finished() -> tuple[Projection, list[tuple[int, Event]]]:
        # every stage terminal, then the gate's next round publishes the pipeline's end
        p, events = await every_stage_terminal(client, pid)
        assert any(isinstance(e, ev.PipelineFinished) for _, e in events), "no pipeline-finished yet"
        return p, events

    p, events = await assert_eventually(finished, timeout=60, interval=0.5)
    ids = stage_ids(p, pid)
    statuses = {s: p.get(w).status for s, w in ids.items()}  # type: ignore[union-attr]
    assert statuses["prep"] == "cancelled" and statuses["train"] == "cancelled" and statuses["evaluate"] == "cancelled", statuses
    assert statuses["side"] in ("cancelled", "completed"), statuses  # it may have finished first
    prep = p.get(ids["prep"])
    assert prep is not None and all(a.cancel_confirmed for a in prep.attempts.values()), prep.attempts
    asked = [e for _, e in events if isinstance(e, ev.CancelRequested) and e.workload_id == ids["prep"]]
    assert asked and asked[0].reason == f"pipeline {pid} cancelled: changed my mind", asked
    end = [e for _, e in events if isinstance(e, ev.PipelineFinished)]
    assert len(end) == 1 and end[0].outcome == "cancelled", end


def sweep(n_lr: int = 20, n_seed: int = 10) -> Workload:
    """The example sweep (examples/pipelines/sweep-200.yaml), made small: 200 one-CPU trials whose
    command is trivial (it writes its parameters), at most K running at once. The router is
    killed and restarted half-way."""
    doc = workload_to_builtins(load_workload_yaml((EXAMPLES / "sweep-200.yaml").read_text()))
    write = ("import os, pathlib; d = pathlib.Path(os.environ['GPUORCH_OUTPUT_DIR']); d.mkdir(parents=True, exist_ok=True); "
             "(d / 'params').write_text(os.environ['GPUORCH_PARAM_LR'] + ' ' + os.environ['GPUORCH_PARAM_SEED'])")  # fmt: skip
    doc["spec"].update({
        "command": ["python", "-c", write], "args": [], "resources": {"cpu": "1", "memory": "1Gi"},
        "expected_runtime": "1m", "inputs": [],
        "sweep": {"grid": {"lr": [round(0.001 * (i + 1), 4) for i in range(n_lr)], "seed": list(range(n_seed))}},
        "limits": {"max_running": K},
    })  # fmt: skip
    return workload_from_obj(doc)


async def test_a_200_trial_sweep_never_runs_more_than_k_and_finishes_all(system: System, client: Client) -> None:
    pid = await client.submit(sweep())

    async def a_held_trial() -> str:
        p, _ = await family(client, pid)
        held = [v.workload_id for v in p.workloads.values() if v.status == "held"]
        assert held, "no trial held yet"
        return held[-1]

    held = await assert_eventually(a_held_trial, timeout=60, interval=0.2)
    system.save()
    out = gpuorch(system, "explain", held)
    assert out.returncode == 0, out.stderr
    assert f"held: pipeline {pid} at {K} of {K} running workloads" in out.stdout, out.stdout

    async def some_finished(n: int) -> int:
        p, _ = await family(client, pid)
        done = sum(1 for v in p.workloads.values() if v.pipeline == pid and v.status == "completed")
        assert done >= n, done
        return done

    # the router dies mid-sweep and comes back: its gate is rebuilt (snapshot and/or log), the limit holds
    await assert_eventually(lambda: some_finished(20), timeout=120, interval=0.5)
    system.kill("router")
    system.restart("router")
    final = await client.wait(pid, timeout=600)
    p, events = await family(client, pid)
    trials = stage_ids(p, pid)
    assert len(trials) == 200
    done = [w for w in trials.values() if p.get(w).status == "completed"]  # type: ignore[union-attr]
    assert final.status == "completed" and len(done) == 200, (final.reason, len(done))
    # from the events: never more than K released-and-unfinished, nor running, at once
    most_released, most_running = most_at_once(events, set(trials.values()))
    assert most_released == K, most_released  # the limit was reached, and never passed
    assert 1 <= most_running <= K, most_running
    # each trial got its own parameters
    v = p.get(trials["t0123"])
    assert v is not None and (await result_object(system, v.result_path, "params")) == b"0.013 3"
    holds = [e for _, e in events if isinstance(e, ev.Held)]
    assert holds and all(h.holds[0].scope == "pipeline" and h.holds[0].limit == K for h in holds)


async def test_a_submit_to_a_queue_the_submitter_may_not_use_is_rejected_with_the_reason(system: System) -> None:
    s = system.settings
    doc = workload_to_builtins(small_dag("intern-try", ["--steps", "1"]))
    async with Client(s.nats_url, s.names, creds=system.creds("intern")) as intern:
        forbidden = workload_from_obj({**doc, "metadata": {"name": "to-production", "owner": "interns"},
                                       "spec": {**doc["spec"], "policy_queue": "production"}})  # fmt: skip
        wid = await intern.submit(forbidden)
        v = await intern.wait(wid, timeout=60)
        assert v.status == "rejected", v.reason
        assert "identity 'intern' (owner interns) may not submit to queue production (owners: vision-team, platform)" in v.reason, v.reason
        assert not v.children, "a refused pipeline is never expanded"
        kinds = [type_tag(e) for _, e in await intern.events(wid)]
        assert kinds == ["submitted", "rejected"], kinds
        # the same identity may use a queue open to everyone
        ok = workload_from_obj({**doc, "metadata": {"name": "to-research", "owner": "interns"},
                                "spec": {**doc["spec"], "policy_queue": "research"}})  # fmt: skip
        assert (await intern.wait(await intern.submit(ok), timeout=180)).status == "completed"
