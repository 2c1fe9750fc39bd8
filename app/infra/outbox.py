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
import queue
import threading

from app.infra import publisher
from app.infra.process import PerProcess

MAX_BATCH = 500  # messages per LPUSH


class _Outbox:
    """This process's queue of messages and the one thread that sends them."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.cond = threading.Condition()
        self.unsent = 0  # queued or being sent: flush() waits for 0
        threading.Thread(target=self._send_forever, name="asynch-outbox", daemon=True).start()

    def _send_forever(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            publisher.publish_run_jobs(batch)  # logs and moves on if the broker refuses
            with self.cond:
                self.unsent -= len(batch)
                self.cond.notify_all()


# A forked child owns neither the parent's thread nor its queue: it builds its own.
_current: PerProcess[_Outbox] = PerProcess(_Outbox)


def send_soon(job_id: str, attempt: int) -> None:
    """Queue the run_job message of a committed job; returns at once."""
    box = _current.get()
    with box.cond:
        box.unsent += 1
    box.queue.put((job_id, attempt))


def flush(timeout: float = 5.0) -> bool:
    """Wait until every queued message has been handed to the broker (or
    refused); False if that took longer than ``timeout``."""
    box = _current.peek()
    if box is None:
        return True  # nothing was ever queued in this process
    with box.cond:
        return box.cond.wait_for(lambda: box.unsent == 0, timeout)


atexit.register(flush)
