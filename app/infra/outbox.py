"""The run_job messages of new admissions, sent off the request path.

A submission answers 202 as soon as its row is committed; its message goes
into this process's outbox, and one sender thread writes everything queued
meanwhile with a single LPUSH (publisher.publish_run_jobs).  Under load that
is one broker round trip for dozens of admissions instead of one each, and
the request thread never waits for the broker.

Nothing is lost that recovery does not already repair: the row is the truth
(DESIGN.md invariant 1), so a message that never left (a crash between the
commit and the send, a broker refusing the batch) is re-sent by
republish_stale_pending once the job has sat pending for
ASYNCH_REPUBLISH_AFTER_SECONDS.  At a clean exit the outbox is flushed.
"""
from __future__ import annotations

import atexit
import os
import queue
import threading

from app.infra import publisher

MAX_BATCH = 500  # messages per LPUSH

_start_lock = threading.Lock()
_pid: int | None = None
_queue: queue.SimpleQueue = queue.SimpleQueue()
_cond = threading.Condition()
_unsent = 0  # queued or being sent: flush() waits for 0


def send_soon(job_id: str, attempt: int) -> None:
    """Queue the run_job message of a committed job; returns at once."""
    global _unsent
    _ensure_sender()
    with _cond:
        _unsent += 1
    _queue.put((job_id, attempt))


def flush(timeout: float = 5.0) -> bool:
    """Wait until every queued message has been handed to the broker (or
    refused); False if that took longer than ``timeout``."""
    if _pid != os.getpid():
        return True  # no sender of ours here (a forked child inherits only the parent's counts)
    with _cond:
        return _cond.wait_for(lambda: _unsent == 0, timeout)


def _ensure_sender() -> None:
    global _pid, _queue, _cond, _unsent
    if _pid == os.getpid():
        return
    with _start_lock:
        if _pid == os.getpid():
            return
        # A forked child owns neither the parent's thread nor its queue.
        _queue, _cond, _unsent = queue.SimpleQueue(), threading.Condition(), 0
        threading.Thread(target=_send_forever, args=(_queue, _cond), name="asynch-outbox", daemon=True).start()
        _pid = os.getpid()


def _send_forever(q: queue.SimpleQueue, cond: threading.Condition) -> None:
    global _unsent
    while True:
        batch = [q.get()]
        while len(batch) < MAX_BATCH:
            try:
                batch.append(q.get_nowait())
            except queue.Empty:
                break
        publisher.publish_run_jobs(batch)  # logs and moves on if the broker refuses
        with cond:
            _unsent -= len(batch)
            cond.notify_all()


atexit.register(flush)
