"""Maintenance contracts: a pass's report, autotune's request and report,
and the record of periodic runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from app.contract import BeatRun, Int, Loose, Params, Shape, StrictBool, rule

MAX_WINDOW_SECONDS = 30 * 86400


class _Snake(Shape):
    """snake_case on the seed face too."""

    model_config = ConfigDict(alias_generator=None)


class Report(_Snake):
    """Rows or items a pass worked on, with a report per part (docs/api.md).
    Reports keep their snake_case names on the seed face too."""

    model_config = ConfigDict(extra="allow")

    processed: int = Field(ge=0)


class AutotuneRequest(Loose):
    """Optional body: absent or <= 0 window means ASYNCH_AUTOTUNE_WINDOW_SECONDS."""

    invalid: ClassVar[str] = "invalid autotune request"

    window_seconds: Int(None, MAX_WINDOW_SECONDS) | None = rule(
        f"an integer number of seconds, at most {MAX_WINDOW_SECONDS}", None)
    dry_run: StrictBool = Field(False, description="decide, write nothing")


# Autotune's rule computes with it too (a dataclass); no docstring: none in OpenAPI.
@dataclass(frozen=True)
class Limits:
    __pydantic_config__ = ConfigDict(extra="forbid")
    max_concurrency: int
    queue_limit: int


class AutotuneInputs(_Snake):
    model_config = ConfigDict(extra="allow")

    samples: int
    p90_seconds: float | None
    throughput_per_second: float | None
    queued: int


class AutotuneDecision(_Snake):
    model: str
    action: Literal["skip", "decrease", "increase", "hold"]
    reason: str
    old: Limits
    new: Limits | None
    inputs: AutotuneInputs
    evidence_seconds: float
    applied: bool
    changed: bool


class AutotuneReport(_Snake):
    processed: int = Field(ge=0, description="models whose limits changed")
    window_seconds: int
    dry_run: bool
    models: list[AutotuneDecision]
    busy: list[str] = Field(description="models another run was tuning at that moment")


class BeatRuns(_Snake):
    runs: list[BeatRun]


class RunsQuery(Params):
    limit: Int(1, 1000, query=True) = rule("from 1 to 1000", 100)
