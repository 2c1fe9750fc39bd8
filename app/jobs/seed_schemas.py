"""The seed-002 face's task contracts: createTask's body and headers,
getTaskBatch's ids, and a task as those routes show it (its field names
are the seed's own, snake_case, on both faces)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from app.config import get_settings
from app.contract import NO_NUL, Shape, Timestamp, parse_json, rule
from app.infra.storage import public_location
from app.jobs.requests import CallerHeaders
from app.jobs.schemas import JobId
from app.jobs.submission import (HEADER_SPEC_HELP, BizName, CallbackUrl, Creator, DeadlineSeconds, IdempotencyKey,
                                 ModelKey, _none_if_empty, carried)
from app.states import RESULT_STATES, JobState, seed_code


class TaskHeaders(CallerHeaders):
    """The headers a seed createTask reads (its other options are body fields;
    a body's creator wins over X-Creator)."""

    idempotency_key: IdempotencyKey | None = Field(
        None, alias="Idempotency-Key", description="1-255 printable ASCII; the same key returns the first task")


def _payload_object(v: Any) -> Any:
    # The seed allows the payload as a string holding a JSON object.
    try:  # strict JSON (no NaN), as every body
        v = parse_json(v) if isinstance(v, str) else v
    except ValueError:
        v = None
    if not isinstance(v, dict):
        raise PydanticCustomError("payload", "must be a JSON object")
    return v


class CreateTask(Shape):
    """The seed's createTask body: the v1 submission's options as fields."""
    # The options are judged by the submission rule (app/jobs/submission.py).
    invalid: ClassVar[str] = "invalid task"

    model_name: Annotated[str, Field(min_length=1)] = rule("a non-empty string")
    request_payload: Annotated[dict, BeforeValidator(_payload_object)] = Field(
        default_factory=dict, json_schema_extra={
            "anyOf": [{"type": "object"}, {"type": "string", "contentMediaType": "application/json"}]},
        description="forwarded to the model; checked against the model's form (absent: {}); "
                    "a string holding a JSON object is taken too")
    biz_name: carried(BizName | None, str | None) = None
    callback_url: carried(CallbackUrl | None, str | None) = None
    model_key: carried(ModelKey, str | None) = Field(None, description=HEADER_SPEC_HELP)
    creator: carried(Creator | None, str | None) = None
    deadline_seconds: carried(DeadlineSeconds | None, Any) = Field(
        None, alias="deadline", description="seconds from now, as v1's X-Deadline (docs/api.md, Deadlines)")

    _empty_is_none = field_validator("biz_name", "callback_url", "model_key", "creator", mode="before")(_none_if_empty)


def _cap_ids(ids: list[str]) -> list[str]:
    cap = get_settings().batch_max_ids
    if len(ids) > cap:
        raise PydanticCustomError("cap", "must name at most {cap} ids", {"cap": cap})
    return ids


class TaskIds(Shape):
    invalid: ClassVar[str] = "invalid task ids"
    task_ids: Annotated[list[Annotated[str, Field(min_length=1, max_length=40, pattern=NO_NUL)]],
                        AfterValidator(_cap_ids)] = rule(
        "an array of task ids (at most ASYNCH_BATCH_MAX_IDS); duplicates are answered once",
        **{"x-maxItems-setting": "batch_max_ids"})


_ERROR_STATES = (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED, JobState.RETRY_WAIT, JobState.EXPIRED)


class SeedTask(Shape):
    """A task as the seed-002 routes show it.  state is the seed's code: 0
    queued, 1 running, 2 done, 3 failed/timeout/canceled/expired/waiting to retry, 4
    claimed; null for an unknown id (or another tenant's), which also has
    error 'task not found'.  Field names are the seed's own (snake_case)."""

    model_config = {"alias_generator": None}

    task_id: str
    state: Literal[0, 1, 2, 3, 4] | None
    oss_file: str | None = Field(description="where the result is (2 and 4)")
    file_type: str | None = Field(None, description="the result's MIME type")
    expire_at: Timestamp | None = None
    model_name: str | None = None
    biz_name: str | None = None
    retry_count: int | None = None
    created_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    error: str | None = None
    claimed: bool | None = Field(None, description="getTaskBatch: this call moved it 2 -> 4 (and shows it as 2)")

    @classmethod
    def from_row(cls, row, claimed: bool | None = None) -> "SeedTask":
        """``claimed``: True on the getTaskBatch answer that moved the row 2 -> 4,
        which shows it as 2 (the seed's flow: "download what is in 2"); later reads show 4."""
        state = JobState(row.state)
        result = state in RESULT_STATES
        values = {"task_id": row.id, "state": 2 if claimed else seed_code(state),
                  "oss_file": public_location(row.result_location, row.model_name, row.id) if result else None,
                  "file_type": row.result_content_type if result else None,
                  "expire_at": row.expire_at if state == JobState.CLAIMED else None,
                  "model_name": row.model_name, "biz_name": row.biz_name, "retry_count": row.retry_count,
                  "created_at": row.created_at, "finished_at": row.finished_at}
        if state in _ERROR_STATES and row.error:
            values["error"] = row.error
        if claimed is not None:
            values["claimed"] = claimed
        return cls.model_construct(**values)

    @classmethod
    def not_found(cls, task_id: str) -> "SeedTask":
        return cls.model_construct(task_id=task_id, state=None, oss_file=None, error="task not found", claimed=False)


class CreatedTask(Shape):
    model_config = {"alias_generator": None}

    task_id: JobId
