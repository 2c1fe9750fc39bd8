"""Files: a tenant's uploads, streamed to storage as they arrive.

Invariants:
- The bytes are in storage (``files/<tenant>/<id>``), never whole in memory or in a row: ``upload`` hands the
  multipart stream to ``Storage.put_stream`` (an S3 multipart upload) and counts as it goes; past
  ASYNCH_FILES_MAX_BYTES it stops with 413 and nothing stays (the partial object is aborted or unlinked).
- The row is written only after the object is stored whole; a refused upload writes no row.
- A file is its tenant's: another tenant's id, or one past its ``expires_at``, is 404 (``get``).
- ``expires_at`` is honoured: reads refuse it at once; ``sweep_expired`` deletes its object and row.
"""
from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import BinaryIO, Iterator

from sqlalchemy import and_, delete, insert, or_, select

from app.clock import now
from app.config import get_settings
from app.errors import BadRequest, DomainError, NotFound, Unavailable, ValidationFailed
from app.files.schemas import EXPIRES_MAX, EXPIRES_MIN, PURPOSES, FileObject
from app.infra.db import single_statement, transaction
from app.infra.multipart import MultipartError, Part, boundary_of, parts
from app.infra.storage import StorageError, get_storage
from app.infra.tables import files

log = logging.getLogger(__name__)


class FileTooLarge(DomainError):
    status = 413


def new_id() -> str:
    return "file-" + secrets.token_hex(12)


def _key(tenant: str, file_id: str) -> str:
    return f"files/{tenant}/{file_id}"


def _capped(chunks: Iterator[bytes], cap: int, counter: list[int]) -> Iterator[bytes]:
    for chunk in chunks:
        counter[0] += len(chunk)
        if counter[0] > cap:
            raise FileTooLarge(f"file too large (max {cap} bytes, ASYNCH_FILES_MAX_BYTES)")
        yield chunk


def _expiry(fields: dict[str, str], created: datetime) -> datetime | None:
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if seconds is None:  # no expiry (an anchor alone says nothing)
        return None
    errs = []
    if anchor not in (None, "created_at"):
        errs.append({"pointer": "/expires_after/anchor", "message": "must be created_at"})
    if not (seconds or "").strip().isdigit() or not EXPIRES_MIN <= int(seconds) <= EXPIRES_MAX:
        errs.append({"pointer": "/expires_after/seconds", "message": f"must be an integer from {EXPIRES_MIN} "
                                                                     f"to {EXPIRES_MAX}"})
    if errs:
        raise ValidationFailed("invalid expires_after", errs)
    return created + timedelta(seconds=int(seconds))


def upload(tenant: str, stream: BinaryIO, content_type: str | None):
    """A multipart upload (``file`` and ``purpose``, optionally ``expires_after[anchor|seconds]``) stored as it
    arrives; the new row."""
    try:
        boundary = boundary_of(content_type)
    except MultipartError as exc:
        raise BadRequest(str(exc)) from exc
    fields: dict[str, str] = {}
    file_id, stored, size, filename = new_id(), None, [0], None
    storage, cap = get_storage(), get_settings().files_max_bytes
    try:
        for part in parts(stream, boundary):
            if part.name == "file" and stored is None:  # a file part (or a plain field named file)
                filename = (part.filename or "").replace("\x00", "") or "upload"  # PostgreSQL text holds no NUL
                stored = _put(storage, tenant, file_id, _capped(part.chunks, cap, size))
            elif part.filename is None:
                fields[part.name] = part.text()
        _check(fields, stored)
        created = now()
        expires = _expiry(fields, created)
    except MultipartError as exc:
        _drop(storage, stored)
        raise BadRequest(f"invalid multipart body: {exc}") from exc
    except BaseException:
        _drop(storage, stored)
        raise
    return record(tenant, file_id, filename[:1024], fields["purpose"], size[0], stored, created, expires)


def _put(storage, tenant: str, file_id: str, chunks: Iterator[bytes]) -> str:
    try:
        return storage.put_stream(_key(tenant, file_id), chunks, "application/octet-stream")
    except StorageError as exc:
        log.warning("file upload failed: %s", exc)
        raise Unavailable("storage unavailable") from exc


def _check(fields: dict[str, str], stored: str | None) -> None:
    errs = []
    if stored is None:
        errs.append({"pointer": "/file", "message": "is required: a file part"})
    purpose = fields.get("purpose")
    if purpose not in PURPOSES:
        errs.append({"pointer": "/purpose", "message": f"must be one of {', '.join(PURPOSES)}"})
    if errs:
        raise ValidationFailed("invalid file upload", errs)


def _drop(storage, location: str | None) -> None:
    if location:
        try:
            storage.delete(location)
        except StorageError as exc:
            log.warning("could not delete a refused upload %s: %s", location, exc)


def record(tenant: str, file_id: str, filename: str, purpose: str, size: int, location: str,
           created: datetime | None = None, expires: datetime | None = None):
    row = dict(id=file_id, tenant_id=tenant, filename=filename, purpose=purpose, bytes=size, location=location,
               created_at=created or now(), expires_at=expires)
    with single_statement() as conn:
        return conn.execute(insert(files).values(**row).returning(*files.c)).one()


def store(tenant: str, filename: str, purpose: str, chunks: Iterator[bytes]):
    """A file we make (a batch's output): streamed to storage, then its row."""
    file_id, size = new_id(), [0]

    def counted():
        for c in chunks:
            size[0] += len(c)
            yield c

    location = get_storage().put_stream(_key(tenant, file_id), counted(), "application/jsonl")
    return record(tenant, file_id, filename, purpose, size[0], location)


def _live():
    return or_(files.c.expires_at.is_(None), files.c.expires_at > now())


def get(tenant: str, file_id: str):
    with single_statement() as conn:
        row = conn.execute(select(files).where(files.c.id == file_id, files.c.tenant_id == tenant, _live())).first()
    if row is None:
        raise NotFound(f"no such file: {file_id}")
    return row


def content(tenant: str, file_id: str) -> tuple:
    """The row and its bytes as chunks (404 before any byte if the object is gone)."""
    row = get(tenant, file_id)
    try:
        return row, get_storage().stream(row.location)
    except StorageError as exc:
        raise NotFound(f"file content is gone: {file_id}") from exc


def list_files(tenant: str, purpose: str | None, after: str | None, limit: int, order: str):
    q = select(files).where(files.c.tenant_id == tenant, _live())
    if purpose:
        q = q.where(files.c.purpose == purpose)
    desc = order == "desc"
    with single_statement() as conn:
        if after:
            ref = conn.execute(select(files.c.created_at, files.c.id).where(
                files.c.id == after, files.c.tenant_id == tenant)).first()
            if ref is None:
                raise NotFound(f"no such file: {after}")
            cmp = (lambda a, b: a < b) if desc else (lambda a, b: a > b)
            q = q.where(or_(cmp(files.c.created_at, ref.created_at),
                            and_(files.c.created_at == ref.created_at, cmp(files.c.id, ref.id))))
        keys = (files.c.created_at.desc(), files.c.id.desc()) if desc else (files.c.created_at, files.c.id)
        rows = conn.execute(q.order_by(*keys).limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit


def remove(tenant: str, file_id: str) -> None:
    row = get(tenant, file_id)
    with transaction() as conn:
        conn.execute(delete(files).where(files.c.id == row.id))
    _drop(get_storage(), row.location)


def sweep_expired(limit: int = 1000) -> int:
    """Deletes up to ``limit`` files past their expires_at (objects first, then rows); how many."""
    with single_statement() as conn:
        rows = conn.execute(select(files.c.id, files.c.location).where(files.c.expires_at <= now())
                            .limit(limit)).all()
    if not rows:
        return 0
    failed = get_storage().delete_many([r.location for r in rows])
    done = [r.id for r in rows if r.location not in failed]
    with transaction() as conn:
        conn.execute(delete(files).where(files.c.id.in_(done)))
    return len(done)


def view(row) -> FileObject:
    ts = lambda d: None if d is None else int(d.timestamp())  # noqa: E731
    return FileObject.model_construct(id=row.id, bytes=row.bytes, created_at=ts(row.created_at),
                                      expires_at=ts(row.expires_at), filename=row.filename, purpose=row.purpose,
                                      object="file", status="processed", status_details=None)
