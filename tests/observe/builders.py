"""A small event log with known timestamps: a clean run, a retried one, a lost-and-replaced one,
and an orphan of a workload the log never saw."""

from __future__ import annotations

from typing import Any

from gpuorch_proto import Event, RoutingDecision
from gpuorch_proto import events as ev
from tests.support.builders import make_workload


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[int, Event]] = []

    def add(self, e: Event) -> None:
        self.events.append((len(self.events) + 1, e))

    def submitted(self, wid: str, at: float, gpus: int = 2) -> None:
        self.add(ev.Submitted(workload_id=wid, at=at, workload=make_workload(name=wid, gpus=gpus)))

    def routed(self, wid: str, at: float, cluster: str, n: int = 1) -> None:
        d = RoutingDecision(workload_id=wid, decided_at=at, outcome="routed", cluster=cluster, summary=f"to {cluster}")
        self.add(ev.Routed(workload_id=wid, at=at, decision=d, attempt_number=n))

    def attempt(self, wid: str, n: int, cluster: str, **times: float) -> str:
        """times: created admitted running compute succeeded failed lost fenced confirmed promoted orphan"""
        aid = f"{wid}-a{n}"
        base: dict[str, Any] = {"workload_id": wid, "attempt_id": aid, "epoch": n, "cluster": cluster}
        steps: list[tuple[float, Event]] = []
        for kind, at in times.items():
            b = {**base, "at": at}
            e: Event
            if kind == "created":
                e = ev.AttemptCreated(**b, attempt_number=n, job_name=aid, output_path=f"/o/{aid}", checkpoint_path="/c")
            elif kind == "admitted":
                e = ev.Admitted(**b)
            elif kind == "running":
                e = ev.Running(**b)
            elif kind == "compute":
                e = ev.ComputeStarted(**{**b, "at": at + 0.3}, started_at=at)  # seen a little later
            elif kind == "succeeded":
                e = ev.Succeeded(**b, output_path=f"/o/{aid}")
            elif kind == "failed":
                e = ev.Failed(**b, exit_code=3, reason="boom")
            elif kind == "lost":
                e = ev.Lost(**b, reason="partition")
            elif kind == "fenced":
                e = ev.Fenced(**b, new_epoch=n + 1)
            elif kind == "confirmed":
                e = ev.CancelConfirmed(**b)
            elif kind == "promoted":
                e = ev.Promoted(**b, output_path=f"/o/{aid}", result_path=f"/r/{wid}")
            elif kind == "orphan":
                e = ev.OrphanDeleted(**b, job_name=aid, reason="stale epoch")
            else:
                raise ValueError(kind)
            steps.append((at, e))
        for _, e in sorted(steps, key=lambda x: x[0]):
            self.add(e)
        return aid


def scenario() -> Log:
    log = Log()
    # clean: on alpha
    log.submitted("clean", 0.0)
    log.routed("clean", 1.0, "alpha")
    log.attempt("clean", 1, "alpha", created=2.0, admitted=5.0, running=7.0, compute=8.0, succeeded=20.0, promoted=21.0)
    log.add(ev.Completed(workload_id="clean", at=22.0, attempt_id="clean-a1", result_path="/r/clean"))
    # retried: fails on alpha, succeeds on beta
    log.submitted("retried", 0.0, gpus=4)
    log.routed("retried", 2.0, "alpha")
    log.attempt("retried", 1, "alpha", created=3.0, admitted=4.0, running=6.0, failed=10.0, fenced=11.0, confirmed=12.0)
    log.add(ev.RouteRequested(workload_id="retried", at=13.0, attempt_number=2, exclude=["alpha"]))
    log.routed("retried", 14.0, "beta", n=2)
    log.attempt("retried", 2, "beta", created=15.0, admitted=16.0, running=18.0, compute=19.0, succeeded=30.0, promoted=31.0)
    log.add(ev.Completed(workload_id="retried", at=31.5, attempt_id="retried-a2", result_path="/r/retried"))
    # lost on alpha, replaced on beta; the lost one's Job is collected once alpha answers again
    log.submitted("lost", 1.0)
    log.routed("lost", 1.5, "alpha")
    log.attempt("lost", 1, "alpha", created=2.0, admitted=4.0, running=5.0, lost=10.0, fenced=10.5, orphan=40.0)
    log.add(ev.RouteRequested(workload_id="lost", at=11.0, attempt_number=2, exclude=["alpha"]))
    log.routed("lost", 12.0, "beta", n=2)
    log.attempt("lost", 2, "beta", created=13.0, admitted=14.0, running=15.0, succeeded=25.0, promoted=26.0)
    log.add(ev.Completed(workload_id="lost", at=26.0, attempt_id="lost-a2", result_path="/r/lost"))
    # an orphan of a workload the log never saw
    log.add(ev.OrphanDeleted(workload_id="orphan-0123456789abcdef", at=50.0, attempt_id="x-a1", epoch=0, cluster="alpha", job_name="x-a1", reason="unknown"))
    return log
