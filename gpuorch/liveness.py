"""When is a cluster silent, and when are its informers' caches to be believed (pure).

The liveness rules every service that watches clusters shares: the dispatcher decides loss by
them (`silence` over the `contact` its informers and probe report), and the dispatcher, the fencer
and inventory all read a cluster from its informers' caches only while it is `answering`
(docs/operations.md, *Liveness*; issue 27).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Contact", "answering", "contact", "silence", "silent_for"]


@dataclass(frozen=True)
class Contact:
    """What the dispatcher knows of a cluster's answers: the last one, and the run of failed
    calls since: its first and its latest (the evidence that the cluster is silent *now*)."""

    last_ok: float | None = None
    failing_since: float | None = None  # the first unanswered call after the last answer
    last_failed: float | None = None  # the latest unanswered call of that run


def contact(prev: Contact | None, answered: bool, now: float) -> Contact:
    """The contact after one call to the cluster at `now` (answered or not).

    Facts may come out of order (the informers' threads and the probe report on their own): an
    answer ends the run of failures made before it, and a failure older than the last answer
    says nothing about the cluster now.
    """
    prev = prev or Contact()
    if answered:
        last_ok = now if prev.last_ok is None else max(prev.last_ok, now)
        if prev.last_failed is not None and prev.last_failed > last_ok:  # a failure came after it
            return Contact(last_ok=last_ok, failing_since=prev.last_failed, last_failed=prev.last_failed)
        return Contact(last_ok=last_ok)
    if prev.last_ok is not None and now <= prev.last_ok:
        return prev  # it answered after this call was made (or then)
    since = now if prev.failing_since is None else min(prev.failing_since, now)
    latest = now if prev.last_failed is None else max(prev.last_failed, now)
    return Contact(last_ok=prev.last_ok, failing_since=since, last_failed=latest)


def silence(c: Contact, now: float, lost_after: float) -> str | None:
    """Why the cluster's live attempts are lost (None: not yet).

    On evidence of silence now: a run of failed calls, with no answer in it, from its first to
    its latest call at least `lost_after` long. Time alone proves nothing: a cluster whose next
    try is not due yet may have healed, so a blip shorter than `lost_after` is never a loss,
    however the retries fall (issue 27). Counted from the first unanswered call, not from the
    last answer: a cluster gpuorch did not ask for a while is not "silent" for that while.
    """
    if c.failing_since is None or c.last_failed is None or c.last_failed - c.failing_since < lost_after:
        return None
    last = f"; last answer {now - c.last_ok:.1f}s ago" if c.last_ok is not None else ""
    return f"has not answered for {c.last_failed - c.failing_since:.1f}s{last}"


def answering(*, failing: bool, synced: bool) -> bool:
    """Is the cluster answering, so that its attempts are judged from the informers' caches? Not
    while a call to it is failing, nor before every cache has listed once (a Job missing from a
    cache that never listed says nothing). A cluster not answering is judged by `silent_for`."""
    return synced and not failing


def silent_for(c: Contact | None, now: float, lost_after: float) -> str | None:
    """Why the attempts of a cluster that is not `answering` are lost (None: not yet), by
    `silence`; a cluster no call has reported on yet counts as failing from `now`."""
    return silence(c or contact(None, False, now), now, lost_after)
