"""A worker process's call slots (docs/architecture.md, "A slot per call"): the model call is the unit of
scheduling.  A slot is freed the moment its call ends, whatever the other calls are doing, and takes the job the
fair dispatcher picks at that moment.

How work reaches a slot: a model with work and no slot pulling rings its doorbell (app/jobs/dispatch.py, one
``asynch.pull`` message); a Celery process with free slots answers it (``answer_bell``: one pull of as many jobs as
it has free slots, claimed in ONE statement, their calls started at once).  From then on its slots refill
themselves: the writer takes each batch of calls that ended together, writes them (ONE done statement), and in
the dispatch step that releases them the freed slots take the jobs the ring picks now (app/jobs/execution.py
``write``).  No job waits in a broker; which job a slot runs is decided when the slot is free.

Beside them, ASYNCH_WORKER_EXPRESS_SLOTS (1) express slots take only a job of a tenant holding no permit on its
model, when an express notice names the model while every slot is taken (app/jobs/express.py): a tenant with
nothing running starts at once even while every slot runs another tenant's calls.  An express call ends as any call (the same writer,
the same done statement); its freed slot takes the next job of a tenant holding nothing, if one waits.

Invariants:
- At most ASYNCH_WORKER_SLOTS calls in flight per process: ``active`` counts the slots taken, from the pull that
  fills them to the write that frees them (refills replace what a batch freed, never more); plus at most
  ASYNCH_WORKER_EXPRESS_SLOTS express calls (``express``), each of a tenant that held no permit when pulled.
- A freed slot is given back instead of refilled when a doorbell waits for it: one this process's task is
  waiting to answer, or another model's that no worker answered within a moment (``dispatch.bells_waiting``);
  the model a slot ran never keeps it from the others.
- A doorbell's task holds its Celery process while every slot is taken (its message is acked late, so it counts
  against the node's prefetch): Celery hands the next doorbell to a process with a free slot, and no node hoards
  doorbells it cannot answer.  The node's shutdown (a flag the main process sets) ends the hold.
- Stopping (the process exits): no more pulls or refills; the calls in flight end (each bounded by its
  deadline, the whole drain by ``DRAIN_SECONDS``) and their outcomes are written.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from app.config import get_settings
from app.errors import Unavailable
from app.infra import logs, metrics
from app.infra.process import PerProcess
from app.catalog import registry
from app.jobs import dispatch, execution, express

log = logging.getLogger(__name__)

DRAIN_SECONDS = 60.0  # the longest a stopping process waits for its calls in flight
_YIELD_CHECK_SECONDS = 0.02  # how stale this process's view of the doorbells out may be


class Slots:
    """This process's call slots, their call threads and their one writer."""

    def __init__(self) -> None:
        self.size, self.express_size = get_settings().worker_slots, get_settings().worker_express_slots
        self.cond = threading.Condition()
        self.active = 0          # slots taken: pulled or claimed, calling, or ended and not yet written
        self.express = 0         # express slots taken, the same way
        self.pulling = 0         # doorbell pulls under way (their slots are reserved before the pull)
        self.waiting = 0         # doorbell tasks of this process waiting for a free slot
        self.stopping = False
        self.worker: str | None = None   # node#instance, recorded by each claim
        self._ended: queue.SimpleQueue = queue.SimpleQueue()
        self._calls = ThreadPoolExecutor(self.size + self.express_size, "asynch-call")
        self._bells_seen = (0.0, False, "")
        threading.Thread(target=self._write_forever, name="asynch-writer", daemon=True).start()
        if self.express_size:
            express.listen(self.answer_express)

    def free(self) -> int:
        return self.size - self.active

    # --- a doorbell -------------------------------------------------------------------------------------------

    def answer_bell(self, model: str, worker: str | None, shutting_down: Callable[[], bool] = lambda: False) -> int:
        """Answer ``model``'s doorbell: pull as many of its jobs as this process has free slots (waiting for one
        first if none is free: the writer gives it the next), start their calls, then hold while every slot is
        taken.  Returns how many calls it started."""
        self.worker = worker
        with self.cond:
            self.waiting += 1
            try:
                while self.free() <= 0 and not self._done(shutting_down):
                    self.cond.wait(0.25)
            finally:
                self.waiting -= 1
            if self._done(shutting_down):
                return 0
            n = min(self.free(), get_settings().dispatch_group)
            self.active += n
            self.pulling += 1
        started = 0
        try:
            row = registry.model_row(model)  # its timeout, for the pulled permits' lease (a cached read)
            started = self._start(model, dispatch.pull(model, n, execution.lease_seconds(row)), reserved=n)
        except Exception:
            log.exception("doorbell of %s not answered; it is rung again", model)
            self._release(n - started)
        finally:
            with self.cond:
                self.pulling -= 1
        self._hold(shutting_down)
        return started

    def answer_express(self, model: str) -> int:
        """An express notice of ``model``: if an express slot is free, pull one job of a tenant holding no permit
        and start its call.  Returns how many calls it started (0 or 1)."""
        with self.cond:
            # Only while every slot is taken by a call: a free slot, or one a doorbell's pull reserved, takes the
            # job as any job's (so a tenant's first jobs on an idle worker do not spend the express slot).
            # worker None: the first doorbell, which names this process's node, is not in yet.
            if (self.stopping or self.worker is None or self.free() > 0 or self.pulling
                    or self.express >= self.express_size):
                return 0
            self.express += 1
        attempts: list[execution.Attempt] = []
        try:
            pulled = dispatch.pull_idle(model, execution.lease_seconds(registry.model_row(model)))
            if pulled:
                attempts, outcomes = execution.claim(model, pulled, self.worker)
                for outcome in outcomes.values():
                    metrics.run_job_message(outcome)
        except Unavailable:
            log.warning("database away: the express pull of %s given back", model)
        finally:
            if not attempts:
                self._release(0, express=1)
        for a in attempts:
            self._calls.submit(self._call, a, True)
        return len(attempts)

    def _done(self, shutting_down: Callable[[], bool]) -> bool:
        if shutting_down():
            self.stopping = True
        return self.stopping

    def _hold(self, shutting_down: Callable[[], bool]) -> None:
        with self.cond:
            while self.free() <= 0 and not self._done(shutting_down):
                self.cond.wait(0.25)

    def _release(self, n: int, express: int = 0) -> None:
        if n or express:
            with self.cond:
                self.active -= n
                self.express -= express
                self.cond.notify_all()

    def _start(self, model: str, pulled: list[dispatch.Pulled], reserved: int) -> int:
        """Claim what was pulled into ``reserved`` slots (ONE statement) and start the calls; the slots the
        claim did not fill are freed.  Returns how many calls started."""
        attempts: list[execution.Attempt] = []
        try:
            if pulled:
                attempts, outcomes = execution.claim(model, pulled, self.worker)
                for outcome in outcomes.values():
                    metrics.run_job_message(outcome)
        except Unavailable:
            log.warning("database away: %d pulled jobs of %s given back", len(pulled), model)
        finally:
            self._release(reserved - len(attempts))
        for a in attempts:
            self._calls.submit(self._call, a)
        if attempts and self.worker:
            metrics.worker_consumed(self.worker.partition("#")[0])
        return len(attempts)

    def _call(self, a: execution.Attempt, in_express: bool = False) -> None:
        # Everything logged on this slot's thread while the call runs carries its job (a library's lines too).
        token = logs.bind(job_id=a.row.id, model=a.row.model_name, tenant=a.row.tenant_id)
        try:
            outcome = execution.call(a)
        except Exception:  # call() records its own failures: this is a bug, and the lease repairs the job
            log.exception("call crashed", extra=a.ctx)
            outcome = execution.Outcome(a, result="lost")
        finally:
            logs.reset(token)
        self._ended.put((outcome, in_express))

    # --- the writer -------------------------------------------------------------------------------------------

    def _write_forever(self) -> None:
        while True:
            batch = [self._ended.get()]
            # Calls that end together are written together: one done statement, one dispatch step.
            until = time.monotonic() + execution.LINGER_SECONDS
            while len(batch) < self.active + self.express:
                try:
                    batch.append(self._ended.get(timeout=max(0.0, until - time.monotonic())))
                except queue.Empty:
                    break
            try:
                self._write(batch)
            except Exception:
                log.exception("writing %d outcomes failed; their leases repair them", len(batch))
                quick = sum(x for _, x in batch)
                self._release(len(batch) - quick, express=quick)

    def _write(self, batch: list[tuple[execution.Outcome, bool]]) -> None:
        """Write a batch of ended calls, (outcome, whether its call ran in an express slot) each; the slots their
        calls freed take the jobs the ring picks now, a freed express slot only a tenant's holding nothing."""
        slot_calls = [o for o, in_express in batch if not in_express]
        freed = Counter(o.attempt.row.model_name for o in slot_calls)
        leases = {o.attempt.row.model_name: execution.lease_seconds(o.attempt.model) for o in slot_calls}
        refill = {} if not freed or self._give_back(freed) else {m: (n, leases[m]) for m, n in freed.items()}
        results, pulled = execution.write([o for o, _ in batch], refill)
        for outcome in results.values():
            metrics.run_job_message(outcome)
        # The freed slots the refill filled stay taken (as reserved for their claims); the rest are free.
        refilled = {m: p for m, p in pulled.items() if p}
        self._release(len(slot_calls) - sum(len(p) for p in refilled.values()), express=len(batch) - len(slot_calls))
        # A freed express slot takes the next job of a tenant holding nothing, if one waits (its notice came
        # while the slot was busy).
        for model in {o.attempt.row.model_name for o, in_express in batch if in_express}:
            self.answer_express(model)
        for model, p in refilled.items():
            self._start(model, p, reserved=len(p))

    def _give_back(self, freed: Counter) -> bool:
        """Whether the freed slots go back to Celery instead of refilling from their models: stopping, a doorbell
        task of this process waiting for a slot, or another model's doorbell no worker answered."""
        if self.stopping or self.waiting > 0:
            return True
        at, seen, models = self._bells_seen
        key = ",".join(sorted(freed))
        if time.monotonic() - at > _YIELD_CHECK_SECONDS or models != key:
            seen = any(dispatch.bells_waiting(m) for m in freed)
            self._bells_seen = (time.monotonic(), seen, key)
        return seen

    # --- stopping ---------------------------------------------------------------------------------------------

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Stop pulling and refilling; wait for the calls in flight to end and be written.  False: some did not
        within ``timeout`` (their leases repair them)."""
        self.stopping = True
        with self.cond:
            self.cond.notify_all()
            return self.cond.wait_for(lambda: self.active <= 0 and self.express <= 0, timeout)


_slots: PerProcess[Slots] = PerProcess(Slots)


def get() -> Slots:
    """This process's slots (built with its first doorbell; a forked child builds its own)."""
    return _slots.get()


def drain(timeout: float = DRAIN_SECONDS) -> bool:
    """``Slots.drain`` of this process's slots, if it has any."""
    slots = _slots.peek()
    return True if slots is None else slots.drain(timeout)
