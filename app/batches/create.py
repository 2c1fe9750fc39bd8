"""Creating a batch: its input file judged line by line, its window judged against the queue, then one
transaction writes the batch and its lines.

Invariants:
- The input file is read as a stream, a line at a time (each line at most ASYNCH_MAX_BODY_BYTES): never
  whole in memory.  A line is kept as (custom_id, model, offset, length): its body stays in the file.
- Validation (JSONL shape, unique custom_id, method POST, url = endpoint, body.model a configured enabled
  model, the body against that model's form) finds every problem it can (up to MAX_ERRORS): any one fails
  the batch (status failed, OpenAI's ``errors`` with line numbers) and admits nothing.
- The window: for each model, the estimator's start for a new job of the tenant (behind what is queued)
  plus the batch's own lines at the model's concurrency; ending after the window is a 429
  deadline_unmeetable and writes nothing (no batch row, no line).
- A valid batch and all its lines are one transaction (in_progress); admission is feed.py's.
"""
from __future__ import annotations

import math
import secrets
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterator

from sqlalchemy import insert

from app.batches.schemas import BatchCreate, window_seconds
from app.catalog.forms import payload_errors
from app.catalog.registry import enabled_model
from app.clock import now as clock_now
from app.config import get_settings
from app.contract import parse_json
from app.errors import DomainError, NotFound, ValidationFailed
from app.files import service as files
from app.infra.db import transaction
from app.infra.storage import StorageError, get_storage
from app.infra.tables import batch_items, batches
from app.jobs import estimates
from app.jobs.dispatch import order_score

MAX_ERRORS = 100
INSERT_ROWS = 5000


def new_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass
class Judged:
    lines: list[tuple[int, str, str, int, int]] = field(default_factory=list)  # (line, custom_id, model, off, len)
    errors: list[dict] = field(default_factory=list)

    def error(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


def judge(tenant: str, body: BatchCreate) -> Judged:
    """Every line of the input file against the rule (module invariants)."""
    s = get_settings()
    row = files.get(tenant, body.input_file_id)  # 404: not this tenant's file
    if row.purpose != "batch":
        raise ValidationFailed("invalid batch", [{"pointer": "/input_file_id",
                                                  "message": f"must be a file of purpose batch (it is {row.purpose})"}])
    out, seen, models = Judged(), set(), {}
    try:
        chunks = get_storage().stream(row.location)
        for number, offset, raw in _lines_with_lengths(chunks, s.max_body_bytes):
            raw_line, length = raw
            if raw_line is not None and not raw_line.strip():
                continue  # blank lines (a trailing newline) are no requests
            if len(out.lines) >= s.batch_max_lines:
                out.error("too_many_lines", f"the input file has more than {s.batch_max_lines} lines "
                                            "(ASYNCH_BATCH_MAX_LINES)", number)
                break
            _judge_line(out, number, offset, length, raw_line, body.endpoint, seen, models, tenant)
    except StorageError as exc:
        raise DomainError(f"input file unreadable: {exc}") from exc
    if not out.lines and not out.errors:
        out.error("empty_file", "the input file has no requests", None)
    return out


def _lines_with_lengths(chunks: Iterator[bytes], cap: int) -> Iterator[tuple[int, int, tuple[bytes | None, int]]]:
    """Lines as (number, offset, (bytes or None past ``cap``, length in bytes))."""
    buf, start, number, size, over = bytearray(), 0, 0, 0, False
    for chunk in chunks:
        pos = 0
        while (nl := chunk.find(b"\n", pos)) >= 0:
            piece = chunk[pos:nl]
            number += 1
            size += len(piece)
            if not over and len(buf) + len(piece) <= cap:
                yield number, start, (bytes(buf + piece), size)
            else:
                yield number, start, (None, size)
            start += size + 1
            buf, over, size, pos = bytearray(), False, 0, nl + 1
        rest = chunk[pos:]
        size += len(rest)
        if not over and len(buf) + len(rest) <= cap:
            buf += rest
        else:
            over, buf = True, bytearray()
    if size:
        number += 1
        yield number, start, (None if over else bytes(buf), size)


def _judge_line(out: Judged, number: int, offset: int, length: int, raw: bytes | None, endpoint: str,
                seen: set, models: dict, tenant: str) -> None:
    if raw is None:
        return out.error("line_too_large", "the line is larger than ASYNCH_MAX_BODY_BYTES", number)
    try:
        req = parse_json(raw)
    except (ValueError, UnicodeDecodeError):
        return out.error("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(req, dict):
        return out.error("invalid_request", "a line must be a JSON object", number)
    missing = [k for k in ("custom_id", "method", "url", "body") if k not in req]
    if missing:
        return out.error("missing_required_parameter", f"missing {', '.join(missing)}", number, missing[0])
    cid, body = req["custom_id"], req["body"]
    if not isinstance(cid, str) or not cid or "\x00" in cid or len(cid) > 512:
        return out.error("invalid_request", "custom_id must be a non-empty string (up to 512 characters)",
                         number, "custom_id")
    if cid in seen:
        return out.error("duplicate_custom_id", f"The custom_id for this request is a duplicate of another "
                                                f"request: {cid[:64]}", number, "custom_id")
    seen.add(cid)
    if req["method"] != "POST":
        return out.error("invalid_method", "method must be POST", number, "method")
    if req["url"] != endpoint:
        return out.error("mismatched_endpoint", f"url must be the batch's endpoint {endpoint}", number, "url")
    if not isinstance(body, dict):
        return out.error("invalid_request", "body must be a JSON object", number, "body")
    name = body.get("model")
    if not isinstance(name, str) or not name or "\x00" in name:
        return out.error("missing_required_parameter", "body.model must name a model", number, "body.model")
    if name not in models:
        try:
            models[name] = enabled_model(name)
        except DomainError:
            models[name] = None
    model = models[name]
    if model is None:
        return out.error("model_not_found", f"The provided model '{name[:128]}' is not configured or is "
                                             "disabled.", number, "body.model")
    if "payload_file_id" in req:  # the payload by reference: body names only the model
        ref = req["payload_file_id"]
        try:
            if not isinstance(ref, str) or set(body) != {"model"}:
                raise NotFound("")
            files.get(tenant, ref)
        except NotFound:
            return out.error("invalid_request", "payload_file_id must be a file of yours, and the body then only "
                                                "{\"model\": ...}", number, "payload_file_id")
    elif errs := payload_errors(model.form, body, "/body"):
        return out.error("invalid_request", "; ".join(f"{e['pointer']} {e['message']}" for e in errs[:5]),
                         number, "body")
    out.lines.append((number, cid, name, offset, length))


def refuse_late(tenant: str, judged: Judged, deadline: datetime) -> None:
    """429 deadline_unmeetable when the batch's lines cannot end by ``deadline`` (module invariants)."""
    counts = Counter(name for _n, _c, name, _o, _l in judged.lines)
    now = clock_now()
    asks = [(enabled_model(name), tenant, [order_score(now)]) for name in counts]
    worst = None
    for (model, _t, _s), ests in zip(asks, estimates.for_new_many(asks)):
        if not ests:
            continue  # the estimator cannot say (Redis away): refuse nothing
        first, c = ests[0], max(1, model.max_concurrency)
        t = first.done_at - first.start_at
        done = first.start_at + t * math.ceil(counts[model.model_name] / c)
        est = estimates.Estimate(first.position, first.start_at, done, first.run_seconds)
        if worst is None or est.done_at > worst.done_at:
            worst = est
    estimates.refuse_late(worst, deadline)


def create(tenant: str, body: BatchCreate):
    """Judge, then write the batch (failed with its errors, or in_progress with its lines); its row."""
    judged = judge(tenant, body)
    now = clock_now()
    deadline = now + timedelta(seconds=window_seconds(body.completion_window))
    if not judged.errors:
        refuse_late(tenant, judged, deadline)
    values = dict(id=new_id(), tenant_id=tenant, endpoint=body.endpoint, input_file_id=body.input_file_id,
                  completion_window=body.completion_window, metadata=body.metadata, created_at=now,
                  expires_at=deadline, updated_at=now)
    lines = [] if judged.errors else judged.lines  # a failed batch admits nothing
    if judged.errors:
        values.update(status="failed", errors=judged.errors, failed_at=now)
    else:
        values.update(status="in_progress", in_progress_at=now, total=len(judged.lines))
    with transaction() as conn:
        row = conn.execute(insert(batches).values(**values).returning(*batches.c)).one()
        for i in range(0, len(lines), INSERT_ROWS):
            conn.execute(insert(batch_items), [
                dict(batch_id=row.id, line_no=n, custom_id=c, model_name=m, byte_offset=o, byte_len=ln)
                for n, c, m, o, ln in lines[i:i + INSERT_ROWS]])
    return row
