"""Worker liveness that means "consuming", not just "process alive".

A consumer bootstep, started after the task consumer (so only while the
worker is connected to the broker and subscribed to its queues), refreshes
``asynch:worker:{node}`` from the worker's own event loop every
ASYNCH_WORKER_HEARTBEAT_SECONDS; the key expires after 3 intervals.  A lost
broker connection stops the step (the key is dropped), a blocked loop stops
the refresh, a dead host lets the key expire.  Pool processes stamp the time
they take a task.  /metrics/cluster turns these into asynch_worker_* gauges.
"""
from __future__ import annotations

import secrets
import threading

from celery import bootsteps
from celery.signals import task_prerun

from app.config import get_settings
from app.infra import metrics


# This start of the node: pool children inherit it (they fork from the main
# process), a restarted node with the same name gets a new one.  A claim
# records node#instance, so recovery tells a dead run from its restart.
INSTANCE = secrets.token_hex(6)


def identity(node: str) -> str:
    """What a claim records as its worker (app/maintenance/recovery.py)."""
    return f"{node}#{INSTANCE}"


class ConsumingHeartbeat(bootsteps.StartStopStep):
    requires = ("celery.worker.consumer.tasks:Tasks",)
    tref = None

    def start(self, c):
        self._beat(c)
        self.tref = c.timer.call_repeatedly(get_settings().worker_heartbeat_seconds, self._beat, (c,), priority=10)

    def _beat(self, c):
        # The write runs off the event loop so a slow Redis never stalls
        # consuming; the loop turning is what the beat proves.
        queues = ",".join(sorted(q.name for q in c.task_consumer.queues)) if c.task_consumer else ""
        threading.Thread(target=metrics.worker_heartbeat, args=(c.hostname, queues, INSTANCE), daemon=True).start()

    def stop(self, c):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        metrics.worker_stopped(c.hostname)

    shutdown = stop


@task_prerun.connect
def _consumed(sender=None, **_kw):
    if hostname := getattr(getattr(sender, "request", None), "hostname", None):
        metrics.worker_consumed(hostname)
