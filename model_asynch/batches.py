"""Files and batches (OpenAI's Files and Batch APIs on model-asynch) for the blocking client.

``Client`` has these methods (a mixin); each answers the server's JSON (OpenAI's file and batch objects) as a
dict, and raises the client's ``AsynchError`` subclasses after its retries, as every other method does.  An
upload streams its file (a multipart body with a Content-Length, read as it is sent): a 1 GB file is never
in memory."""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import IO, Any, Iterator
from urllib.parse import quote

FINAL = ("completed", "failed", "expired", "cancelled")


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


class FilesAndBatches:
    """The mixin (needs the client's ``session``, ``base_url``, ``timeout`` and ``_drive``/``_answer``)."""

    def _json(self, method: str, path: str, body: Any = None, params: dict | None = None,
              safe: bool = True) -> dict:
        from model_asynch.client import Call

        def op():
            answer = yield from self._answer(Call(method, path, body, params=params, safe=safe))
            return json.loads(answer.content)
        return self._drive(op())

    # --- files ---------------------------------------------------------------------------

    def upload_file(self, file: str | os.PathLike | IO[bytes], purpose: str = "batch", *,
                    filename: str | None = None, expires_after_seconds: int | None = None) -> dict:
        """Upload a file (a path or an open binary file), streamed; the file object (``id``: file-...)."""
        from model_asynch.client import error_for

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
            body = MultipartBody(fields, "file", name, f, size)
            r = self.session.post(self.base_url + "/v1/files", data=body, timeout=max(self.timeout, 600),
                                  headers={"Content-Type": body.content_type, "Content-Length": str(len(body))})
        finally:
            if own:
                f.close()
        if r.status_code >= 400:
            raise error_for(r.status_code, r.text, r.headers.get("Retry-After"))
        return r.json()

    def file(self, file_id: str) -> dict:
        return self._json("GET", f"/v1/files/{quote(file_id, safe='')}")

    def files(self, purpose: str | None = None, limit: int = 100, after: str | None = None) -> dict:
        params = {k: v for k, v in {"purpose": purpose, "limit": str(limit), "after": after}.items() if v}
        return self._json("GET", "/v1/files", params=params)

    def delete_file(self, file_id: str) -> dict:
        return self._json("DELETE", f"/v1/files/{quote(file_id, safe='')}")

    def file_content(self, file_id: str, to: str | os.PathLike | None = None) -> bytes | None:
        """The file's bytes; with ``to``, streamed into that path instead (answers None)."""
        from model_asynch.client import error_for

        with self.session.get(f"{self.base_url}/v1/files/{quote(file_id, safe='')}/content", stream=True,
                              timeout=(self.timeout, 600)) as r:
            if r.status_code >= 400:
                raise error_for(r.status_code, r.text, r.headers.get("Retry-After"))
            if to is None:
                return r.content
            with open(to, "wb") as out:
                for chunk in r.iter_content(1 << 20):
                    out.write(chunk)
        return None

    # --- batches -------------------------------------------------------------------------

    def create_batch(self, input_file_id: str, endpoint: str = "/v1/chat/completions",
                     completion_window: str = "24h", metadata: dict | None = None) -> dict:
        """A batch over an uploaded JSONL file (purpose batch).  A window the queue cannot meet is RateLimited
        (429 deadline_unmeetable, the estimate in ``errors``' body) at once: not retried, nothing was created."""
        from model_asynch.client import error_for

        body = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": completion_window,
                **({"metadata": metadata} if metadata else {})}
        r = self.session.post(self.base_url + "/v1/batches", json=body, timeout=max(self.timeout, 300))
        if r.status_code >= 400:
            raise error_for(r.status_code, r.text, r.headers.get("Retry-After"))
        return r.json()

    def get_batch(self, batch_id: str) -> dict:
        return self._json("GET", f"/v1/batches/{quote(batch_id, safe='')}")

    def list_batches(self, limit: int = 20, after: str | None = None) -> dict:
        return self._json("GET", "/v1/batches", params={"limit": str(limit), **({"after": after} if after else {})})

    def cancel_batch(self, batch_id: str) -> dict:
        return self._json("POST", f"/v1/batches/{quote(batch_id, safe='')}/cancel")

    def wait_batch(self, batch_id: str, timeout: float | None = None, poll: float = 2.0) -> dict:
        """Poll until the batch ends (completed, failed, expired, cancelled) or ``timeout`` seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = self.get_batch(batch_id)
            if b["status"] in FINAL or (deadline is not None and time.monotonic() >= deadline):
                return b
            time.sleep(poll)
