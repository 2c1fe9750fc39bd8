"""Prometheus counters and histograms of ONE scrape target, and worker
liveness stamps.

A scrape target is a process group: an API server (a gunicorn master and
its workers) or a worker node (a Celery main process and its pool).  Each
reports only the events its own processes recorded; Prometheus scrapes every
target and sums (``sum by (model) (rate(asynch_admissions_total[5m]))``).
The cluster's gauges (jobs by state, gates, worker liveness), which are the
same whichever process computes them, are not here: app/observe/cluster.py.

Invariants:
- Recording never raises and never leaves the host: it is a write to process
  memory or, in a process group, to an mmap'd file in the group's directory
  (prometheus_client's multiprocess mode).  A lost metric must not fail a job.
- Multiprocess mode is on when PROMETHEUS_MULTIPROC_DIR was set before
  prometheus_client was imported: `asynch api` / `asynch worker` set it
  (``group_env``) before exec'ing gunicorn / Celery, so every process of the
  group inherits it.  The group's main process takes the directory with
  ``prepare_group_dir`` (an exclusive lock, then it deletes the previous
  run's files) before any child exists.  Without it (tests' in-process app,
  `asynch dev`'s API) the metrics live in this process's memory.
- Counters of a dead process stay in its files and keep counting in the
  group's sum (a counter must never go backwards while its target lives);
  ``process_dead`` drops only what would be wrong for a dead process (the
  live gauge ``asynch_waiters``).
- This module imports nothing above app/infra: no jobs, no observe.

Callers:
  job_admitted / job_rejected      app.jobs.service.submit
  wait_parked                      app.infra.parking
  job_finished                     app.jobs.effects.run (every terminal winner)
  model_call                       app.jobs.execution (each call that reached the model)
  delivery_settled(kind, model, ok)  the outbox, once per delivery when settled (delivered or failed for good)
  waiters(+1/-1) / wait_refused    app.infra.wakeups (a wait registered / ended / refused at a cap)
  worker_heartbeat / worker_consumed / worker_stopped   workers/heartbeat.py
  group_env / prepare_group_dir / process_dead / cleanup_group_dir
                                   app/cli/processes.py, app/observe/gunicorn_conf.py,
                                   workers/celery_app.py
  render / token_problem           app/web/auth.py, app/infra/metrics_server.py (a worker node's port)
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

import redis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
    values,
)

from app.clock import as_utc
from app.config import get_settings, prometheus_multiproc_dir
from app.errors import (
    BadRequest,
    DeadlineUnmeetable,
    NotFound,
    QueueFull,
    TenantQueueFull,
    Unavailable,
    ValidationFailed,
)
from app.infra.redis import liveness
from app.states import JobState

log = logging.getLogger(__name__)

JOB_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TEMP_PREFIX = "asynch-metrics-"

# Where recorded values go is decided by prometheus_client when it is first
# imported; ask it rather than the environment, which may have changed since.
MULTIPROCESS = values.ValueClass is not values.MutexValue

# `_created` series exist only in memory mode; the same names in both modes.
disable_created_metrics()
_REGISTRY = CollectorRegistry()  # memory mode's; in multiprocess mode the files are the truth

_ADMISSIONS = Counter("asynch_admissions", "jobs admitted through the gate by submit", ["model"],
                      registry=_REGISTRY)
_REJECTIONS = Counter("asynch_rejections", "submissions refused, by reason "
                      "(queue_full, invalid, not_found, unavailable, error)", ["model", "reason"], registry=_REGISTRY)
_DELIVERIES = Counter("asynch_deliveries", "outbox deliveries settled, by kind (callback / webhook) and outcome "
                      "(delivered / failed for good)", ["kind", "model", "outcome"], registry=_REGISTRY)
_DISPATCHED = Counter("asynch_dispatched", "jobs dispatched to workers (a permit taken, a run_job message "
                      "sent), by tenant: the fair dispatcher's decisions", ["model", "tenant"], registry=_REGISTRY)
_RUN_JOB = Counter("asynch_run_job_messages", "run_job messages a worker took, by what came of them "
                   "(done, retry_wait, failed, lost, stale: a duplicate or outdated message)", ["outcome"],
                   registry=_REGISTRY)
# A live gauge: the sum over the group's living processes (a dead worker's
# parked waits are gone with it).  Built on first use: a metric without
# labels opens its mmap file when it is created, and at import time the
# group's directory may not exist yet (a Celery node imports this first).
_WAITERS: Gauge | None = None
_lazy_lock = threading.Lock()
_WAITS_REFUSED = Counter("asynch_waits_refused", "long-polls refused at a waiter cap, by cap (tenant, process)",
                         ["cap"], registry=_REGISTRY)
_JOB_DURATION = Histogram("asynch_job_duration_seconds", "created -> terminal state, by final state",
                          ["model", "state"], buckets=JOB_BUCKETS, registry=_REGISTRY)
_CALL_DURATION = Histogram("asynch_model_call_duration_seconds", "one call to the model service (that reached it)",
                           ["model", "outcome"], buckets=CALL_BUCKETS, registry=_REGISTRY)

_last_warning = 0.0


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


# --- recording ----------------------------------------------------------------------

@_never_raise
def job_admitted(model: str) -> None:
    _ADMISSIONS.labels(model).inc()


def rejection_reason(exc: Exception) -> str:
    if isinstance(exc, TenantQueueFull):
        return "tenant_share"
    if isinstance(exc, DeadlineUnmeetable):
        return "deadline"
    if isinstance(exc, QueueFull):
        return "queue_full"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, (ValidationFailed, BadRequest)):
        return "invalid"
    if isinstance(exc, Unavailable):
        return "unavailable"
    return "error"


@_never_raise
def job_rejected(model: str, exc: Exception) -> None:
    reason = rejection_reason(exc)
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
def run_job_message(outcome: str) -> None:
    _RUN_JOB.labels(outcome).inc()


@_never_raise
def waiters(delta: int) -> None:
    global _WAITERS
    if _WAITERS is None:
        with _lazy_lock:
            if _WAITERS is None:
                _WAITERS = Gauge("asynch_waiters", "long-polls parked on this API server now", registry=_REGISTRY,
                                 multiprocess_mode="livesum")
    _WAITERS.inc(delta)


@_never_raise
def wait_refused(cap: str) -> None:
    _WAITS_REFUSED.labels(cap).inc()


_WAITS_PARKED: Counter | None = None


@_never_raise
def wait_parked() -> None:
    # Created on first use, as _WAITERS: a metric without labels opens its
    # multiprocess file when it is made, and an import in the master would
    # open one before on_starting empties the directory.
    _lazy_parked().inc()


def _lazy_parked() -> Counter:
    global _WAITS_PARKED
    if _WAITS_PARKED is None:
        with _lazy_lock:
            if _WAITS_PARKED is None:
                _WAITS_PARKED = Counter("asynch_waits_parked", "long-polls parked as a small record, no greenlet "
                                        "held (app/infra/parking.py)", registry=_REGISTRY)
    return _WAITS_PARKED


@_never_raise
def model_call(model: str, seconds: float, ok: bool) -> None:
    _CALL_DURATION.labels(model, "ok" if ok else "error").observe(seconds)


@_never_raise
def delivery_settled(kind: str, model: str, ok: bool) -> None:
    """One delivery settled: ok=True delivered, False failed for good."""
    _DELIVERIES.labels(kind, model, "delivered" if ok else "failed").inc()


# --- worker liveness (Redis; rendered by app/observe/cluster.py) ------------------------

def worker_ttl() -> int:
    return max(3, int(3 * get_settings().worker_heartbeat_seconds))


def worker_heartbeat(node: str, queues: str = "", instance: str = "") -> None:
    """The worker's consumer is connected and its event loop is turning.
    ``instance``: this start of the node (claims record node#instance)."""
    try:
        liveness.worker_touch(node, {"heartbeat": f"{time.time():.3f}", "queues": queues, "instance": instance},
                              worker_ttl())
    except redis.RedisError as exc:
        log.warning("worker heartbeat not recorded: %s", exc)


_last_consumed_stamp = 0.0


def worker_consumed(node: str) -> None:
    """The worker took a task off the queue.  Stamped at most once a second
    per process: a stuck-queue alert needs seconds, not one Redis round
    trip per task."""
    global _last_consumed_stamp
    now = time.time()
    if now - _last_consumed_stamp < 1.0:
        return
    _last_consumed_stamp = now
    try:
        liveness.worker_touch(node, {"consumed": f"{now:.3f}"}, worker_ttl())
    except redis.RedisError as exc:
        log.warning("worker liveness not recorded: %s", exc)


def worker_stopped(node: str) -> None:
    try:
        liveness.worker_forget(node)
    except redis.RedisError:
        pass


# --- a process group's directory ---------------------------------------------------------

def group_env(metrics_dir: str | None = None) -> dict[str, str]:
    """The environment a launcher sets before it execs a process group:
    ASYNCH_METRICS_DIR when configured, else a fresh temporary directory."""
    path = get_settings().metrics_dir if metrics_dir is None else metrics_dir
    if not path:
        path = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    return {"PROMETHEUS_MULTIPROC_DIR": os.path.abspath(path)}


_group_lock = None  # held for the main process's life; children inherit it


def prepare_group_dir() -> str | None:
    """Called once by the group's main process before any child exists:
    lock the directory (a second group on the same directory fails here
    instead of wiping this one's files) and delete the previous run's files,
    whose pids mean nothing now.  Returns the directory (None: memory mode)."""
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
    """At the group's exit: remove the directory if it is a temporary one
    ``group_env`` made (a configured ASYNCH_METRICS_DIR is left in place)."""
    path = prometheus_multiproc_dir()
    if path and not get_settings().metrics_dir and os.path.basename(path).startswith(TEMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


# --- exposition ---------------------------------------------------------------------------

def render(target: str = "api") -> tuple[bytes, str]:
    """This scrape target's counters and histograms (target "api" or "node"):
    the sum over the group's processes' files, or this process's memory."""
    from app.infra import metrics_zeros  # it builds on this module's metrics
    metrics_zeros.seed(target)
    if MULTIPROCESS:
        files = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(files, path=prometheus_multiproc_dir())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics_zeros.Listed(files, target))
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(_REGISTRY), CONTENT_TYPE_LATEST


def token_problem(authorization: str) -> str | None:
    """None when the request may read metrics (ASYNCH_METRICS_TOKEN unset, or
    sent as a Bearer token), else why not.  Constant-time comparison."""
    token = get_settings().metrics_token
    if not token:
        return None
    given = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    if not given:
        return "missing metrics token"
    if not hmac.compare_digest(given.encode(), token.encode()):
        return "invalid metrics token"
    return None
