"""Shapes of the HTTP layer itself: error bodies (both faces) and health.
The one error handler (app/web/errors.py) writes these."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.contract import Shape


class PointerError(Shape):
    pointer: str = Field(description="RFC 6901 JSON pointer into the request (seed face: camelCase names)")
    message: str


class Error(Shape):
    error: str


class Throttled(Error):
    """429: a limit is reached.  A deadline refusal (``code``
    deadline_unmeetable) also carries the queue's estimate and the deadline."""

    code: str | None = Field(None, description="deadline_unmeetable: the estimate ends after the deadline")
    queue_position: int | None = None
    estimated_start_at: str | None = Field(None, description="RFC 3339")
    estimated_done_at: str | None = Field(None, description="RFC 3339")
    deadline_at: str | None = Field(None, description="RFC 3339")


class ValidationError(Error):  # noqa: N818 - the component's name in the document
    errors: list[PointerError]


class SeedError(Shape):
    """An error on the seed face: code is the HTTP status, message the error text."""

    code: int = Field(ge=400)
    message: str
    data: dict | None = Field(description="null; a deadline_unmeetable refusal's estimate (as v1's 429 body)")


class SeedValidationError(SeedError):
    errors: list[PointerError]


ERROR_SHAPES = (Error, Throttled, ValidationError, SeedError, SeedValidationError)


class Health(Shape):
    status: str


class Ready(Shape):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str]
    error: str | None = None
