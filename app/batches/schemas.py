"""The Batch API's shapes, OpenAI's: the batch object, a page, the create body, the list query.

Times are Unix seconds (as OpenAI's are).  Statuses: validating, failed, in_progress, finalizing, completed,
expired, cancelling, cancelled."""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from app.contract import Int, Params, Shape, Text

STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
OPEN = ("in_progress", "finalizing", "cancelling")
WINDOW = re.compile(r"^([1-9][0-9]{0,6})(m|h|d)$")
WINDOW_UNIT = {"m": 60, "h": 3600, "d": 86400}
WINDOW_MIN, WINDOW_MAX = 60, 30 * 86400
WINDOW_TEXT = "a window like 24h, 30m, 2h or 7d (1 minute to 30 days)"
# The same rule as a pattern (the OpenAPI document's): 1-43200 m, 1-720 h, 1-30 d.
WINDOW_PATTERN = ("^(([1-9][0-9]{0,3}|[1-3][0-9]{4}|4[0-2][0-9]{3}|43200)m|([1-9][0-9]?|[1-6][0-9]{2}|7[01][0-9]|720)h"
                  "|([1-9]|[12][0-9]|30)d)$")


def window_seconds(window: str) -> int:
    m = WINDOW.match(window)
    assert m is not None
    return int(m.group(1)) * WINDOW_UNIT[m.group(2)]


def _window(v: str) -> str:
    m = WINDOW.match(v) if isinstance(v, str) else None
    if m is None or not WINDOW_MIN <= window_seconds(v) <= WINDOW_MAX:
        raise ValueError(f"must be {WINDOW_TEXT}")
    return v


class BatchCreate(Shape):
    input_file_id: Text = Field(description="a file of purpose batch (JSONL, one request a line)")
    endpoint: Annotated[str, Field(pattern="^/v1/[A-Za-z0-9/_.-]{1,200}$", description=(
        "the path every line's url names: /v1/chat/completions, /v1/completions, /v1/embeddings, or any "
        "path the target models serve"))]
    completion_window: str = Field(pattern=WINDOW_PATTERN, description=WINDOW_TEXT + "; refused up front (429) when the queue "
                                               "estimate cannot finish the batch within it")
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        None, description="up to 16 pairs (keys up to 64 characters, values up to 512)")

    @field_validator("completion_window")
    @classmethod
    def _check_window(cls, v: str) -> str:
        return _window(v)

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: dict | None) -> dict | None:
        if v is not None and (len(v) > 16 or any(len(k) > 64 for k in v)):
            raise ValueError("must have at most 16 pairs with keys of at most 64 characters")
        return v


class BatchError(Shape):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Shape):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Shape):
    total: int
    completed: int
    failed: int


class BatchObject(Shape):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Literal[STATUSES]  # type: ignore[valid-type]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, Any] | None = None


class BatchList(Shape):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchListQuery(Params):
    limit: Int(1, 100, query=True) = Field(20, description="1 to 100")
    after: Text | None = Field(None, description="the last id of the previous page")
