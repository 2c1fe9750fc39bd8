"""The first scrape lists every documented family (docs/operations.md,
Metrics), with a 0 for each label set known in advance: a scraper tells "no
traffic" from "broken", and alerts on absent series do not misfire.

Invariants:
- The zeros are written by the process that renders a scrape, like any value
  it records: in multiprocess mode to its own file, so the group's sum stays
  true (a 0 adds nothing); in memory mode to its memory.  Once per process
  and label set: a later scrape only adds the models configured since.
- Known in advance: per configured model, its final states, rejection
  reasons, call and delivery outcomes (by kind); per target, the caps and the run_job
  outcomes.  A family whose labels come only with traffic (dispatched: the
  tenants) is listed by its HELP and TYPE alone.
- A database that does not answer costs the per-model zeros of that scrape,
  never the scrape.
- Imported by app.infra.metrics at render time only (it builds on that
  module's metric objects); nothing above app/infra.
"""
from __future__ import annotations

import logging
from itertools import product

from sqlalchemy import select

from app.infra import metrics as m
from app.infra.db import transaction
from app.infra.tables import models
from app.states import JobState

log = logging.getLogger(__name__)

# What each scrape target documents (docs/operations.md, "Metrics"; a test
# compares this with the table).
FAMILIES = {
    "api": ("asynch_admissions", "asynch_rejections", "asynch_job_duration_seconds", "asynch_dispatched",
            "asynch_waiters", "asynch_waits_refused", "asynch_waits_parked"),
    "node": ("asynch_model_call_duration_seconds", "asynch_job_duration_seconds", "asynch_dispatched",
             "asynch_run_job_messages", "asynch_deliveries"),
}
REASONS = ("queue_full", "tenant_share", "deadline", "invalid", "unavailable", "error")  # m.rejection_reason's, by model
FINAL_STATES = tuple(JobState[s].label for s in ("DONE", "FAILED", "TIMEOUT", "CANCELED", "EXPIRED"))
RUN_JOB_OUTCOMES = ("done", "retry_wait", "failed", "lost", "stale", "expired", "busy")
_seeded: set[tuple[str, str]] = set()  # (target, model or "") this process wrote zeros for


def configured_models() -> list[str]:
    try:
        with transaction() as conn:
            return list(conn.execute(select(models.c.model_name)).scalars())
    except Exception as exc:
        log.warning("metrics: models not read for the zero series: %s", exc)
        return []


def seed(target: str, model_names: list[str] | None = None) -> None:
    """Write this target's zeros ("api" or "node") for the label sets known now."""
    try:
        _seed(target, configured_models() if model_names is None else model_names)
    except Exception as exc:  # as any recording: a metric never fails a request
        log.warning("metrics: zero series not written: %s", exc)


def _seed(target: str, model_names: list[str]) -> None:
    if (target, "") not in _seeded:
        if target == "api":
            m._REJECTIONS.labels("_unknown", "not_found")
            for cap in ("tenant", "process"):
                m._WAITS_REFUSED.labels(cap)
            m.waiters(0)
            m._lazy_parked()
        else:
            for outcome in RUN_JOB_OUTCOMES:
                m._RUN_JOB.labels(outcome)
        _seeded.add((target, ""))
    for name in model_names:
        if (target, name) in _seeded:
            continue
        for state in FINAL_STATES:
            m._JOB_DURATION.labels(name, state)
        if target == "api":
            m._ADMISSIONS.labels(name)
            for reason in REASONS:
                m._REJECTIONS.labels(name, reason)
        else:
            for outcome in ("ok", "error"):
                m._CALL_DURATION.labels(name, outcome)
            for kind, outcome in product(("callback", "webhook"), ("delivered", "failed")):
                m._DELIVERIES.labels(kind, name, outcome)
        _seeded.add((target, name))


class Listed:
    """A scrape of the group's files, plus a HELP/TYPE-only family for each
    of the target's documented ones no process has a sample of yet (the
    multiprocess collector knows only what some process wrote)."""

    def __init__(self, source, target: str):
        self.source, self.names = source, FAMILIES[target]

    def collect(self):
        seen = set()
        for fam in self.source.collect():
            seen.add(fam.name)
            yield fam
        for fam in m._REGISTRY.collect():
            if fam.name in self.names and fam.name not in seen:
                fam.samples = []
                yield fam
