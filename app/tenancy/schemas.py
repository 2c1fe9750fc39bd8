"""Tenancy contracts: API keys."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from app.contract import NO_NUL, Params, Shape, StrictBool, Text, Timestamp, rule

TENANT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TenantId = Annotated[str, Field(pattern=TENANT_PATTERN)]
Role = Literal["admin", "user"]


class ApiKeyInput(Shape):

    invalid: ClassVar[str] = "invalid API key request"
    tenant: TenantId = rule("1-64 letters, digits, _ . -")
    role: Role = Field("user", description="admin or user")
    admin: StrictBool | None = Field(None, description="true: the same as role admin")
    name: Annotated[str, Field(max_length=128, pattern=NO_NUL)] = rule("a string of at most 128 characters", "")

    @property
    def effective_role(self) -> Role:
        return "admin" if self.admin else self.role


class ApiKeyView(Shape):
    id: int
    tenant: str
    role: Role
    name: str
    prefix: str
    created_at: Timestamp
    revoked_at: Timestamp | None

    @staticmethod
    def values(row) -> dict:
        return {"id": row.id, "tenant": row.tenant_id, "role": row.role, "name": row.name, "prefix": row.prefix,
                "created_at": row.created_at, "revoked_at": row.revoked_at}

    @classmethod
    def from_row(cls, row) -> "ApiKeyView":
        return cls.model_construct(**cls.values(row))


class ApiKeyCreated(ApiKeyView):
    key: str = Field(description="the key itself, shown once")


class ApiKeyList(Shape):
    keys: list[ApiKeyView]


class KeysQuery(Params):
    tenant: Text | None = None
