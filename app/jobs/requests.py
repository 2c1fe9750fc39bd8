"""The jobs' request contracts, both faces: what a submission carries
besides its payload (headers, a batch and its items), the queries, an
admin's fail.  The views a job is shown by are app/jobs/schemas.py's.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from app.config import get_settings
from app.contract import NO_NUL, Int, Loose, Params, Shape, Text, rule
from app.infra.http.headers import HEADER_SPEC_PATTERN
from app.jobs.schemas import V1State
from app.jobs.submission import (DEADLINE_HELP, HEADER_SPEC_HELP, PAYLOAD_FILE_HELP, WEBHOOK_EVENTS_HELP,
                                  WEBHOOK_EVENTS_PATTERN,
                                  BizName, Creator, DeadlineSeconds, IdempotencyKey, Priority, WebhookEvents, carried)

# The options and their rule are app/jobs/submission.py's; these shapes only say how each face's
# wire spells them, under the options' own field names.  What the rule judges a face takes as its
# wire type (the document states the option's own schema: ``carried``; the 422 comes from the rule).


# The header's own syntax (a comma list), read as the option's list.
_CommaList = Annotated[str | None, AfterValidator(lambda v: [e.strip() for e in v.split(",")] if v else None)]

# A header is text: a decimal number in it ("5", "0.5", "1e3") is read as that number; any other
# text ("true", "inf", "1_0") stays text, which the rule refuses ("must be a number").
_DECIMAL = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_HeaderNumber = Annotated[str | None, AfterValidator(lambda v: float(v) if v is not None and _DECIMAL.match(v) else v)]
_INTEGER = re.compile(r"^\s*[+-]?\d{1,9}\s*$")
_HeaderInt = Annotated[str | None, AfterValidator(lambda v: int(v) if v is not None and _INTEGER.match(v) else v)]


def _header(alias: str, description: str, **kw) -> Any:
    """An optional header field (None when absent)."""
    return Field(None, alias=alias, description=description, **kw)


class CallerHeaders(Params):
    """What every submitting face reads from headers for the values a
    request derives (app/web/v1_jobs.py ``caller``): the creator and the OSS
    pass-through.  (A batch's apply to each of its jobs.)"""
    creator: Creator | None = _header("X-Creator", "who submitted it (stats)")
    oss_authorization: str | None = _header("X-Oss-Authorization", "sent as Authorization to the OSS file service")
    user_info: str | None = _header("X-User-Info", "only with the gateway's proof: the creator, and passed to "
                                           "the OSS file service; otherwise ignored")


class SubmitHeaders(CallerHeaders):
    """What a v1 submission carries in headers besides its body (the payload)."""
    idempotency_key: IdempotencyKey | None = _header(
        "Idempotency-Key", "1-255 printable ASCII; the same key returns the first job")
    model_key: str | None = _header("X-Model-Key", HEADER_SPEC_HELP, json_schema_extra={"pattern": HEADER_SPEC_PATTERN})
    biz_name: BizName | None = _header("X-Biz-Name", "business name (callbacks)")
    callback_url: str | None = _header("X-Callback-Url", "GET on done (see docs/api.md, Callbacks)")
    priority: _HeaderInt = _header("X-Priority", "0-9, default 5: orders dispatch among the tenant's own jobs (9 first)")
    webhook_url: str | None = _header("X-Webhook-Url", "a signed JSON POST (Standard Webhooks) on the job's "
                                      "terminal state (see docs/api.md, Webhooks)")
    webhook_events: _CommaList = _header(
        "X-Webhook-Events", WEBHOOK_EVENTS_HELP, max_length=64, pattern=WEBHOOK_EVENTS_PATTERN)
    deadline_seconds: carried(DeadlineSeconds | None, _HeaderNumber) = _header("X-Deadline", DEADLINE_HELP, max_length=32)
    payload_file_id: str | None = _header("X-Payload-File", PAYLOAD_FILE_HELP, max_length=80,
                                          json_schema_extra={"pattern": "^file-[0-9a-f]{1,64}$"})
    prefer: str | None = _header("Prefer", "RFC 7240; `wait=N` (seconds, capped by ASYNCH_WAIT_MAX_MS): answer 200 "
                                       "with the terminal job if it ends within N s (sync mode)", max_length=1024)


BATCH_MAX_JOBS = 1000


class BatchItem(Shape):
    """One job of a batch, judged on its own (a bad item is that item's 422,
    not the batch's)."""
    invalid: ClassVar[str] = "invalid batch item"

    payload: dict[str, Any] = Field(description="the JSON object forwarded to the model service")
    idempotency_key: IdempotencyKey | None = Field(None, description="as the Idempotency-Key header of a submit")
    biz_name: BizName = ""
    callback_url: str | None = Field(None, description="GET on done (see docs/api.md, Callbacks)")
    model_key: str | None = Field(None, description=HEADER_SPEC_HELP, json_schema_extra={"pattern": HEADER_SPEC_PATTERN})
    priority: carried(Priority | None, Any) = Field(None, description="0-9, default 5 (9 first), as X-Priority")
    webhook_url: str | None = Field(None, description="as X-Webhook-Url (see docs/api.md, Webhooks)")
    webhook_events: carried(WebhookEvents | None, list | None) = Field(None, description="as X-Webhook-Events")
    # Taken as sent: the rule judges the JSON value (true and "5" are not numbers).
    deadline_seconds: carried(DeadlineSeconds | None, Any) = Field(None, description="as X-Deadline")


class BatchSubmit(Shape):
    jobs: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=BATCH_MAX_JOBS),
                    # Items are objects judged one by one (a bad item is its own 422 in
                    # the 207), so the document does not promise a 4xx for one:
                    # the item's shape travels as x-item-schema.
                    WithJsonSchema({"type": "array", "minItems": 1, "maxItems": BATCH_MAX_JOBS,
                                    "items": {"type": "object", "x-item-schema": BatchItem.model_json_schema()}})] = Field(
        description=f"1 to {BATCH_MAX_JOBS} jobs; each is admitted or refused on its own")


def _iso_time(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        t = datetime.fromisoformat(v)
        # In UTC: PostgreSQL refuses offsets past +-15:59, which Python takes.
        return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError, TypeError):  # OverflowError: year 1 or 9999 moved out of range
        raise PydanticCustomError("time", "must be an ISO 8601 time") from None


QueryTime = Annotated[datetime | None, BeforeValidator(_iso_time)]
_TIME_OR_EMPTY = {"anyOf": [{"type": "string", "format": "date-time"}, {"const": ""}]}


class JobListQuery(Params):
    state: V1State | None = Field(None, description="a v1 state name")
    limit: Int(1, query=True) = rule("from 1 to ASYNCH_LIST_MAX_LIMIT", 50, **{"x-maximum-setting": "list_max_limit"})
    cursor: Text | None = Field(None, description="next_cursor of the previous page")
    tenant: Text | None = Field(None, description="admins: only this tenant's jobs")
    since: QueryTime = Field(None, description="only jobs created at or after this time (ISO 8601; no offset: UTC)",
                             json_schema_extra=_TIME_OR_EMPTY)
    until: QueryTime = Field(None, description="only jobs created before this time (ISO 8601; no offset: UTC)",
                             json_schema_extra=_TIME_OR_EMPTY)

    @field_validator("limit")
    @classmethod
    def _cap(cls, v: int) -> int:
        cap = get_settings().list_max_limit
        if v > cap:
            raise PydanticCustomError("cap", "must be from 1 to {cap}", {"cap": cap})
        return v


class WaitQuery(Params):
    # Any value is taken (seed 000: junk means the default), so the document says so.
    timeout: Annotated[str | None, WithJsonSchema({"type": ["integer", "string"], "pattern": NO_NUL})] = Field(
        None, description="milliseconds; default 30000, cap 300000; <=0 or unparsable: the default")

    def budget_ms(self) -> int:
        s = get_settings()
        try:
            ms = int(self.timeout) if self.timeout is not None else 0
        except ValueError:
            ms = 0
        return min(ms if ms > 0 else s.wait_default_ms, s.wait_max_ms)


class EventHeaders(Params):
    last_event_id: str | None = _header("Last-Event-ID", "the id of the last event received: the stream resumes after it",
                                        max_length=256)


class TenantEventsQuery(Params):
    model: Text | None = Field(None, description="only this model's jobs")
    tenant: Text | None = Field(None, description="admins: only this tenant's jobs (default: every tenant)")


class FailRequest(Loose):
    """An admin's fail: the optional reason, kept in the job's error."""
    invalid: ClassVar[str] = "invalid fail request"
    reason: Annotated[str, Field(max_length=1000, pattern=NO_NUL)] = rule("a string of at most 1000 characters", "")
