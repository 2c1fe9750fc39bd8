"""Why a job waits (the poll body's ``waiting_on``, ``asynch_jobs_waiting{model,reason}``, a tenant stream's
``waiting`` events): the rule that holds a pending job now, one of ``REASONS`` with its numbers
(docs/api.md "Why a job waits").

- ``retry_backoff`` {until}: an attempt failed, the retry waits for its backoff (state retry_wait).
- ``upstream_paused`` {until, scope, answer}: the model's upstream answered busy and dispatch paused the model,
  the tenant, or this job (its own backoff); ``answer``: the HTTP status of the job's last busy answer, if any.
- ``tenant_limit`` {running, limit, ceiling}: the tenant holds as many calls of the model as it may
  (``ceiling``: the model's max_concurrency, the tenant's burst ceiling, the upstream controller's cut, or the
  job's own model key's permits).
- ``behind_own_jobs`` {ahead}: its tenant's jobs ahead of it in its own queue go first.
- ``no_worker`` {since}: nothing above holds it; no worker's free call slot has taken it yet (since the model's
  doorbell rang for it, or it became pending).

Invariants: read only (one dispatch_waiting.lua step per job, a pipeline for several: the rules are the
dispatcher's own, read in one atomic step); a job that is neither pending nor retry_wait, or pulled by a slot
and about to be claimed, has none; Redis away: none (never a made-up reason).
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from typing import Iterable

import redis

from app.clock import as_utc
from app.infra.redis import dispatch as rd
from app.states import JobState

log = logging.getLogger(__name__)

REASONS = ("behind_own_jobs", "tenant_limit", "upstream_paused", "retry_backoff", "no_worker")
_STATUS = re.compile(r"HTTP (\d{3})")


def _at(unix: str | float) -> datetime:
    return datetime.fromtimestamp(float(unix), timezone.utc)


def _reason(row, raw: list) -> dict | None:
    kind, *rest = raw
    if kind == "pulled":
        return None
    if kind == "none":  # admitted, being handed to the dispatcher (app/jobs/outbox.py)
        return {"reason": "no_worker", "since": as_utc(row.updated_at)}
    if kind == "upstream_paused":
        found = _STATUS.search(row.error or "") if (row.error or "").startswith("model_busy") else None
        return {"reason": kind, "until": _at(rest[0]), "scope": rest[1],
                **({"answer": int(found.group(1))} if found else {})}
    if kind == "tenant_limit":
        return {"reason": kind, "running": int(rest[0]), **({"limit": int(rest[1])} if rest[1] != "" else {}),
                "ceiling": rest[2]}
    if kind == "behind_own_jobs":
        return {"reason": kind, "ahead": int(rest[0])}
    since = as_utc(row.updated_at)
    if rest and rest[0]:
        since = max(since, _at(rest[0]))
    return {"reason": "no_worker", "since": since}


def of_rows(rows: Iterable) -> dict[str, dict | None]:
    """job id -> what holds it now (None: nothing, not waiting, or Redis cannot say), one round trip.
    A row needs id, model_name, tenant_id, state, error, updated_at, next_retry_at."""
    out: dict[str, dict | None] = {}
    asked = []
    for row in rows:
        state = JobState(row.state)
        if state == JobState.RETRY_WAIT and row.next_retry_at is not None:
            out[row.id] = {"reason": "retry_backoff", "until": as_utc(row.next_retry_at)}
        elif state == JobState.PENDING:
            asked.append(row)
        else:
            out[row.id] = None
    if asked:
        try:
            answers = rd.waiting([(r.model_name, r.tenant_id, r.id) for r in asked], {})
        except redis.RedisError as exc:
            log.warning("waiting_on unavailable: %s", exc)
            answers = [None] * len(asked)
        for row, raw in zip(asked, answers):
            out[row.id] = _reason(row, raw) if raw else None
    return out


def of_job(row) -> dict | None:
    return of_rows([row])[row.id]


def counts(model: str) -> dict[str, int]:
    """The model's pending jobs the dispatcher holds, by reason (retry_backoff is the rows' retry_wait count)."""
    return rd.waiting_counts(model)
