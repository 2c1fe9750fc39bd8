"""The Files API's shapes, OpenAI's: a file object, a page of them, a deletion, the list query.

Times are Unix seconds (as OpenAI's are), not this API's ISO strings: OpenAI clients parse them as integers."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.contract import Int, Params, Shape, Text

# What a caller may upload for; batch_output is ours (a batch's output and error files).
PURPOSES = ("batch", "user_data", "assistants", "vision", "evals", "fine-tune")
EXPIRES_MIN, EXPIRES_MAX = 3600, 30 * 86400  # OpenAI's expires_after[seconds] range


class FileObject(Shape):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds")
    expires_at: int | None = Field(None, description="Unix seconds; null: kept until deleted")
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None


class FileList(Shape):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(Shape):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class FileListQuery(Params):
    purpose: Text | None = Field(None, description="only files of this purpose")
    limit: Int(1, 10000, query=True) = Field(10000, description="1 to 10,000 (OpenAI's default: 10,000)")
    after: Text | None = Field(None, description="the last id of the previous page")
    order: Literal["asc", "desc"] = Field("desc", description="by created_at")
