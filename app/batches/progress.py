"""A batch's progress pass (beat: asynch.batches every ASYNCH_BEAT_BATCHES_SECONDS; tests and the API's
create call ``advance`` directly): end what must end, collect what ended, feed what is next, finalize.

Invariants:
- One pass per batch at a time (a PostgreSQL advisory lock on the batch id, tried, never waited for):
  passes may overlap across beats and processes.
- A line's outcome is written once: its output or error line goes to storage first, as a segment
  (``batches/<id>/seg-<n>.out|.err``, streamed), then one transaction records the outcomes
  (``outcome IS NULL`` guard) and the segment count (``segments = n`` guard).  A pass that dies between
  the two rewrites segment n next time: nothing is lost or written twice.
- Finalize once: when every line has an outcome the segments are concatenated (streamed) into the output
  and error files, then one guarded UPDATE (status still open) ends the batch: completed, or ``ending``'s
  expired / cancelled.  Segments are deleted after.
- Cancel: lines not admitted are cancelled at once; admitted jobs are cancelled by the job's own guarded
  transition (a running call is stopped as a job cancel stops it); lines that ended meanwhile keep their
  outcome.  Expiry (the window's end): the same, with the outcome expired.
- Batch status changes are guarded UPDATEs (``status IN (...)``): a batch never leaves a final status.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Iterator

from sqlalchemy import bindparam, func, select, text, update

from app import transitions
from app.batches.feed import feed
from app.batches.schemas import OPEN
from app.clock import now as clock_now
from app.files import service as files
from app.infra.db import get_engine, single_statement, transaction
from app.infra.storage import StorageError, get_storage
from app.infra.tables import batch_items, batches, tasks
from app.jobs import effects
from app.states import JobState

log = logging.getLogger(__name__)

COLLECT = 2000  # ended lines written per segment (a result is read, written and dropped one at a time)

_OUTCOME = {JobState.DONE: "completed", JobState.CLAIMED: "completed", JobState.FAILED: "failed",
            JobState.TIMEOUT: "failed", JobState.EXPIRED: "expired", JobState.CANCELED: "cancelled"}
_CODE = {"expired": "batch_expired", "cancelled": "batch_cancelled"}


def _line_id(job_id: str | None, batch_id: str, line_no: int) -> str:
    return "batch_req_" + (job_id[4:] if job_id else f"{batch_id[6:]}_{line_no}")


def _result(job) -> object:
    if job.result_inline is not None:
        raw = bytes(job.result_inline)
    else:
        raw = b"".join(get_storage().stream(job.result_location))
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _error_line(batch_id: str, line_no: int, custom_id: str, job_id: str | None, code: str, message: str) -> bytes:
    return (json.dumps({"id": _line_id(job_id, batch_id, line_no), "custom_id": custom_id, "response": None,
                        "error": {"code": code, "message": message}}, ensure_ascii=False) + "\n").encode()


def _segment_key(batch, n: int, kind: str) -> str:
    return f"batches/{batch.tenant_id}/{batch.id}/seg-{n}.{kind}"


def _collect(batch, failures: list[tuple[int, str, str]], ending: str | None) -> int:
    """Write the lines that ended (and ``failures``) as segment ``batch.segments``; how many."""
    with single_statement() as conn:
        ended = conn.execute(
            select(batch_items.c.line_no, batch_items.c.custom_id, tasks.c.id, tasks.c.state, tasks.c.error,
                   tasks.c.result_inline, tasks.c.result_location)
            .join(tasks, tasks.c.id == batch_items.c.job_id)
            .where(batch_items.c.batch_id == batch.id, batch_items.c.outcome.is_(None),
                   tasks.c.state.in_([int(s) for s in _OUTCOME]))
            .order_by(batch_items.c.line_no).limit(COLLECT)).all()
        unadmitted = [] if ending is None else conn.execute(
            select(batch_items.c.line_no, batch_items.c.custom_id)
            .where(batch_items.c.batch_id == batch.id, batch_items.c.outcome.is_(None),
                   batch_items.c.job_id.is_(None)).order_by(batch_items.c.line_no).limit(COLLECT)).all()
        customs = dict(conn.execute(select(batch_items.c.line_no, batch_items.c.custom_id).where(
            batch_items.c.batch_id == batch.id, batch_items.c.line_no.in_([n for n, _c, _m in failures])
        )).all()) if failures else {}
    if not (ended or unadmitted or failures):
        return 0
    outcomes: dict[int, str] = {}
    err: list[bytes] = []  # error lines are small; results are read one at a time, as the segment is written
    done_lines = []
    for line in ended:
        outcome = _OUTCOME[JobState(line.state)]
        if outcome == "cancelled" and ending == "expired":
            outcome = "expired"
        if outcome == "completed":
            done_lines.append(line)
        else:
            code, _, msg = (line.error or "").partition(": ")
            code = _CODE.get(outcome, code or outcome)
            err.append(_error_line(batch.id, line.line_no, line.custom_id, line.id, code, msg or outcome))
        outcomes[line.line_no] = outcome
    for line in unadmitted:
        err.append(_error_line(batch.id, line.line_no, line.custom_id, None, _CODE[ending],
                               f"the batch was {ending} before this request ran"))
        outcomes[line.line_no] = ending
    for n, code, msg in failures:
        err.append(_error_line(batch.id, n, customs.get(n, ""), None, code, msg))
        outcomes[n] = "failed"

    def output() -> Iterator[bytes]:
        for line in done_lines:
            try:
                body = _result(line)
            except StorageError as exc:
                log.warning("batch %s line %d: result unreadable: %s", batch.id, line.line_no, exc)
                outcomes[line.line_no] = "failed"
                err.append(_error_line(batch.id, line.line_no, line.custom_id, line.id, "result_gone",
                                       "the result is no longer available"))
                continue
            yield (json.dumps({"id": _line_id(line.id, batch.id, line.line_no), "custom_id": line.custom_id,
                               "response": {"status_code": 200, "request_id": line.id, "body": body},
                               "error": None}, ensure_ascii=False) + "\n").encode()

    seg = batch.segments
    storage = get_storage()
    storage.put_stream(_segment_key(batch, seg, "out"), output(), "application/jsonl")
    storage.put_stream(_segment_key(batch, seg, "err"), iter(err), "application/jsonl")
    done = sum(1 for o in outcomes.values() if o == "completed")
    with transaction() as conn:
        moved = conn.execute(update(batches).where(batches.c.id == batch.id, batches.c.segments == seg).values(
            segments=seg + 1, completed=batches.c.completed + done,
            failed=batches.c.failed + len(outcomes) - done, updated_at=clock_now()))
        if moved.rowcount != 1:
            raise RuntimeError("batch segments moved under the pass")
        conn.execute(update(batch_items).where(
            batch_items.c.batch_id == batch.id, batch_items.c.line_no == bindparam("n"),
            batch_items.c.outcome.is_(None)).values(outcome=bindparam("o")),
            [{"n": n, "o": o} for n, o in outcomes.items()])
    return len(outcomes)


def _stop_jobs(batch) -> int:
    """Cancel every admitted job of the batch that has not ended (each by its own guarded transition)."""
    with single_statement() as conn:
        open_jobs = conn.execute(
            select(tasks.c.id).join(batch_items, tasks.c.id == batch_items.c.job_id)
            .where(batch_items.c.batch_id == batch.id, batch_items.c.outcome.is_(None),
                   tasks.c.state.in_([int(JobState.PENDING), int(JobState.RUNNING), int(JobState.RETRY_WAIT)]))
        ).scalars().all()
    for job_id in open_jobs:
        with effects.collecting() as due, transaction() as conn:
            due.add(transitions.cancel(conn, job_id, batch.tenant_id))
    return len(open_jobs)


def _concat(batch, kind: str) -> Iterator[bytes]:
    storage = get_storage()
    for n in range(batch.segments):
        yield from storage.stream(storage_location(batch, n, kind))


def storage_location(batch, n: int, kind: str) -> str:
    return get_storage().location_of(_segment_key(batch, n, kind))


def _finalize(batch, ending: str | None) -> None:
    now = clock_now()
    with single_statement() as conn:
        if conn.execute(update(batches).where(batches.c.id == batch.id, batches.c.status.in_(OPEN)).values(
                status="finalizing", finalizing_at=func.coalesce(batches.c.finalizing_at, now),
                updated_at=now)).rowcount != 1:
            return
    out_id = err_id = None
    if batch.completed:
        out_id = files.store(batch.tenant_id, f"{batch.id}_output.jsonl", "batch_output", _concat(batch, "out")).id
    if batch.failed:
        err_id = files.store(batch.tenant_id, f"{batch.id}_error.jsonl", "batch_output", _concat(batch, "err")).id
    final = ending or "completed"
    stamp = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[final]
    with single_statement() as conn:
        conn.execute(update(batches).where(batches.c.id == batch.id, batches.c.status == "finalizing").values(
            status=final, output_file_id=out_id, error_file_id=err_id, updated_at=clock_now(),
            **{stamp: clock_now()}))
    storage = get_storage()
    storage.delete_many([storage_location(batch, n, k) for n in range(batch.segments) for k in ("out", "err")])


def _load(batch_id: str):
    with single_statement() as conn:
        return conn.execute(select(batches).where(batches.c.id == batch_id)).one()


def advance(batch_id: str) -> str | None:
    """One pass over one batch (module invariants); what it did, or None if another pass holds it."""
    with get_engine(autocommit=True).connect() as lock_conn:
        key = "asynch_batch:" + batch_id
        if not lock_conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key}).scalar():
            return None
        try:
            return _advance(batch_id)
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})


def _advance(batch_id: str) -> str:
    batch = _load(batch_id)
    if batch.status not in OPEN:
        return batch.status
    now = clock_now()
    ending = batch.ending
    if ending is None and batch.status == "in_progress" and now >= batch.expires_at:
        ending = _set_ending(batch, "expired", now)
    if ending is not None:
        _stop_jobs(batch)
    failures = feed(batch) if ending is None else []
    while _collect(_load(batch_id), failures, ending):
        failures = []
    batch = _load(batch_id)
    with single_statement() as conn:
        left = conn.execute(select(func.count()).select_from(batch_items).where(
            batch_items.c.batch_id == batch_id, batch_items.c.outcome.is_(None))).scalar_one()
    if left == 0:
        _finalize(batch, ending)
        return "finalized"
    return batch.status


def _set_ending(batch, ending: str, now: datetime) -> str:
    with single_statement() as conn:
        conn.execute(update(batches).where(batches.c.id == batch.id, batches.c.ending.is_(None),
                                           batches.c.status.in_(OPEN)).values(ending=ending, updated_at=now))
    return _load(batch.id).ending or ending


def cancel(batch_id: str) -> None:
    """Mark the batch cancelling (guarded: only one in progress); the pass stops its jobs and ends it."""
    now = clock_now()
    with single_statement() as conn:
        conn.execute(update(batches).where(batches.c.id == batch_id, batches.c.status == "in_progress",
                                           batches.c.ending.is_(None))
                     .values(status="cancelling", cancelling_at=now, ending="cancelled", updated_at=now))


def advance_all() -> dict:
    """The beat pass: every open batch, oldest activity first."""
    with single_statement() as conn:
        ids = conn.execute(select(batches.c.id).where(batches.c.status.in_(OPEN))
                           .order_by(batches.c.updated_at)).scalars().all()
    done = 0
    for batch_id in ids:
        try:
            if advance(batch_id) is not None:
                done += 1
        except Exception:  # one broken batch does not stop the others
            log.exception("batch pass failed", extra={"batch_id": batch_id})
    swept = files.sweep_expired()  # files past their expires_after (app/files/service.py)
    return {"processed": done + swept, "batches": len(ids), "files_expired": swept}
