"""What operators look at: live numbers per model and throughput series."""
from __future__ import annotations

from pydantic import Field

from app.contract import Params, QueryInt, Shape, Timestamp, rule


class RuntimeOverrides(Shape):
    queue_limit: int | None
    max_concurrency: int | None


class ModelLive(Shape):
    model_name: str
    enabled: bool
    queue_depth: int = Field(description="gate slots taken (pending + running)")
    queue_limit: int = Field(description="effective: runtime override capped by the configuration")
    queue_limit_configured: int
    running: int
    pending: int
    retry_wait: int
    max_concurrency: int
    max_concurrency_configured: int
    runtime: RuntimeOverrides = Field(description="autotune's overrides (null: none)")


class Overview(Shape):
    models: list[ModelLive]


class SeriesPoint(Shape):
    done: int
    p90_seconds: float | None


class Series(Shape):
    since: Timestamp
    bucket_minutes: int
    models: dict[str, list[SeriesPoint]]


class SeriesQuery(Params):
    minutes: QueryInt(5, 1440) = rule("an integer from 5 to 1440", 60)
