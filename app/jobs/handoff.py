"""Newly admitted jobs, handed to the dispatcher off the request path.

A submission answers 202 once its row is committed; one sender thread takes
everything queued in this process's hand-off meanwhile into its tenants'
queues and rings their models' doorbells in one dispatch step per model
(app/jobs/dispatch.py): the request never waits for Redis or the broker.
Nothing is lost that recovery does not repair (the row is the truth: the
maintenance pass's lost-job scan queues it).  A clean exit flushes the hand-off.

Invariant: a job is listed as unsent (``unsent``) from before its 202 until
after the dispatcher holds it, so the next submission's estimate counts it
ahead exactly once (app/jobs/estimates.py): back-to-back submits get
distinct places in line.
"""
from __future__ import annotations

import atexit
import queue
import threading
from collections import defaultdict

from app.infra.process import PerProcess
from app.jobs import dispatch

MAX_BATCH = 500  # jobs per pass of the sender


class _Outbox:
    """This process's queue of admitted jobs and the one thread that sends them."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.cond = threading.Condition()
        # Queued or being sent, by (model, tenant): flush() waits for none.
        self.jobs: defaultdict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        threading.Thread(target=self._send_forever, name="asynch-handoff", daemon=True).start()

    def _send_forever(self) -> None:
        while True:
            # An entry is a group of jobs (one request's, or one admission
            # batch's): never split, so a batch submit is one dispatch step and one LPUSH.
            batch = list(self.queue.get())
            while len(batch) < MAX_BATCH:
                try:
                    batch.extend(self.queue.get_nowait())
                except queue.Empty:
                    break
            by_model: dict[str, list] = {}
            for model, entry in batch:
                by_model.setdefault(model, []).append(entry)
            for model, entries in by_model.items():
                dispatch.queue_entries(model, entries, mode="NX")  # logs and moves on if Redis refuses
            with self.cond:
                for model, (tenant, job, *_rest) in batch:
                    left = self.jobs[(model, tenant)]
                    left.pop(job, None)
                    if not left:
                        del self.jobs[(model, tenant)]
                self.cond.notify_all()


# A forked child owns neither the parent's thread nor its queue: it builds its own.
_current: PerProcess[_Outbox] = PerProcess(_Outbox)


def send_many(items: list[tuple[str, dispatch.Entry]]) -> None:
    """Queue committed jobs, (model, queue entry: app/jobs/dispatch.py entry) each, for one
    pass of the sender (one group); returns at once."""
    if not items:
        return
    box = _current.get()
    with box.cond:
        for model, (tenant, job, score, *_rest) in items:
            box.jobs[(model, tenant)][job] = score
    box.queue.put(list(items))


def unsent(model: str, tenant: str) -> dict[str, float]:
    """This process's jobs of ``tenant`` on ``model`` queued here and not yet
    handed over (job id -> order score).  One may be in the dispatcher already,
    its entry not yet dropped: dispatch_position.lua tells which."""
    box = _current.peek()
    if box is None:
        return {}
    with box.cond:
        return dict(box.jobs.get((model, tenant), {}))


def flush(timeout: float = 5.0) -> bool:
    """Wait until every queued job has been handed to the dispatcher (or
    refused); False if that took longer than ``timeout``."""
    box = _current.peek()
    if box is None:
        return True  # nothing was ever queued in this process
    with box.cond:
        return box.cond.wait_for(lambda: not box.jobs, timeout)


atexit.register(flush)
