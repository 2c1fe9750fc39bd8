"""Feeding a batch: its next lines become jobs through the one admission path (app/jobs/admission.py).

Invariants:
- A line is admitted as a job of the batch's tenant, judged by the submission rule like any submit, with the
  batch's window end as its caller deadline (pending past it, it expires) and the Idempotency-Key
  ``<batch id>:<line>``: a pass that dies between the job's INSERT and the line's link is repaired by the next
  pass, which finds the job by its key and links it instead of admitting it twice.
- Admission is the gate's: the tenant's share of the model's queue, its weight and limits apply to every
  line, so a large batch holds at most its tenant's share and never another tenant's place.  A line the gate
  refuses (queue full, deadline) stays unadmitted for the next pass; a line the rule now refuses (its model
  disabled since create) is a failure of that line, handed back to be written to the error file.
- Room kept: a pass admits a model's lines only while the tenant's active jobs of that model are fewer than
  ASYNCH_BATCH_QUEUE_SHARE of its queue_limit, so interactive submits (the tenant's and others') still find
  free slots while a batch of any size runs.
- At most ASYNCH_BATCH_ADMIT_CHUNK lines a pass; their bodies are read from the input file by offset, one
  line at a time (never the whole file).
"""
from __future__ import annotations

import json
import logging
import math
from typing import Iterator

from sqlalchemy import bindparam, func, select, update

from app.catalog.registry import enabled_model
from app.clock import now as clock_now
from app.config import get_settings
from app.errors import DomainError
from app.files import service as files
from app.infra.db import single_statement, transaction
from app.infra.http.netguard import Lookups
from app.infra.storage import StorageError, get_storage
from app.infra.tables import batch_items, batches, tasks
from app.jobs import admission, newjob, submission
from app.states import ACTIVE_STATES
from app.tenancy.keys import Principal

log = logging.getLogger(__name__)

FACE = submission.Face(lambda option: f"/{option}", "/body")


def idempotency_key(batch_id: str, line_no: int) -> str:
    return f"{batch_id}:{line_no}"


def bodies(location: str, items: list) -> Iterator[tuple[object, bytes]]:
    """(item, its line's bytes) for ``items`` sorted by offset, streamed from the input file."""
    items = sorted(items, key=lambda it: it.byte_offset)
    if not items:
        return
    pos = items[0].byte_offset
    chunks = get_storage().stream_from(location, pos)
    buf, i = bytearray(), 0
    for chunk in chunks:
        while chunk and i < len(items):
            it = items[i]
            if pos < it.byte_offset:  # skip to the line
                skip = min(len(chunk), it.byte_offset - pos)
                chunk, pos = chunk[skip:], pos + skip
                continue
            need = it.byte_len - len(buf)
            buf += chunk[:need]
            chunk, pos = chunk[need:], pos + min(need, len(chunk))
            if len(buf) == it.byte_len:
                yield it, bytes(buf)
                buf, i = bytearray(), i + 1
        if i >= len(items):
            return


def _within_room(conn, tenant: str, items: list) -> list:
    """The items that fit in their model's batch room (module invariants), in line order."""
    share, room, out = get_settings().batch_queue_share, {}, []
    for it in items:
        if it.model_name not in room:
            try:
                model = enabled_model(it.model_name)
            except DomainError:  # disabled since create: every line goes on, to fail by the rule below
                room[it.model_name] = len(items)
            else:
                active = conn.execute(select(func.count()).select_from(tasks).where(
                    tasks.c.model_name == it.model_name, tasks.c.tenant_id == tenant,
                    tasks.c.state.in_([int(s) for s in ACTIVE_STATES]))).scalar_one()
                room[it.model_name] = max(1, math.floor(model.queue_limit * share)) - active
        if room[it.model_name] > 0:
            room[it.model_name] -= 1
            out.append(it)
    return out


def feed(batch) -> list[tuple[int, str, str]]:
    """Admit the batch's next lines; the lines that failed for good: (line, code, message)."""
    remaining = (batch.expires_at - clock_now()).total_seconds()
    if remaining <= 1:
        return []
    with single_statement() as conn:
        items = conn.execute(
            select(batch_items.c.line_no, batch_items.c.custom_id, batch_items.c.model_name,
                   batch_items.c.byte_offset, batch_items.c.byte_len)
            .where(batch_items.c.batch_id == batch.id, batch_items.c.job_id.is_(None),
                   batch_items.c.outcome.is_(None))
            .order_by(batch_items.c.line_no).limit(get_settings().batch_admit_chunk)).all()
        if not items:
            return []
        keys = {idempotency_key(batch.id, it.line_no): it for it in items}
        found = dict(conn.execute(select(tasks.c.idempotency_key, tasks.c.id).where(
            tasks.c.tenant_id == batch.tenant_id, tasks.c.idempotency_key.in_(list(keys)))).all())
        links = [(keys[k].line_no, job_id) for k, job_id in found.items()]
        todo = _within_room(conn, batch.tenant_id, [it for k, it in keys.items() if k not in found])
    failures: list[tuple[int, str, str]] = []
    subs = []
    principal, lookups = Principal(batch.tenant_id, "user", None), Lookups(batch.tenant_id)
    try:
        source = files.get(batch.tenant_id, batch.input_file_id)
        lines = list(bodies(source.location, todo))
    except (DomainError, StorageError) as exc:  # the input file was deleted (or expired) under the batch
        log.warning("batch %s: input file unreadable: %s", batch.id, exc)
        lines, failures = [], [(it.line_no, "input_file_gone", "the input file is no longer readable")
                               for it in todo]
    for it, raw in lines:
        try:
            req = json.loads(raw)
            values = {"idempotency_key": idempotency_key(batch.id, it.line_no), "deadline_seconds": remaining}
            payload = req["body"]
            if req.get("payload_file_id"):  # by reference (app/jobs/references.py)
                payload, values["payload_file_id"] = {}, req["payload_file_id"]
            checked = submission.check(FACE, it.model_name, payload, values, lookups)
        except DomainError as exc:
            failures.append((it.line_no, "invalid_request", exc.message))
            continue
        subs.append((it, newjob.new_submission(principal, checked, want_estimate=False)))
    admission.admit_many([s for _it, s in subs])
    links += [(it.line_no, s.row.id) for it, s in subs if s.error is None and s.row is not None]
    if links:
        with transaction() as conn:
            conn.execute(update(batch_items).where(
                batch_items.c.batch_id == batch.id, batch_items.c.line_no == bindparam("n"),
                batch_items.c.job_id.is_(None)).values(job_id=bindparam("j")),
                [{"n": n, "j": j} for n, j in links])
            conn.execute(update(batches).where(batches.c.id == batch.id).values(
                admitted=batches.c.admitted + len(links), updated_at=clock_now()))
    return failures
