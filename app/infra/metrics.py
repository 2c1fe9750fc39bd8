"""Prometheus metrics that stay right across many API and worker processes
on many hosts.

Counters and histograms are not kept in process memory for long: each
process sums its events and flushes them every ASYNCH_METRICS_FLUSH_SECONDS
as one MULTI/EXEC of HINCRBY(FLOAT)s on a few Redis hashes
(``redis_scripts.metrics_bump``), so whichever gunicorn process answers a
scrape reports the cluster's totals (at most one flush interval behind).  Gauges are computed at scrape time
from PostgreSQL (jobs by model and state) and Redis (gate depth, runtime
overrides, worker liveness).  Recording never raises: a lost metric must
not fail a job.

Callers:
  job_admitted / job_rejected      app.jobs.service.submit
  job_finished                     app.jobs.service.after_terminal (every terminal winner)
  model_call                       app.jobs.execution (each call that reached the model)
  callback_delivered(model, ok)    the callback sender, once per callback when settled (delivered or failed for good)
  worker_heartbeat / worker_consumed / worker_stopped   workers/heartbeat.py
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from bisect import bisect_left

import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from app.infra import redis_scripts
from app.clock import as_utc
from app.config import get_settings
from app.errors import BadRequest, NotFound, QueueFull, Unavailable, ValidationFailed
from app.states import JobState

log = logging.getLogger(__name__)

JOB_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
SEP = "|"  # model names are [A-Za-z0-9_.-]: the separator cannot occur in a label

# Redis hash names (under asynch:metrics:).
ADMISSIONS, REJECTIONS, CALLBACKS = "admissions", "rejections", "callbacks"
JOB_DURATION, CALL_DURATION = "job_duration", "model_call_duration"
_HISTOGRAMS = {JOB_DURATION: JOB_BUCKETS, CALL_DURATION: CALL_BUCKETS}


class _Buffer:
    """Per-process sums of pending increments, written to Redis by a flusher
    thread every ``metrics_flush_seconds`` in one MULTI/EXEC: the admission
    path pays no Redis round trip for its metrics.  What a killed process
    had not flushed (at most one interval) is lost: metrics, not ledger.
    With metrics_flush_seconds = 0 every event is written at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[tuple[str, str], float] = {}
        self.pid: int | None = None
        self.wake = threading.Event()

    def add(self, incrs) -> None:
        interval = get_settings().metrics_flush_seconds
        if interval <= 0:
            self._write(list(incrs))
            return
        if self.pid != os.getpid():
            self._start(interval)
        with self.lock:
            for name, field_, amount in incrs:
                k = (name, field_)
                self.pending[k] = self.pending.get(k, 0) + amount

    def _start(self, interval: float) -> None:
        with _start_lock:
            if self.pid == os.getpid():
                return
            if self.pid is not None:
                # A forked child: the parent flushes what it had pending, and
                # its lock may have been held by a thread that does not exist here.
                self.lock = threading.Lock()
                self.pending = {}
            self.pid = os.getpid()
            threading.Thread(target=self._run, args=(interval,), name="asynch-metrics-flush", daemon=True).start()
            atexit.register(self.flush)

    def _run(self, interval: float) -> None:
        while True:
            self.wake.wait(interval)
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, {}
        if batch:
            self._write([(n, f, a) for (n, f), a in batch.items()], requeue=batch)

    def _write(self, incrs, requeue: dict | None = None) -> None:
        try:
            redis_scripts.metrics_bump(incrs)
        except redis.RedisError as exc:
            log.warning("metrics not recorded: %s", exc)
            if requeue:  # keep them for the next flush rather than lose them
                with self.lock:
                    for k, v in requeue.items():
                        self.pending[k] = self.pending.get(k, 0) + v


_start_lock = threading.Lock()
_buffer = _Buffer()


def _bump(incrs) -> None:
    _buffer.add(incrs)


def flush() -> None:
    """Write what this process has buffered now (tests, shutdown)."""
    _buffer.flush()


def _observe(name: str, labels: tuple[str, ...], value: float) -> list[tuple[str, str, float]]:
    base = SEP.join(labels)
    i = bisect_left(_HISTOGRAMS[name], value)  # the smallest bucket with le >= value
    return [(name, f"{base}{SEP}b{i}", 1), (name, f"{base}{SEP}sum", float(value)), (name, f"{base}{SEP}count", 1)]


# --- recording ----------------------------------------------------------------------

def job_admitted(model: str) -> None:
    _bump([(ADMISSIONS, model, 1)])


def rejection_reason(exc: Exception) -> str:
    if isinstance(exc, QueueFull):
        return "queue_full"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, (ValidationFailed, BadRequest)):
        return "invalid"
    if isinstance(exc, Unavailable):
        return "unavailable"
    return "error"


def job_rejected(model: str, exc: Exception) -> None:
    reason = rejection_reason(exc)
    # An unknown model name comes from the caller: never make it a label.
    label = "_unknown" if reason == "not_found" else model
    _bump([(REJECTIONS, f"{label}{SEP}{reason}", 1)])


def job_finished(row) -> None:
    """A job reached a terminal state (called by the transition's winner only)."""
    if row.finished_at is None:
        return
    seconds = max(0.0, (as_utc(row.finished_at) - as_utc(row.created_at)).total_seconds())
    _bump(_observe(JOB_DURATION, (row.model_name, JobState(row.state).label), seconds))


def model_call(model: str, seconds: float, ok: bool) -> None:
    _bump(_observe(CALL_DURATION, (model, "ok" if ok else "error"), seconds))


def callback_delivered(model: str, ok: bool) -> None:
    """One callback delivery attempt: ok=True delivered, False failed."""
    _bump([(CALLBACKS, f"{model}{SEP}{'delivered' if ok else 'failed'}", 1)])


def _worker_ttl() -> int:
    return max(3, int(3 * get_settings().worker_heartbeat_seconds))


def worker_heartbeat(node: str, queues: str = "") -> None:
    """The worker's consumer is connected and its event loop is turning."""
    try:
        redis_scripts.worker_touch(node, {"heartbeat": f"{time.time():.3f}", "queues": queues}, _worker_ttl())
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
        redis_scripts.worker_touch(node, {"consumed": f"{now:.3f}"}, _worker_ttl())
    except redis.RedisError as exc:
        log.warning("worker liveness not recorded: %s", exc)


def worker_stopped(node: str) -> None:
    try:
        redis_scripts.worker_forget(node)
    except redis.RedisError:
        pass


# --- rendering ------------------------------------------------------------------------

def _split(field_: str) -> tuple[tuple[str, ...], str]:
    *labels, last = field_.split(SEP)
    return tuple(labels), last


def _histogram(name: str, doc: str, labelnames: list[str], data: dict[str, str], buckets) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labelnames)
    series: dict[tuple, dict] = {}
    for f, v in data.items():
        labels, part = _split(f)
        s = series.setdefault(labels, {"b": [0] * (len(buckets) + 1), "sum": 0.0})
        if part.startswith("b"):
            s["b"][min(int(part[1:]), len(buckets))] += int(v)
        elif part == "sum":
            s["sum"] = float(v)
    for labels, s in sorted(series.items()):
        cum, out = 0, []
        for le, n in zip([*map(str, map(float, buckets)), "+Inf"], s["b"]):
            cum += n
            out.append((le, cum))
        fam.add_metric(list(labels), out, s["sum"])
    return fam


class _Snapshot:
    """Reads everything once per scrape and yields the metric families."""

    def collect(self):
        from app.infra.db import transaction
        from app.observe.live import job_counts, model_live

        up = GaugeMetricFamily("asynch_metrics_source_up", "1 if the source answered this scrape", labels=["source"])
        try:
            with transaction() as conn:
                counts = job_counts(conn)
            up.add_metric(["database"], 1)
        except Exception as exc:  # a scrape reports what it can
            log.warning("metrics: database unavailable: %s", exc)
            counts = None
            up.add_metric(["database"], 0)
        try:
            live = model_live() if counts is not None else []
            hashes = redis_scripts.metrics_read([ADMISSIONS, REJECTIONS, CALLBACKS, JOB_DURATION, CALL_DURATION])
            workers = redis_scripts.workers_read()
            up.add_metric(["redis"], 1)
        except Exception as exc:
            log.warning("metrics: redis unavailable: %s", exc)
            live, hashes, workers = [], None, {}
            up.add_metric(["redis"], 0)
        yield up

        if counts is not None:
            jobs = GaugeMetricFamily("asynch_jobs", "jobs in the database by model and state", labels=["model", "state"])
            models = {m for m, _ in counts} | {m["model_name"] for m in live}
            for m in sorted(models):
                for s in JobState:
                    jobs.add_metric([m, s.label], counts.get((m, s.label), 0))
            yield jobs

        gauges = {
            "asynch_queue_depth": ("gate slots taken (pending + running jobs)", "queue_depth"),
            "asynch_queue_limit": ("effective queue limit (runtime override capped by the configuration)",
                                   "queue_limit"),
            "asynch_queue_limit_configured": ("queue_limit in the model's configuration", "queue_limit_configured"),
            "asynch_running": ("jobs in state running", "running"),
            "asynch_max_concurrency": ("effective max_concurrency (runtime override capped by the configuration)",
                                       "max_concurrency"),
            "asynch_max_concurrency_configured": ("max_concurrency in the model's configuration",
                                                  "max_concurrency_configured"),
            "asynch_model_enabled": ("1 if the model takes submissions", "enabled"),
        }
        for name, (doc, key) in gauges.items():
            g = GaugeMetricFamily(name, doc, labels=["model"])
            for m in live:
                g.add_metric([m["model_name"]], int(m[key]))
            yield g
        for knob in ("queue_limit", "max_concurrency"):
            g = GaugeMetricFamily(f"asynch_runtime_{knob}",
                                  f"autotune's runtime {knob} override (absent when none is set)", labels=["model"])
            for m in live:
                if m["runtime"][knob] is not None:
                    g.add_metric([m["model_name"]], m["runtime"][knob])
            yield g

        if hashes is not None:
            yield from self._counters(hashes)
            yield _histogram("asynch_job_duration_seconds", "created -> terminal state, by final state",
                             ["model", "state"], hashes[JOB_DURATION], JOB_BUCKETS)
            yield _histogram("asynch_model_call_duration_seconds", "one call to the model service (that reached it)",
                             ["model", "outcome"], hashes[CALL_DURATION], CALL_BUCKETS)
            yield from self._workers(workers)

    @staticmethod
    def _counters(h):
        adm = CounterMetricFamily("asynch_admissions", "jobs admitted through the gate by submit", labels=["model"])
        for m, v in sorted(h[ADMISSIONS].items()):
            adm.add_metric([m], int(v))
        yield adm
        rej = CounterMetricFamily("asynch_rejections", "submissions refused, by reason "
                                  "(queue_full, invalid, not_found, unavailable, error)", labels=["model", "reason"])
        for f, v in sorted(h[REJECTIONS].items()):
            rej.add_metric(list(f.split(SEP, 1)), int(v))
        yield rej
        cb = CounterMetricFamily("asynch_callback_deliveries", "callback delivery attempts by outcome",
                                 labels=["model", "outcome"])
        for f, v in sorted(h[CALLBACKS].items()):
            cb.add_metric(list(f.split(SEP, 1)), int(v))
        yield cb

    @staticmethod
    def _workers(workers: dict[str, dict[str, str]]):
        now = time.time()
        fresh = _worker_ttl()
        hb = GaugeMetricFamily("asynch_worker_heartbeat_seconds",
                               "unix time the worker's consumer last reported being connected and looping",
                               labels=["worker"])
        consumed = GaugeMetricFamily("asynch_worker_last_consumed_seconds",
                                     "unix time the worker last took a task off the queue", labels=["worker"])
        n = 0
        for node, f in sorted(workers.items()):
            if "heartbeat" in f:
                hb.add_metric([node], float(f["heartbeat"]))
                n += now - float(f["heartbeat"]) <= fresh
            if "consumed" in f:
                consumed.add_metric([node], float(f["consumed"]))
        yield hb
        yield consumed
        yield GaugeMetricFamily("asynch_workers_consuming",
                                "workers whose consumer reported within 3 heartbeat intervals", value=n)


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())
    return generate_latest(registry), CONTENT_TYPE_LATEST
