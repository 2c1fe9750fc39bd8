"""The asyncio client (aiohttp): the blocking client's methods as coroutines.
The calls, errors, retry policy and Idempotency-Key rule are the same code
(``Api`` in model_asynch/client.py); only the transport is aiohttp."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import aiohttp

from model_asynch.client import Answer, Api, Call, Event, SSEParser, driven, stream_headers


def _coroutine(op):
    async def run(self, *a, **kw):
        return await self._drive(op(self, *a, **kw))
    return run


@driven(_coroutine)
class AsyncClient(Api):
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
