"""Prometheus counters and histograms of ONE scrape target, and worker liveness stamps.

A scrape target is a process group: an API server (gunicorn's master and workers) or a worker node (a Celery main
process and its pool), reporting only what its processes recorded.  The cluster's gauges (jobs by state, gates,
liveness) are app/observe/cluster.py's.

Invariants:
- Recording never raises and never leaves the host: a write to memory or, in a group, to an mmap'd file in the
  group's directory (prometheus_client's multiprocess mode, on when PROMETHEUS_MULTIPROC_DIR was set, by
  ``group_env``, before the import).  The group's main process takes the directory (``prepare_group_dir``: a lock,
  the previous run's files deleted) before any child exists.  A lost metric must not fail a job.
- A dead process's counters keep counting in the group's sum (a counter never goes backwards); ``process_dead``
  drops only the live gauge.
- The first scrape lists every documented family (``FAMILIES``, docs/operations.md) with a 0 for each label set
  known in advance (``seed``: "no traffic" is not "broken"), written by the rendering process like any value (a 0
  adds nothing to the sum); a family whose labels come only with traffic (dispatched: the tenants) by HELP and TYPE
  alone.  A database that does not answer costs the per-model zeros of that scrape, never the scrape.
- This module imports nothing above app/infra.
"""
from __future__ import annotations

import fcntl
import glob
import hmac
import logging
import os
import shutil
import tempfile
import threading
import time
from contextlib import suppress
from itertools import product

import redis
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest, multiprocess, values)
from sqlalchemy import select

from app.clock import as_utc
from app.config import get_settings, prometheus_multiproc_dir
from app.errors import (BadRequest, DeadlineUnmeetable, NotFound, QueueFull, TenantQueueFull, Unavailable,
                        ValidationFailed)
from app.infra.db import transaction
from app.infra.redis import liveness
from app.infra.tables import models
from app.states import JobState

log = logging.getLogger(__name__)

JOB_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TEMP_PREFIX = "asynch-metrics-"

# Where recorded values go is decided by prometheus_client when it is first
# imported; ask it rather than the environment, which may have changed since.
MULTIPROCESS = values.ValueClass is not values.MutexValue

disable_created_metrics()  # `_created` series exist only in memory mode: the same names in both
_REGISTRY = CollectorRegistry()  # memory mode's; in multiprocess mode the files are the truth

_ADMISSIONS = Counter("asynch_admissions", "jobs admitted through the gate by submit", ["model"], registry=_REGISTRY)
_REJECTIONS = Counter("asynch_rejections", "submissions refused, by reason (queue_full, invalid, not_found, "
                      "unavailable, error)", ["model", "reason"], registry=_REGISTRY)
_DELIVERIES = Counter("asynch_deliveries", "outbox deliveries settled, by kind (callback / webhook) and outcome "
                      "(delivered / failed for good)", ["kind", "model", "outcome"], registry=_REGISTRY)
_DISPATCHED = Counter("asynch_dispatched", "jobs dispatched to workers (a permit taken, a run_job message "
                      "sent), by tenant: the fair dispatcher's decisions", ["model", "tenant"], registry=_REGISTRY)
_RUN_JOB = Counter("asynch_run_job_messages", "run_job messages a worker took, by what came of them "
                   "(done, retry_wait, failed, lost, stale: a duplicate or outdated message)", ["outcome"],
                   registry=_REGISTRY)
_BUSY = Counter("asynch_upstream_busy", "busy answers (429/503) of a model's upstream, by tenant, the scope that "
                "received it (tenant / credential: the job's own model key) and what the job paid (free: back to the "
                "queue from its tenant's busy budget; retry: spent out, a failed attempt)",
                ["model", "tenant", "scope", "paid"], registry=_REGISTRY)
_WAITS_REFUSED = Counter("asynch_waits_refused", "long-polls refused at a waiter cap, by cap (tenant, process; "
                         "streams: an event stream past its tenant's streams cap)", ["cap"], registry=_REGISTRY)
_JOB_DURATION = Histogram("asynch_job_duration_seconds", "created -> terminal state, by final state",
                          ["model", "state"], buckets=JOB_BUCKETS, registry=_REGISTRY)
_CALL_DURATION = Histogram("asynch_model_call_duration_seconds", "one call to the model service (that reached it)",
                           ["model", "outcome"], buckets=CALL_BUCKETS, registry=_REGISTRY)

_last_warning = 0.0
_lazy_lock = threading.Lock()
_lazy_made: dict[str, Counter | Gauge] = {}


# asynch_waiters is a live gauge: the sum over the group's living processes (a dead one's waits are gone).
_LAZY = {"asynch_waiters": (Gauge, "long-polls parked on this API server now", {"multiprocess_mode": "livesum"}),
         "asynch_waits_parked": (Counter, "long-polls parked as a small record, no greenlet held "
                                 "(app/infra/parking.py)", {})}


def _lazy(name: str):
    """A metric without labels, made on first use: it opens its mmap file when it is made, and
    at import time the group's directory may not exist yet (a Celery node imports this first)
    or be emptied later (an import in the gunicorn master, before on_starting)."""
    with _lazy_lock:
        if name not in _lazy_made:
            kind, doc, kw = _LAZY[name]
            _lazy_made[name] = kind(name, doc, registry=_REGISTRY, **kw)
        return _lazy_made[name]


def _never_raise(record):
    def wrapper(*args, **kwargs) -> None:
        global _last_warning
        try:
            record(*args, **kwargs)
        except Exception as exc:  # a full disk, a bad label: the job goes on
            if time.monotonic() - _last_warning > 60:  # not one line per event
                _last_warning = time.monotonic()
                log.warning("metric not recorded (%s): %s", record.__name__, exc)
    wrapper.__name__, wrapper.__doc__ = record.__name__, record.__doc__
    return wrapper


@_never_raise
def job_admitted(model: str) -> None:
    _ADMISSIONS.labels(model).inc()


# The first class that matches names the reason (TenantQueueFull is a QueueFull); else "error".
_REASON_OF = ((TenantQueueFull, "tenant_share"), (DeadlineUnmeetable, "deadline"), (QueueFull, "queue_full"),
              (NotFound, "not_found"), ((ValidationFailed, BadRequest), "invalid"), (Unavailable, "unavailable"))


@_never_raise
def job_rejected(model: str, exc: Exception) -> None:
    reason = next((r for cls, r in _REASON_OF if isinstance(exc, cls)), "error")
    # An unknown model name comes from the caller: never make it a label.
    _REJECTIONS.labels("_unknown" if reason == "not_found" else model, reason).inc()


@_never_raise
def job_finished(row) -> None:
    """A job reached a terminal state (called by the transition's winner only)."""
    if row.finished_at is None:
        return
    seconds = max(0.0, (as_utc(row.finished_at) - as_utc(row.created_at)).total_seconds())
    _JOB_DURATION.labels(row.model_name, JobState(row.state).label).observe(seconds)


@_never_raise
def dispatched(model: str, tenant: str, n: int = 1) -> None:
    _DISPATCHED.labels(model, tenant).inc(n)


@_never_raise
def upstream_busy(model: str, tenant: str, credential: bool, free: bool) -> None:
    _BUSY.labels(model, tenant, "credential" if credential else "tenant", "free" if free else "retry").inc()


@_never_raise
def run_job_message(outcome: str) -> None:
    _RUN_JOB.labels(outcome).inc()


@_never_raise
def waiters(delta: int) -> None:
    _lazy("asynch_waiters").inc(delta)


@_never_raise
def wait_refused(cap: str) -> None:
    _WAITS_REFUSED.labels(cap).inc()


@_never_raise
def wait_parked() -> None:
    _lazy("asynch_waits_parked").inc()


@_never_raise
def model_call(model: str, seconds: float, ok: bool) -> None:
    _CALL_DURATION.labels(model, "ok" if ok else "error").observe(seconds)


@_never_raise
def delivery_settled(kind: str, model: str, ok: bool) -> None:
    """One delivery settled: ok=True delivered, False failed for good."""
    _DELIVERIES.labels(kind, model, "delivered" if ok else "failed").inc()


def worker_ttl() -> int:
    return max(3, int(3 * get_settings().worker_heartbeat_seconds))


def _touch(node: str, fields: dict, what: str) -> None:
    try:
        liveness.worker_touch(node, fields, worker_ttl())
    except redis.RedisError as exc:
        log.warning("worker %s not recorded: %s", what, exc)


def worker_heartbeat(node: str, queues: str = "", instance: str = "") -> None:
    """The worker's consumer is connected and its loop turns; ``instance``: this start of the node."""
    _touch(node, {"heartbeat": f"{time.time():.3f}", "queues": queues, "instance": instance}, "heartbeat")


_last_consumed_stamp = 0.0


def worker_consumed(node: str) -> None:
    """The worker took a task off the queue.  At most once a second per process: a stuck-queue
    alert needs seconds, not one Redis round trip per task."""
    global _last_consumed_stamp
    now = time.time()
    if now - _last_consumed_stamp < 1.0:
        return
    _last_consumed_stamp = now
    _touch(node, {"consumed": f"{now:.3f}"}, "liveness")


def worker_stopped(node: str) -> None:
    with suppress(redis.RedisError):
        liveness.worker_forget(node)


def group_env(metrics_dir: str | None = None) -> dict[str, str]:
    """What a launcher sets before it execs a group: ASYNCH_METRICS_DIR, else a fresh temp dir."""
    path = (get_settings().metrics_dir if metrics_dir is None else metrics_dir) or tempfile.mkdtemp(prefix=TEMP_PREFIX)
    return {"PROMETHEUS_MULTIPROC_DIR": os.path.abspath(path)}


_group_lock = None  # held for the main process's life; children inherit it


def prepare_group_dir() -> str | None:
    """By the group's main process before any child exists: lock the directory (a second group
    on it fails here instead of wiping this one's files), delete the previous run's files (their
    pids mean nothing now).  Returns the directory (None: memory mode)."""
    global _group_lock
    path = prometheus_multiproc_dir()
    if not MULTIPROCESS or not path:
        return None
    os.makedirs(path, exist_ok=True)
    if _group_lock is None:
        lock = open(os.path.join(path, ".lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise RuntimeError(f"metrics directory {path} is in use by another process group "
                               "(give each API server and worker node its own ASYNCH_METRICS_DIR)") from None
        _group_lock = lock
    for f in glob.glob(os.path.join(path, "*.db")):
        os.remove(f)
    return path


def process_dead(pid: int) -> None:
    """A child of the group exited (gunicorn child_exit, Celery pool exit)."""
    if MULTIPROCESS and prometheus_multiproc_dir():
        try:
            multiprocess.mark_process_dead(pid, prometheus_multiproc_dir())
        except OSError as exc:
            log.warning("metrics: cleanup after process %s: %s", pid, exc)


def cleanup_group_dir() -> None:
    """At the group's exit: remove the directory if ``group_env`` made it (a temporary one)."""
    path = prometheus_multiproc_dir()
    if path and not get_settings().metrics_dir and os.path.basename(path).startswith(TEMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def render(target: str = "api") -> tuple[bytes, str]:
    """This scrape target's counters and histograms (target "api" or "node"):
    the sum over the group's processes' files, or this process's memory."""
    seed(target)
    if MULTIPROCESS:  # generate_latest takes any collector: the files' sum, listed
        files = multiprocess.MultiProcessCollector(None, path=prometheus_multiproc_dir())
        return generate_latest(_Listed(files, target)), CONTENT_TYPE_LATEST
    return generate_latest(_REGISTRY), CONTENT_TYPE_LATEST


def token_problem(authorization: str) -> str | None:
    """None when the request may read metrics (ASYNCH_METRICS_TOKEN unset, or sent as a Bearer
    token), else why not.  Constant-time comparison."""
    token = get_settings().metrics_token
    if not token:
        return None
    given = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    if not given:
        return "missing metrics token"
    return None if hmac.compare_digest(given.encode(), token.encode()) else "invalid metrics token"


# What each scrape target documents (docs/operations.md, "Metrics"; a test compares the table).
FAMILIES = {
    "api": ("asynch_admissions", "asynch_rejections", "asynch_job_duration_seconds", "asynch_dispatched",
            "asynch_waiters", "asynch_waits_refused", "asynch_waits_parked"),
    "node": ("asynch_model_call_duration_seconds", "asynch_job_duration_seconds", "asynch_dispatched",
             "asynch_run_job_messages", "asynch_deliveries"),
}
REASONS = ("queue_full", "tenant_share", "deadline", "invalid", "unavailable", "error")  # per model
FINAL_STATES = tuple(JobState[s].label for s in ("DONE", "FAILED", "TIMEOUT", "CANCELED", "EXPIRED"))
RUN_JOB_OUTCOMES = ("done", "retry_wait", "failed", "lost", "stale", "expired", "busy")
_seeded: set[tuple[str, str]] = set()  # (target, model or "") this process wrote zeros for


@_never_raise  # as any recording: a metric never fails a request
def seed(target: str) -> None:
    """Write this target's zeros ("api" or "node") for the label sets known now: per configured model its final
    states, rejection reasons, call and delivery outcomes; per target the caps and the run_job outcomes."""
    if (target, "") not in _seeded:
        if target == "api":
            _REJECTIONS.labels("_unknown", "not_found")
            for cap in ("tenant", "process", "streams"):
                _WAITS_REFUSED.labels(cap)
            _lazy("asynch_waiters").inc(0)
            _lazy("asynch_waits_parked")
        else:
            for outcome in RUN_JOB_OUTCOMES:
                _RUN_JOB.labels(outcome)
        _seeded.add((target, ""))
    try:
        with transaction() as conn:
            names = list(conn.execute(select(models.c.model_name)).scalars())
    except Exception as exc:
        log.warning("metrics: models not read for the zero series: %s", exc)
        return
    for name in names:
        if (target, name) in _seeded:
            continue
        for state in FINAL_STATES:
            _JOB_DURATION.labels(name, state)
        if target == "api":
            _ADMISSIONS.labels(name)
            for reason in REASONS:
                _REJECTIONS.labels(name, reason)
        else:
            for outcome in ("ok", "error"):
                _CALL_DURATION.labels(name, outcome)
            for kind, outcome in product(("callback", "webhook"), ("delivered", "failed")):
                _DELIVERIES.labels(kind, name, outcome)
        _seeded.add((target, name))


class _Listed:
    """A scrape of the group's files, plus a HELP/TYPE-only family for each of the target's
    documented ones no process has a sample of yet (the collector knows only what was written)."""

    def __init__(self, source, target: str):
        self.source, self.names = source, FAMILIES[target]

    def collect(self):
        seen = set()
        for fam in self.source.collect():
            seen.add(fam.name)
            yield fam
        for fam in _REGISTRY.collect():
            if fam.name in self.names and fam.name not in seen:
                fam.samples = []
                yield fam
