"""The asyncio client (aiohttp): the blocking client's methods as coroutines.
The calls, errors, retry policy and Idempotency-Key rule are the same code
(``Api`` in model_asynch/client.py, ``FileOperations`` in model_asynch/batches.py);
only the transport is aiohttp."""
from __future__ import annotations

import asyncio
import os
from typing import IO, Any, AsyncIterator
from urllib.parse import quote

import aiohttp

from model_asynch.batches import UPLOAD_TIMEOUT, FileOperations, prepared_upload
from model_asynch.client import Answer, Api, Call, Event, SSEParser, driven, error_for, stream_headers


def _coroutine(op):
    async def run(self, *a, **kw):
        return await self._drive(op(self, *a, **kw))
    return run


@driven(_coroutine)
class AsyncClient(FileOperations, Api):
    """``async with AsyncClient(url, key) as c: job = await c.submit(...)``."""

    def __init__(self, base_url: str, api_key: str, **kw: Any) -> None:
        super().__init__(base_url, api_key, **kw)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.auth)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _drive(self, op):
        sent = None
        try:
            while True:
                step = op.send(sent)
                sent = await (self._send(step) if isinstance(step, Call) else asyncio.sleep(step))
        except StopIteration as stop:
            return stop.value

    async def _send(self, call: Call) -> Answer | Exception:
        try:
            async with self.session.request(call.method, self.base_url + call.path, json=call.body,
                                            headers=call.headers, params=call.params,
                                            timeout=aiohttp.ClientTimeout(total=call.timeout or self.timeout)) as r:
                return Answer(r.status, r.headers, await r.read())
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            return exc

    async def _stream(self, path: str, params: dict | None, last: str | None, until_end: bool) -> AsyncIterator[Event]:
        n = 0
        while True:
            try:
                async with self.session.get(self.base_url + path, params=params, headers=stream_headers(last),
                                            timeout=aiohttp.ClientTimeout(total=None, sock_read=120)) as r:
                    if r.status >= 400:
                        n += 1
                        await asyncio.sleep(self._refused(n, Answer(r.status, r.headers, await r.read()),
                                                          request=f"GET {path}"))
                        continue
                    parser = SSEParser()
                    async for raw in r.content:
                        if (ev := parser.feed(raw.decode().rstrip("\r\n"))) is None:
                            continue
                        n, last = 0, ev.id or last
                        yield ev
                        if until_end and ev.id == "end":
                            return
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                n += 1
                await asyncio.sleep(self._pause(n, exc, True, f"GET {path}"))

    # --- file transfers (the JSON calls are FileOperations') ------------------------------

    async def upload_file(self, file: str | os.PathLike | IO[bytes], purpose: str = "batch", *,
                          filename: str | None = None, expires_after_seconds: int | None = None) -> dict:
        """Upload a file (a path or an open binary file), streamed: read a MiB at a time off the event loop."""
        with prepared_upload(file, purpose, filename, expires_after_seconds) as body:
            async def chunks():
                pieces = iter(body)
                while (chunk := await asyncio.to_thread(next, pieces, None)) is not None:
                    yield chunk
            headers = {"Content-Type": body.content_type, "Content-Length": str(len(body))}
            timeout = aiohttp.ClientTimeout(total=max(self.timeout, UPLOAD_TIMEOUT))
            async with self.session.post(self.base_url + "/v1/files", data=chunks(), headers=headers,
                                         timeout=timeout) as r:
                text = await r.text()
                if r.status >= 400:
                    raise error_for(r.status, text, r.headers.get("Retry-After"))
                return await r.json()

    async def file_content(self, file_id: str, to: str | os.PathLike | None = None) -> bytes | None:
        """The file's bytes; with ``to``, streamed into that path instead (answers None)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=UPLOAD_TIMEOUT)
        async with self.session.get(f"{self.base_url}/v1/files/{quote(file_id, safe='')}/content",
                                    timeout=timeout) as r:
            if r.status >= 400:
                raise error_for(r.status, await r.text(), r.headers.get("Retry-After"))
            if to is None:
                return await r.read()
            with open(to, "wb") as out:
                async for chunk in r.content.iter_chunked(1 << 20):
                    await asyncio.to_thread(out.write, chunk)
        return None
