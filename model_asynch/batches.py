"""Files and batches (OpenAI's Files and Batch APIs on model-asynch) for both clients.

``Client`` and ``AsyncClient`` have these methods; each answers the server's JSON (OpenAI's file and batch
objects) as a dict, and raises the client's ``AsynchError`` subclasses after its retries, as every other method
does.  The JSON calls are written once (``FileOperations``: generators of ``Call``s, as ``Api``'s are), so the two
clients never differ in paths, bodies or retries; only the transfers of file bytes are each transport's own
(``BlockingTransfers`` here, the asyncio ones in model_asynch/aio.py), over one ``prepared_upload``.  An upload
streams its file (a multipart body with a Content-Length, read as it is sent) and a download can go straight to
a path: a 1 GB file is never in memory."""
from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from typing import IO, Any, Iterator
from urllib.parse import quote

from model_asynch.client import RETRY_STATUSES, Call, error_for

FINAL = ("completed", "failed", "expired", "cancelled")
FILE_OPERATIONS = ("file", "files", "delete_file", "create_batch", "get_batch", "list_batches", "cancel_batch",
                   "wait_batch")
UPLOAD_TIMEOUT = 600.0  # at least this long for one upload or download (a large file over a slow link)


class MultipartBody:
    """A multipart/form-data body over an open file: ``read`` gives it piece by piece, ``len`` its size."""

    def __init__(self, fields: dict[str, str], name: str, filename: str, f: IO[bytes], size: int) -> None:
        self.boundary = uuid.uuid4().hex
        b = self.boundary
        head = "".join(f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items())
        safe = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
        head += (f'--{b}\r\nContent-Disposition: form-data; name="{name}"; filename="{safe}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n")
        self.parts: list = [head.encode(), f, f"\r\n--{b}--\r\n".encode()]
        self.size = len(self.parts[0]) + size + len(self.parts[2])
        self.content_type = f"multipart/form-data; boundary={b}"

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        yield self.parts[0]
        while chunk := self.parts[1].read(1 << 20):
            yield chunk
        yield self.parts[2]


@contextlib.contextmanager
def prepared_upload(file: str | os.PathLike | IO[bytes], purpose: str, filename: str | None,
                    expires_after_seconds: int | None) -> Iterator[MultipartBody]:
    """The multipart body of an upload over ``file`` (a path, opened and closed here, or an open binary file,
    sent from where it stands)."""
    own = not hasattr(file, "read")
    f = open(file, "rb") if own else file
    try:
        name = filename or os.path.basename(str(file if own else getattr(f, "name", "upload")))
        start = f.tell()
        size = f.seek(0, os.SEEK_END) - start
        f.seek(start)
        fields = {"purpose": purpose}
        if expires_after_seconds is not None:
            fields.update({"expires_after[anchor]": "created_at",
                           "expires_after[seconds]": str(int(expires_after_seconds))})
        yield MultipartBody(fields, "file", name, f, size)
    finally:
        if own:
            f.close()


def _json(api: Any, method: str, path: str, body: Any = None, params: dict | None = None, safe: bool = True,
          retry_statuses: frozenset = RETRY_STATUSES, timeout: float | None = None):
    answer = yield from api._answer(Call(method, path, body, params=params, safe=safe, timeout=timeout,
                                         retry_statuses=retry_statuses))
    return json.loads(answer.content)


class FileOperations:
    """The JSON calls, as generators each client drives (``driven`` in model_asynch/client.py)."""

    def file(self, file_id: str) -> dict:
        return (yield from _json(self, "GET", f"/v1/files/{quote(file_id, safe='')}"))

    def files(self, purpose: str | None = None, limit: int = 100, after: str | None = None) -> dict:
        params = {k: v for k, v in {"purpose": purpose, "limit": str(limit), "after": after}.items() if v}
        return (yield from _json(self, "GET", "/v1/files", params=params))

    def delete_file(self, file_id: str) -> dict:
        return (yield from _json(self, "DELETE", f"/v1/files/{quote(file_id, safe='')}"))

    def create_batch(self, input_file_id: str, endpoint: str = "/v1/chat/completions",
                     completion_window: str = "24h", metadata: dict | None = None) -> dict:
        """A batch over an uploaded JSONL file (purpose batch).  A window the queue cannot meet is RateLimited
        (429 deadline_unmeetable, the estimate in ``errors``' body) at once: not retried, nothing was created.
        A 503 (nothing was done) is retried; a lost answer is not (a second batch could be made)."""
        body = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": completion_window,
                **({"metadata": metadata} if metadata else {})}
        return (yield from _json(self, "POST", "/v1/batches", body, safe=False, retry_statuses=frozenset({503}),
                                 timeout=max(self.timeout, 300)))

    def get_batch(self, batch_id: str) -> dict:
        return (yield from _json(self, "GET", f"/v1/batches/{quote(batch_id, safe='')}"))

    def list_batches(self, limit: int = 20, after: str | None = None) -> dict:
        params = {"limit": str(limit), **({"after": after} if after else {})}
        return (yield from _json(self, "GET", "/v1/batches", params=params))

    def cancel_batch(self, batch_id: str) -> dict:
        return (yield from _json(self, "POST", f"/v1/batches/{quote(batch_id, safe='')}/cancel", safe=False))

    def wait_batch(self, batch_id: str, timeout: float | None = None, poll: float = 2.0) -> dict:
        """Poll until the batch ends (completed, failed, expired, cancelled) or ``timeout`` seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = yield from FileOperations.get_batch(self, batch_id)
            if b["status"] in FINAL or (deadline is not None and time.monotonic() >= deadline):
                return b
            yield poll


class BlockingTransfers:
    """The blocking client's file transfers (requests: its ``session``)."""

    def upload_file(self, file: str | os.PathLike | IO[bytes], purpose: str = "batch", *,
                    filename: str | None = None, expires_after_seconds: int | None = None) -> dict:
        """Upload a file (a path or an open binary file), streamed; the file object (``id``: file-...)."""
        with prepared_upload(file, purpose, filename, expires_after_seconds) as body:
            r = self.session.post(self.base_url + "/v1/files", data=body, timeout=max(self.timeout, UPLOAD_TIMEOUT),
                                  headers={"Content-Type": body.content_type, "Content-Length": str(len(body))})
        if r.status_code >= 400:
            raise error_for(r.status_code, r.text, r.headers.get("Retry-After"))
        return r.json()

    def file_content(self, file_id: str, to: str | os.PathLike | None = None) -> bytes | None:
        """The file's bytes; with ``to``, streamed into that path instead (answers None)."""
        with self.session.get(f"{self.base_url}/v1/files/{quote(file_id, safe='')}/content", stream=True,
                              timeout=(self.timeout, UPLOAD_TIMEOUT)) as r:
            if r.status_code >= 400:
                raise error_for(r.status_code, r.text, r.headers.get("Retry-After"))
            if to is None:
                return r.content
            with open(to, "wb") as out:
                for chunk in r.iter_content(1 << 20):
                    out.write(chunk)
        return None
