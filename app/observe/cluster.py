"""The cluster's gauges for GET /metrics/cluster: jobs by model and state,
the oldest pending job's age, gate depth vs limit, running vs concurrency,
runtime overrides, enabled models, worker liveness, and the fair
dispatcher's state (each tenant's ready queue, messages in flight, weights).

Invariants:
- Every value is read at scrape time from PostgreSQL (the rows) and Redis
  (gates, runtime limits, worker liveness keys), never from process memory,
  so any API process answers the same numbers.  That is why they are served
  on their own path, scraped ONCE per cluster (through the Service): on each
  pod's /metrics, summing pods would multiply them (docs/architecture.md,
  "Metrics").
- A scrape reports what it can: a source that does not answer is
  ``asynch_metrics_source_up{source} 0`` and its gauges are left out (absent,
  not zero, so no alert fires on a made-up value).
- A scrape's cost does not grow with the job history: active states are
  counted exactly (admission bounds them), terminal states at most
  ASYNCH_METRICS_JOB_COUNT_CAP rows per model and state (the gauge then
  reads the cap).
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
from app.infra.redis import dispatch as rd
from app.infra.redis import liveness
from app.infra.tables import models
from app.observe.live import finished_counts, job_counts, model_live, oldest_pending
from app.states import JobState

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
        try:
            with transaction() as conn:
                active, heads = job_counts(conn), oldest_pending(conn)
                names = conn.execute(select(models.c.model_name)).scalars().all()
                counts = {**active, **finished_counts(conn, names, get_settings().metrics_job_count_cap)}
            at = clock_now()
            up.add_metric(["database"], 1)
        except Exception as exc:  # a scrape reports what it can
            log.warning("metrics: database unavailable: %s", exc)
            counts = heads = None
            up.add_metric(["database"], 0)
        try:
            live = model_live(counts=active) if counts is not None else []
            workers = liveness.workers_read()
            fairness = {m["model_name"]: (rd.ready_counts(m["model_name"]), len(rd.inflight(m["model_name"])))
                        for m in live}
            weights = rd.weights()
            up.add_metric(["redis"], 1)
        except Exception as exc:
            log.warning("metrics: redis unavailable: %s", exc)
            live, workers, fairness, weights = [], None, {}, {}
            up.add_metric(["redis"], 0)
        yield up

        if counts is not None:
            yield from self._jobs(counts, heads, at, live)
        for name, (doc, key) in _MODEL_GAUGES.items():
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
        if workers is not None:
            yield from self._workers(workers)
        yield from self._fairness(fairness, weights)

    @staticmethod
    def _fairness(fairness: dict, weights: dict[str, int]):
        ready = GaugeMetricFamily("asynch_tenant_ready_jobs", "jobs waiting in a tenant's dispatch queue "
                                  "(pending, not yet dispatched)", labels=["model", "tenant"])
        inflight = GaugeMetricFamily("asynch_dispatch_inflight", "run_job messages dispatched and not yet "
                                     "claimed (at most ASYNCH_DISPATCH_WINDOW)", labels=["model"])
        for model, (per_tenant, n) in sorted(fairness.items()):
            for tenant, depth in sorted(per_tenant.items()):
                ready.add_metric([model, tenant], depth)
            inflight.add_metric([model], n)
        weight = GaugeMetricFamily("asynch_tenant_weight", "a tenant's dispatch weight (tenants not listed: 1)",
                                   labels=["tenant"])
        for tenant, w in sorted(weights.items()):
            weight.add_metric([tenant], w)
        yield ready
        yield inflight
        yield weight

    @staticmethod
    def _jobs(counts, heads, at, live):
        models = sorted({m for m, _ in counts} | {m["model_name"] for m in live})
        jobs = GaugeMetricFamily("asynch_jobs", "jobs in the database by model and state", labels=["model", "state"])
        for m in models:
            for s in JobState:
                jobs.add_metric([m, s.label], counts.get((m, s.label), 0))
        yield jobs
        age = GaugeMetricFamily("asynch_oldest_pending_age_seconds",
                                "seconds the head of the model's queue (its oldest pending job by queue time) "
                                "has waited for a worker; 0 when none is pending", labels=["model"])
        for m in models:
            age.add_metric([m], max(0.0, (at - heads[m]).total_seconds()) if m in heads else 0.0)
        yield age

    @staticmethod
    def _workers(workers: dict[str, dict[str, str]]):
        now = time.time()
        fresh = worker_ttl()
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
    registry.register(ClusterCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
