"""The asyncio client (aiohttp): the blocking client's methods as coroutines,
with the same errors, retry policy and Idempotency-Key rule
(model_asynch/client.py)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Iterable

import aiohttp

from model_asynch.client import (
    RETRY_STATUSES,
    Backoff,
    BatchResult,
    Event,
    Job,
    Result,
    SSEParser,
    batch_body,
    error_for,
    q,
    submit_headers,
)


class AsyncClient:
    """``async with AsyncClient(url, key) as c: job = await c.submit(...)``."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 0.5, max_backoff: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = Backoff(backoff, max_backoff)
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _request(self, method: str, path: str, *, json_body: Any = None, headers: dict | None = None,
                       params: dict | None = None, timeout: float | None = None, safe: bool = True,
                       result_call: bool = False) -> tuple[int, dict, bytes]:
        n = 0
        while True:
            try:
                async with self.session.request(method, self.base_url + path, json=json_body, headers=headers,
                                                params=params,
                                                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as r:
                    body = await r.read()
                    status, hdrs = r.status, dict(r.headers)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                n += 1
                if not safe or n > self.retries:
                    raise
                await asyncio.sleep(self.backoff.delay(n, None))
                continue
            if status < 400:
                return status, hdrs, body
            err = error_for(status, body.decode(errors="replace"), hdrs.get("Retry-After"), result_call)
            n += 1
            if status in RETRY_STATUSES and n <= self.retries:
                await asyncio.sleep(self.backoff.delay(n, err.retry_after))
                continue
            raise err

    async def _json(self, *a, **kw) -> tuple[dict, dict]:
        _s, hdrs, body = await self._request(*a, **kw)
        import json

        return json.loads(body), hdrs

    async def submit(self, model: str, payload: dict, *, idempotency_key: str | None = None,
                     priority: int | None = None, wait: int | None = None, biz_name: str | None = None,
                     callback_url: str | None = None, model_key: str | None = None) -> Job:
        headers = submit_headers(idempotency_key, priority, wait, biz_name, callback_url, model_key)
        body, hdrs = await self._json("POST", f"/v1/models/{q(model)}/jobs", json_body=payload, headers=headers,
                                      timeout=self.timeout + (wait or 0))
        return Job.of(body, model, replayed=hdrs.get("Idempotent-Replayed") == "true")

    async def get(self, model: str, job_id: str) -> Job:
        return Job.of((await self._json("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}"))[0], model)

    async def job(self, job_id: str) -> Job:
        return Job.of((await self._json("GET", f"/v1/jobs/{q(job_id)}"))[0])

    async def wait(self, model: str, job_id: str, timeout: float | None = None, poll_ms: int = 30000) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll_ms if deadline is None else max(1, min(poll_ms, int((deadline - time.monotonic()) * 1000)))
            body, _h = await self._json("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}/wait",
                                        params={"timeout": str(left)}, timeout=self.timeout + left / 1000)
            job = Job.of(body, model)
            if job.finished or (deadline is not None and time.monotonic() >= deadline):
                return job

    async def result(self, model: str, job_id: str) -> Result:
        _s, hdrs, body = await self._request("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}/result",
                                             result_call=True)
        return Result(body, hdrs.get("Content-Type", "application/octet-stream"))

    async def run(self, model: str, payload: dict, *, timeout: float | None = None, **kw: Any) -> Job:
        job = await self.submit(model, payload, wait=int(min(timeout or 60, 60)), **kw)
        return job if job.finished else await self.wait(model, job.job_id, timeout)

    async def cancel(self, model: str, job_id: str) -> Job:
        return Job.of((await self._json("POST", f"/v1/models/{q(model)}/jobs/{q(job_id)}/cancel", safe=False))[0],
                      model)

    async def batch(self, model: str, jobs: Iterable[dict]) -> BatchResult:
        body = batch_body(jobs)
        safe = all(j.get("idempotency_key") for j in body["jobs"])
        return BatchResult.of((await self._json("POST", f"/v1/models/{q(model)}/jobs:batch", json_body=body,
                                                safe=safe))[0], model)

    async def events(self, model: str, job_id: str, last_event_id: str | None = None) -> AsyncIterator[Event]:
        async for ev in self._stream(f"/v1/models/{q(model)}/jobs/{q(job_id)}/events", None, last_event_id, True):
            yield ev

    async def tenant_events(self, model: str | None = None, last_event_id: str | None = None) -> AsyncIterator[Event]:
        async for ev in self._stream("/v1/events", {"model": model} if model else None, last_event_id, False):
            yield ev

    async def _stream(self, path: str, params, last: str | None, until_end: bool) -> AsyncIterator[Event]:
        n = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = last
            try:
                async with self.session.get(self.base_url + path, params=params, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=None, sock_read=120)) as r:
                    if r.status >= 400:
                        err = error_for(r.status, (await r.read()).decode(errors="replace"),
                                        r.headers.get("Retry-After"))
                        n += 1
                        if r.status in RETRY_STATUSES and n <= self.retries:
                            await asyncio.sleep(self.backoff.delay(n, err.retry_after))
                            continue
                        raise err
                    parser = SSEParser()
                    async for raw in r.content:
                        ev = parser.feed(raw.decode().rstrip("\r\n"))
                        if ev is None:
                            continue
                        n = 0
                        last = ev.id or last
                        yield ev
                        if until_end and ev.id == "end":
                            return
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError):
                n += 1
                if n > self.retries:
                    raise
                await asyncio.sleep(self.backoff.delay(n, None))
