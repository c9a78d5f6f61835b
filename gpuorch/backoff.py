"""When to restart a process that exited: capped exponential backoff, reset by a healthy run.

Pure: (policy, consecutive crashes so far, when the exited process started, now) -> decision.
The supervisor (`gpuorch.supervisor`) is the thin shell that acts on it.

    delay = min(cap, initial * factor ** crashes_before)

where `crashes_before` is the number of consecutive crashes before this one, or 0 when the
process that just exited ran for at least `healthy_after` seconds (a healthy run forgives
the past). So a service killed once restarts after `initial` seconds; one that keeps
crashing right after start waits `initial`, `2*initial`, `4*initial`, ... up to `cap`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EXPONENT = 62  # factor ** n beyond this is past any sane cap; avoids float overflow


@dataclass(frozen=True)
class BackoffPolicy:
    initial: float = 0.5  # s before the first restart after a crash
    factor: float = 2.0
    cap: float = 30.0  # s: never wait longer than this
    healthy_after: float = 60.0  # s of running that reset the crash count

    def __post_init__(self) -> None:
        if self.initial < 0 or self.cap < 0 or self.factor < 1 or self.healthy_after < 0:
            raise ValueError(f"invalid backoff policy {self}")


@dataclass(frozen=True)
class RestartDecision:
    delay: float  # s to wait before starting the process again
    restart_at: float  # now + delay
    crashes: int  # consecutive crashes, this one included (the next decision's `crashes`)
    ran: float  # s the exited process ran
    reset: bool  # the crash count was reset by a healthy run
    reason: str


def decide_restart(policy: BackoffPolicy, crashes: int, started_at: float, now: float) -> RestartDecision:
    """The restart of a process that started at `started_at` and exited at `now`.

    `crashes` is the count of consecutive crashes before this exit (the previous decision's
    `crashes`, 0 for a process that never crashed).
    """
    ran = max(0.0, now - started_at)
    reset = crashes > 0 and ran >= policy.healthy_after
    before = 0 if ran >= policy.healthy_after else max(0, crashes)
    delay = min(policy.cap, policy.initial * policy.factor ** min(before, MAX_EXPONENT))
    if before == 0:
        why = f"ran {ran:.1f}s (healthy after {policy.healthy_after:g}s): first backoff" if reset else "first crash"
    else:
        why = f"crash {before + 1} in a row after {ran:.1f}s of running"
    capped = " (capped)" if delay >= policy.cap and policy.initial * policy.factor ** min(before, MAX_EXPONENT) > policy.cap else ""
    return RestartDecision(
        delay=delay, restart_at=now + delay, crashes=before + 1, ran=ran, reset=reset,
        reason=f"{why}: restart in {delay:g}s{capped}",
    )
