"""v1 files: OpenAI's Files API (docs/api.md, "Files").

The upload route alone reads past ASYNCH_MAX_BODY_BYTES (up to ASYNCH_FILES_MAX_BYTES plus the multipart
framing): it sets its own request's limit before it touches the body, and streams it (app/files/service.py)."""
from __future__ import annotations

from flask import Blueprint, Response, request

from app.config import get_settings
from app.files import service as files
from app.files.schemas import EXPIRES_MAX, EXPIRES_MIN, PURPOSES, FileDeleted, FileList, FileListQuery, FileObject
from app.web.auth import current_principal
from app.web.contract import Ok, endpoint

bp = Blueprint("v1_files", __name__, url_prefix="/v1")

_FILE = {"file_id": {"description": "file id (file-...)"}}
FRAMING = 1024 * 1024  # room for the multipart boundaries and fields around the file


_UPLOAD = {"type": "object", "required": ["file", "purpose"], "properties": {
    "file": {"type": "string", "format": "binary", "description": "the bytes (streamed to storage)"},
    "purpose": {"type": "string", "enum": list(PURPOSES)},
    "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
    "expires_after[seconds]": {"type": "integer", "minimum": EXPIRES_MIN, "maximum": EXPIRES_MAX}}}


@bp.post("/files")
@endpoint("Upload a file", tag="files", errors=(400, 413, 422), ok=Ok(FileObject, "the stored file"),
          body=_UPLOAD, body_media="multipart/form-data",
          description="multipart/form-data: `file` (the bytes) and `purpose` (batch, user_data, ...); optional "
                      "`expires_after[anchor]=created_at` and `expires_after[seconds]` (3600 to 2592000). "
                      "Streamed to storage as it arrives; larger than ASYNCH_FILES_MAX_BYTES: 413, nothing kept.")
def upload_file(body=None):
    tenant = current_principal().tenant_id
    request.max_content_length = get_settings().files_max_bytes + FRAMING
    row = files.upload(tenant, request.stream, request.headers.get("Content-Type"))
    return files.view(row)


@bp.get("/files")
@endpoint("List files", tag="files", query=FileListQuery, errors=(404,),
          ok=Ok(FileList, "a page, newest first by default (404: `after` names no file of yours)"))
def list_files(query: FileListQuery):
    rows, more = files.list_files(current_principal().tenant_id, query.purpose, query.after, query.limit,
                                  query.order)
    data = [files.view(r) for r in rows]
    return FileList.model_construct(object="list", data=data, first_id=data[0].id if data else None,
                                    last_id=data[-1].id if data else None, has_more=more)


@bp.get("/files/<file_id>")
@endpoint("Retrieve a file", tag="files", path=_FILE, errors=(404,), ok=Ok(FileObject, "the file"))
def get_file(file_id: str):
    return files.view(files.get(current_principal().tenant_id, file_id))


@bp.delete("/files/<file_id>")
@endpoint("Delete a file", tag="files", path=_FILE, errors=(404,), ok=Ok(FileDeleted, "deleted"))
def delete_file(file_id: str):
    files.remove(current_principal().tenant_id, file_id)
    return FileDeleted.model_construct(id=file_id, object="file", deleted=True)


@bp.get("/files/<file_id>/content")
@endpoint("Download a file's content", tag="files", path=_FILE, errors=(404,),
          ok=Ok({"type": "string", "format": "binary"}, "the bytes, streamed", media_type="application/octet-stream"))
def file_content(file_id: str):
    row, chunks = files.content(current_principal().tenant_id, file_id)
    return Response(chunks, mimetype="application/octet-stream", headers={"Content-Length": str(row.bytes)})
