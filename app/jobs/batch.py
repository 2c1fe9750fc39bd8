"""Batch submit (POST /v1/models/{model}/jobs:batch): up to BATCH_MAX_JOBS
jobs of one model, each admitted or refused on its own.

Invariants (the submit's, item by item; docs/architecture.md "The admission path"):
- Validation before the gate by the single submit's rule (submission.check):
  a bad item is its own 422 and takes no slot; only the key, the body or an
  unknown model refuse the whole batch.
- One gate step, one INSERT, one outbox group (admission.admit_many), each
  item with the gate's own decision, in order; deadlines judged there
  against one estimate step (each item behind the batch's earlier ones).
- Idempotency keys per item: one SELECT finds keys already used (replayed,
  or 422 for a different request); a key repeated in the batch is admitted
  once, its later items replay the first (or share its refusal); a key lost
  to a concurrent request replays the winner.
- Callback/webhook hosts are looked up once per batch, under one deadline,
  at most ASYNCH_BATCH_MAX_URL_HOSTS names; an item past the cap is its own 422.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.catalog.registry import enabled_model
from app.config import get_settings
from app.contract import parse
from app.errors import DomainError
from app.infra import metrics
from app.infra.http.netguard import Lookups
from app.jobs import admission, submission
from app.jobs import service as jobs
from app.jobs.requests import BatchItem
from app.tenancy.keys import Principal


@dataclass
class Outcome:
    """One item: ``submitted`` (admitted or replayed) or ``error``."""
    index: int
    submitted: jobs.Submitted | None = None
    error: BaseException | None = None

    def replay(self, row, model_name: str, digest: str) -> None:
        """Answer with ``row``'s job, or the item's error."""
        try:
            self.submitted = jobs.replay(row, model_name, digest, submission.batch_item(self.index))
        except DomainError as exc:
            self.error = exc


def submit_batch(principal: Principal, model_name: str, items: list[dict], **shared: Any) -> list[Outcome]:
    """Judge, admit and answer every item (see the module's invariants).
    ``shared``: option values every item carries (creator, passthrough)."""
    model = enabled_model(model_name)  # 404 for the whole batch
    out = [Outcome(i) for i in range(len(items))]
    valid: list[tuple[int, submission.Checked]] = []
    # Each host looked up once for the whole batch, at most so many names.
    lookups = Lookups(principal.tenant_id, max_names=get_settings().batch_max_url_hosts)
    for i, raw in enumerate(items):
        try:
            item = parse(BatchItem, raw, base=f"/jobs/{i}")
            valid.append((i, submission.check(submission.batch_item(i), model_name, item.payload,
                                              submission.given(item, **shared), lookups, model=model)))
        except DomainError as exc:
            out[i].error = exc
    keys = {c.options.idempotency_key for _i, c in valid if c.options.idempotency_key}
    existing = jobs.find_idempotent(principal.tenant_id, keys)
    first_of: dict[str, int] = {}  # a key's first item in this batch
    later: list[tuple[int, str, str]] = []  # (index, key, digest) of repeats
    subs: list[tuple[int, admission.Submission, str]] = []
    for i, checked in valid:
        key, digest = checked.options.idempotency_key, checked.digest
        if key and key in existing:
            out[i].replay(existing[key], model_name, digest)
        elif key and key in first_of:
            later.append((i, key, digest))
        else:
            if key:
                first_of[key] = i
            subs.append((i, jobs.new_submission(principal, checked, want_estimate=False), digest))
    admission.admit_many([s for _i, s, _d in subs])
    lost = {s.values["idempotency_key"] for _i, s, _d in subs if isinstance(s.error, admission.IdempotencyConflict)}
    winners = jobs.find_idempotent(principal.tenant_id, lost)
    for i, s, digest in subs:
        if isinstance(s.error, admission.IdempotencyConflict):
            out[i].replay(winners.get(s.values["idempotency_key"]), model_name, digest)
        elif s.error is not None:
            out[i].error = s.error
        else:
            out[i].submitted = jobs.Submitted(s.row, replayed=False)
    for i, key, digest in later:  # the first item's row, or its refusal
        first = out[first_of[key]]
        if first.submitted is None:
            out[i].error = first.error
        else:
            out[i].replay(first.submitted.row, model_name, digest)
    for o in out:
        if o.submitted is not None and not o.submitted.replayed:
            metrics.job_admitted(model_name)
        elif isinstance(o.error, DomainError):
            metrics.job_rejected(model_name, o.error)
    return out
