"""A payload by reference (X-Payload-File on a submit, ``payload_file_id`` on a batch line): an uploaded file
(app/files/) whose bytes are the upstream's request body.

Invariants:
- The row holds only the reference (``payload_file_id``; request_payload is ``{}``); the bytes stay in storage.
- The file must be the job's tenant's (checked at submit, and again when the worker reads it: a job can never
  send another tenant's file); a submit with a reference has an empty body and skips the model's form.
- The worker streams the file to the upstream (``call_input``): a 1 GB payload is never whole in memory.
"""
from __future__ import annotations

import json

from app.errors import NotFound, ValidationFailed
from app.files import service as files
from app.infra.http.deadline import StreamBody
from app.infra.storage import get_storage


def check(pointer: str, file_id: str, payload, tenant: str | None) -> None:
    """422 unless ``payload`` is empty and ``file_id`` is a live file of ``tenant``."""
    if payload:
        raise ValidationFailed("invalid job options", [{"pointer": pointer, "message": "needs an empty body ({}): "
                                                                                        "the file is the payload"}])
    try:
        if tenant is None:
            raise NotFound(file_id)
        files.get(tenant, file_id)
    except NotFound:
        raise ValidationFailed("invalid job options", [{"pointer": pointer, "message": f"no such file: {file_id}"}]) \
            from None


def call_input(row) -> dict:
    """call_model's payload arguments for a job row: its JSON payload, or its file streamed."""
    file_id = getattr(row, "payload_file_id", None)
    if not file_id:
        return {"payload": json.loads(row.request_payload)}
    f = files.get(row.tenant_id, file_id)  # NotFound: the file was deleted (the attempt fails)
    return {"payload": {}, "body": StreamBody(f.bytes, get_storage().stream(f.location))}
