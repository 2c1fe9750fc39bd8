"""Usage stats: the query and the answer (one count per model call, by
day, tenant, creator and model)."""
from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from app.contract import Day, Int, Params, Shape, Text, rule


def _day(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return date.fromisoformat(v)
    except (TypeError, ValueError):
        raise PydanticCustomError("day", "must be a date YYYY-MM-DD") from None


QueryDay = Annotated[date | None, BeforeValidator(_day), WithJsonSchema(
    {"anyOf": [{"type": "string", "format": "date"}, {"const": ""}]})]


class UsageQuery(Params):
    day_from: QueryDay = Field(None, alias="from", description="first day (inclusive), YYYY-MM-DD")
    day_to: QueryDay = Field(None, alias="to", description="last day (inclusive), YYYY-MM-DD")
    tenant: Text | None = Field(None, description="users: only their own (another: 403)")
    model: Text | None = None
    # Pages in (day, model, tenant, creator) order; ``total`` stays the whole filter's sum.
    limit: Int(1, 10000, query=True) = rule("from 1 to 10000", 1000)
    cursor: Text | None = Field(None, description="next_cursor of the previous page")

    @field_validator("day_to")
    @classmethod
    def _ordered(cls, v: date | None, info) -> date | None:
        start = info.data.get("day_from")
        if v and start and start > v:
            raise PydanticCustomError("order", "must not be before from")
        return v


class UsageRow(Shape):
    model_config = {"alias_generator": None}

    day: Day
    tenant_id: str
    creator: str
    model_name: str
    request_count: int = Field(ge=0)


class Usage(Shape):
    model_config = {"alias_generator": None, "serialize_by_alias": True}

    day_from: Day | None = Field(alias="from")
    day_to: Day | None = Field(alias="to")
    rows: list[UsageRow]
    total: int = Field(ge=0, description="request_count summed over every row the filter matches (all pages)")
    next_cursor: str | None = Field(None, description="pass as cursor for the next page; null on the last")
