"""The cluster's gauges for GET /metrics/cluster: jobs by model and state,
the oldest pending job's age, gates, concurrency, runtime overrides, worker
liveness, and the fair dispatcher's state.

Invariants:
- Every value is read at scrape time from PostgreSQL and Redis, never from
  process memory, so any API process answers the same: scraped ONCE per
  cluster, not per pod (summing pods would multiply them; docs/architecture.md,
  "Metrics").
- A source that does not answer is ``asynch_metrics_source_up{source} 0`` and
  its gauges are absent (not zero: no alert fires on a made-up value).
- ``asynch_ledger_violations`` is the last self-check's counts as it recorded them in Redis
  (app/maintenance/verify.py), not a check run by the scrape.
- A scrape's cost does not grow with the backlog or the history: pending and
  running are the gates' (app/observe/live.py says what they mean),
  retry_wait its rows exactly, terminal states up to
  ASYNCH_METRICS_JOB_COUNT_CAP rows per model and state, the queue head one
  probe per model with pending jobs.  With Redis away, the active states
  fall back to one GROUP BY on the rows (today's exact count, slower at
  depth) and the Redis gauges are absent.
"""
from __future__ import annotations

import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from sqlalchemy import select

from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.metrics import worker_ttl
from app.infra.redis import dispatch as rd, gate, ledger, liveness
from app.infra.tables import models
from app.jobs import waiting
from app.observe.live import job_counts, model_live, oldest_pending, row_counts
from app.states import TERMINAL_STATES, JobState

log = logging.getLogger(__name__)

# name -> (help, key in a model_live() entry)
_MODEL_GAUGES = {
    "asynch_queue_depth": ("gate slots taken (pending + running jobs)", "queue_depth"),
    "asynch_queue_limit": ("effective queue limit (runtime override capped by the configuration)", "queue_limit"),
    "asynch_queue_limit_configured": ("queue_limit in the model's configuration", "queue_limit_configured"),
    "asynch_running": ("jobs in state running", "running"),
    "asynch_max_concurrency": ("effective max_concurrency (runtime override capped by the configuration)",
                               "max_concurrency"),
    "asynch_max_concurrency_configured": ("max_concurrency in the model's configuration",
                                          "max_concurrency_configured"),
    "asynch_model_effective_concurrency": ("the permit cap dispatch applies: max_concurrency lowered by the upstream "
                                           "controller while the model pushes back (429/503, latency)",
                                           "effective_concurrency"),
    "asynch_model_enabled": ("1 if the model takes submissions", "enabled"),
}


class ClusterCollector:
    """Reads everything once per scrape and yields the metric families."""

    def collect(self):
        up = GaugeMetricFamily("asynch_metrics_source_up", "1 if the source answered this scrape", labels=["source"])
        counts = heads = None
        try:
            with transaction() as conn:
                names = conn.execute(select(models.c.model_name)).scalars().all()
                # Retry_wait exactly, each terminal state up to the cap.
                caps = {JobState.RETRY_WAIT: None,
                        **dict.fromkeys(sorted(TERMINAL_STATES), get_settings().metrics_job_count_cap)}
                counts = row_counts(conn, names, caps)
        except Exception as exc:  # a scrape reports what it can
            log.warning("metrics: database unavailable: %s", exc)
        try:
            live, active = [], None
            if counts is not None:
                active = {(m, s.label): n for m, pair in gate.slot_split(names).items()
                          for s, n in zip((JobState.PENDING, JobState.RUNNING), pair)}
                live = model_live(counts={**counts, **active})
            workers = liveness.workers_read()
            fairness = {m["model_name"]: (rd.ready_counts(m["model_name"]), rd.bell(m["model_name"]))
                        for m in live}
            weights = rd.weights()
            violations, _ = ledger.last_counts()
            waits = {m["model_name"]: waiting.counts(m["model_name"]) for m in live}
            redis_up = True
        except Exception as exc:
            log.warning("metrics: redis unavailable: %s", exc)
            live, workers, fairness, weights, violations, waits = [], None, {}, {}, {}, {}
            active, redis_up = None, False
        if counts is not None:
            try:
                with transaction() as conn:
                    if active is None:  # Redis away: the active rows, by their GROUP BY (slower at depth)
                        active = job_counts(conn)
                    counts.update(active)
                    heads = oldest_pending(conn, sorted(m for (m, s), n in active.items() if s == "pending" and n))
                at = clock_now()
            except Exception as exc:
                log.warning("metrics: database unavailable: %s", exc)
                counts = None
        up.add_metric(["database"], int(counts is not None))
        up.add_metric(["redis"], int(redis_up))
        yield up
        if counts is not None:
            names = sorted({m for m, _ in counts} | {m["model_name"] for m in live})
            yield _gauge("asynch_jobs", "jobs in the database by model and state", ["model", "state"],
                         (([m, s.label], counts.get((m, s.label), 0)) for m in names for s in JobState))
            yield _gauge("asynch_oldest_pending_age_seconds", "seconds the head of the model's queue (its oldest "
                         "pending job by queue time) has waited for a worker; 0 when none is pending", ["model"],
                         (([m], max(0.0, (at - heads[m]).total_seconds()) if m in heads else 0.0) for m in names))
        for name, (doc, key) in _MODEL_GAUGES.items():
            yield _gauge(name, doc, ["model"], (([m["model_name"]], int(m[key])) for m in live))
        for knob in ("queue_limit", "max_concurrency"):
            yield _gauge(f"asynch_runtime_{knob}", f"autotune's runtime {knob} override (absent when none is set)",
                         ["model"], (([m["model_name"]], m["runtime"][knob]) for m in live
                                     if m["runtime"][knob] is not None))
        if workers is not None:
            yield from _workers(sorted(workers.items()))
        yield _gauge("asynch_tenant_ready_jobs", "jobs waiting in a tenant's dispatch queue (pending, not yet "
                     "dispatched)", ["model", "tenant"],
                     (([m, t], depth) for m, (per, _) in sorted(fairness.items()) for t, depth in sorted(per.items())))
        yield _gauge("asynch_dispatch_bell_age_seconds", "how long the model's doorbell has been out unanswered: "
                     "work waits and no worker had a free slot for it (0: no doorbell out)", ["model"],
                     (([m], max(0.0, time.time() - rang) if rang else 0.0) for m, (_, rang) in sorted(fairness.items())))
        yield _gauge("asynch_tenant_weight", "a tenant's dispatch weight (tenants not listed: 1)", ["tenant"],
                     (([t], w) for t, w in sorted(weights.items())))
        yield _gauge("asynch_jobs_waiting", "waiting jobs by what holds them now (docs/api.md, Why a job waits): "
                     "pending ones the dispatcher holds by rule, retry_wait as retry_backoff", ["model", "reason"],
                     (([m, r], n) for m, per in sorted(waits.items())
                      for r, n in sorted({**per, "retry_backoff": counts.get((m, "retry_wait"), 0) if counts else 0}
                                         .items())))
        yield _gauge("asynch_ledger_violations", "broken guarantees the last ledger self-check found, by check "
                     "(beat's sampled `asynch.verify`, or `asynch verify --record`; absent before the first run)",
                     ["check"], (([c], n) for c, n in sorted(violations.items())))


def _gauge(name: str, doc: str, labels: list[str], samples) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for values, v in samples:
        g.add_metric(values, v)
    return g


def _workers(nodes: list[tuple[str, dict[str, str]]]):
    now, fresh = time.time(), worker_ttl()
    yield _gauge("asynch_worker_heartbeat_seconds", "unix time the worker's consumer last reported being connected "
                 "and looping", ["worker"], (([n], float(f["heartbeat"])) for n, f in nodes if "heartbeat" in f))
    yield _gauge("asynch_worker_last_consumed_seconds", "unix time the worker last took a task off the queue",
                 ["worker"], (([n], float(f["consumed"])) for n, f in nodes if "consumed" in f))
    yield GaugeMetricFamily("asynch_workers_consuming", "workers whose consumer reported within 3 heartbeat intervals",
                            value=sum(1 for _, f in nodes if "heartbeat" in f and now - float(f["heartbeat"]) <= fresh))


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
