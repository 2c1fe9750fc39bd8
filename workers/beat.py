"""Celery beat that sends the schedule only while it leads.

Every beat keeps its schedule's clock (entries come due and are reserved as
usual), but only the holder of the Redis beat lock sends them, stamped
with its fencing token.  A standby therefore takes over in step with the
schedule instead of firing everything at once.  See app/maintenance/periodic.py.
"""
from __future__ import annotations

import logging

from celery.beat import PersistentScheduler

from app.maintenance.periodic import Leadership

log = logging.getLogger(__name__)


class LeaderScheduler(PersistentScheduler):
    def __init__(self, *args, **kwargs):
        self.leadership = Leadership()
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs):
        self.leadership.refresh()
        # Wake up often enough to renew the lock even when nothing is due.
        return min(super().tick(*args, **kwargs), self.leadership.renew_every)

    def apply_entry(self, entry, producer=None):
        fence = self.leadership.fence()
        if fence is None:
            log.debug("standby: not sending %s", entry.name)
            return
        # DEBUG: one line every few seconds would bury the rest (the pass itself logs what it did).
        log.debug("Scheduler: Sending due task %s (%s) token=%s", entry.name, entry.task, fence["token"])
        try:
            self.send_task(entry.task, entry.args, {**(entry.kwargs or {}), "fence": fence},
                           producer=producer, **entry.options)
        except Exception:
            log.exception("could not send %s", entry.name)

    def close(self):
        try:
            self.leadership.release()
        finally:
            super().close()
