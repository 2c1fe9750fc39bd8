"""The blocking client, and what both clients share: the typed errors, the
job/result/event shapes, the calls, the retry policy and the event-stream parser.

Invariants:
- Every error answer becomes the ``AsynchError`` subclass of its status,
  carrying the API's own error text (``message``), its 422 pointers
  (``errors``) and ``Retry-After`` (``retry_after``).
- Retries: 429 and 503 answers, and connection failures, are retried up to
  ``retries`` times, waiting ``Retry-After`` when the server sent it, else an
  exponential backoff with jitter (capped at ``max_backoff``).  A submit is
  only ever retried with an Idempotency-Key (one is made when the caller gave
  none), so a retry after a lost answer returns the first job instead of
  admitting a second one.  Other non-idempotent calls (cancel) are retried
  only on answers the server gave (429/503: nothing was done).  Every wait
  is told first: ``on_retry`` gets a ``Retrying`` notice
  (model_asynch/retries.py; default: an INFO log line).
- Each call is written once (``Api``), as a generator of requests that the
  blocking and the asyncio client (model_asynch/aio.py) drive with their
  own transport: the two never differ in headers, bodies or retries.
- Nothing here imports the server package: HTTP only.
"""
from __future__ import annotations

import functools
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple
from urllib.parse import quote

import requests

from model_asynch.retries import Retrying, log_retry
from model_asynch.sse import Event, SSEParser, lines_of, stream_headers  # noqa: F401 (the clients' streams)

__all__ = ["AsynchError", "BadRequest", "BatchItem", "BatchResult", "Client", "Conflict", "Event", "Forbidden", "Gone",
           "Job", "NotFinished", "NotFound", "PayloadTooLarge", "RateLimited", "Result", "Retrying", "ServerError",
           "Unauthorized", "Unavailable", "ValidationError"]
TERMINAL = frozenset({"done", "failed", "timeout", "canceled", "expired"})
RETRY_STATUSES = frozenset({429, 503})


class AsynchError(Exception):
    """An error answer of the API: ``status``, ``message`` (the API's error
    text), ``errors`` (422 pointers), ``retry_after`` (seconds or None)."""

    status = 0

    def __init__(self, status: int, message: str, errors: list | None = None, retry_after: float | None = None,
                 body: Any = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.errors = errors or []
        self.retry_after = retry_after
        self.body = body


class BadRequest(AsynchError): pass            # noqa: E701 - 400
class Unauthorized(AsynchError): pass          # noqa: E701 - 401
class Forbidden(AsynchError): pass             # noqa: E701 - 403
class NotFound(AsynchError): pass              # noqa: E701 - 404
class Conflict(AsynchError): pass              # noqa: E701 - 409
class NotFinished(Conflict): pass              # noqa: E701 - 409 on /result: the job has not finished
class Gone(AsynchError): pass                  # noqa: E701 - 410
class PayloadTooLarge(AsynchError): pass       # noqa: E701 - 413
class ValidationError(AsynchError): pass       # noqa: E701 - 422
class RateLimited(AsynchError): pass           # noqa: E701 - 429 (queue full, rate limit, waiter caps)
class Unavailable(AsynchError): pass           # noqa: E701 - 503
class ServerError(AsynchError): pass           # noqa: E701 - other 5xx


_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
              413: PayloadTooLarge, 422: ValidationError, 429: RateLimited, 503: Unavailable}


def error_for(status: int, text: str, retry_after: str | None, result_call: bool = False) -> AsynchError:
    """The typed error of an error answer (its body is the API's JSON error)."""
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {"error": text}
    try:
        seconds = max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        seconds = None
    if not isinstance(body, dict):
        body = {"error": str(body)}
    message = str(body.get("error") or body.get("message") or f"HTTP {status}")
    cls = NotFinished if (status == 409 and result_call) else _BY_STATUS.get(status, ServerError if status >= 500
                                                                             else AsynchError)
    return cls(status, message, body.get("errors"), seconds, body)


@dataclass
class Job:
    """A job as the API shows it (the poll body; ``raw`` has every field)."""

    job_id: str
    state: str
    model: str | None = None
    raw: dict = field(default_factory=dict)
    result: Any = None          # sync mode: the inline JSON result, when the server sent it
    has_result: bool = False
    replayed: bool = False      # an Idempotency-Key returned an earlier job

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def error(self) -> str | None:
        return self.raw.get("error")

    @classmethod
    def of(cls, body: dict, model: str | None = None, replayed: bool = False) -> "Job":
        return cls(job_id=body["job_id"], state=body.get("state", "pending"), model=body.get("model", model),
                   raw=body, result=body.get("result"), has_result="result" in body, replayed=replayed)


@dataclass
class Result:
    content: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()


@dataclass
class BatchItem:
    """One item's answer in a batch: ``job`` when admitted (status 202), else ``error``."""

    index: int
    status: int
    job: Job | None = None
    error: AsynchError | None = None


@dataclass
class BatchResult:
    admitted: int
    refused: int
    items: list[BatchItem]

    @classmethod
    def of(cls, body: dict, model: str) -> "BatchResult":
        return cls(body["admitted"], body["refused"], [
            BatchItem(x["index"], 202, Job.of(x, model, replayed=bool(x.get("replayed")))) if x["status"] == 202
            else BatchItem(x["index"], x["status"], error=error_for(x["status"], json.dumps(x), x.get("retry_after")))
            for x in body["results"]])


q = functools.partial(quote, safe="")  # one path segment: "/" escaped too


# --- the calls, written once for both clients ------------------------------------------

@dataclass
class Call:
    """One request an operation needs; ``safe``: also retried after a
    connection failure (the server may have done it: only idempotent calls)."""

    method: str
    path: str
    body: Any = None
    headers: dict | None = None
    params: dict | None = None
    timeout: float | None = None
    safe: bool = True
    result_call: bool = False
    retry_statuses: frozenset = RETRY_STATUSES  # the error answers retried (nothing was done)


class Answer(NamedTuple):
    status: int
    headers: Any  # case-insensitive, as the transport gave them
    content: bytes


class Api:
    """The settings, the retry policy and the operations.  An operation yields
    a ``Call`` (answered with an ``Answer``, or the connection failure raised)
    or a pause in seconds, and returns the method's value.  Event streams
    (``_stream``) are each client's own."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 0.5, max_backoff: float = 30.0,
                 on_retry: Callable[[Retrying], Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.on_retry = on_retry or log_retry
        self.auth = {"Authorization": f"Bearer {api_key}"}

    def _pause(self, n: int, err: Exception, retry: bool, request: str = "") -> float:
        """The wait before retry ``n`` (1-based) after ``err`` of ``request``, told to ``on_retry`` first;
        raises ``err`` when no retry is left."""
        if not retry or n > self.retries:
            raise err
        if (retry_after := getattr(err, "retry_after", None)) is not None:
            delay = min(self.max_backoff, retry_after)
        else:
            delay = min(self.max_backoff, self.backoff * 2 ** (n - 1)) * (0.5 + random.random() / 2)
        self.on_retry(Retrying(request, n, delay, err, retry_after))
        return delay

    def _refused(self, n: int, answer: Answer, result_call: bool = False, request: str = "",
                 statuses: frozenset = RETRY_STATUSES) -> float:
        err = error_for(answer.status, answer.content.decode(errors="replace"), answer.headers.get("Retry-After"),
                        result_call)
        return self._pause(n, err, answer.status in statuses, request)

    def _answer(self, call: Call):
        """``call`` sent with the retry policy: its successful answer."""
        n = 0
        while True:
            n += 1
            got = yield call
            if isinstance(got, Exception):
                yield self._pause(n, got, call.safe, f"{call.method} {call.path}")
            elif got.status >= 400:
                yield self._refused(n, got, call.result_call, f"{call.method} {call.path}", call.retry_statuses)
            else:
                return got

    def _job(self, method: str, path: str, model: str | None = None, **kw):
        return Job.of(json.loads((yield from self._answer(Call(method, path, **kw))).content), model)

    def submit(self, model: str, payload: dict, *, idempotency_key: str | None = None, priority: int | None = None,
               wait: int | None = None, biz_name: str | None = None, callback_url: str | None = None,
               model_key: str | None = None) -> Job:
        """Admit a job (202), or with ``wait=N`` seconds, sync mode: the
        finished job (and a small JSON result in ``result``) if it ends in
        time.  Retried with one Idempotency-Key (made here when not given)."""
        headers = {"Idempotency-Key": idempotency_key or f"client-{uuid.uuid4().hex}"}
        optional = {"X-Priority": None if priority is None else str(priority),
                    "Prefer": f"wait={int(wait)}" if wait else None, "X-Biz-Name": biz_name,
                    "X-Callback-Url": callback_url, "X-Model-Key": model_key}
        headers.update((k, v) for k, v in optional.items() if v)
        answer = yield from self._answer(Call("POST", f"/v1/models/{q(model)}/jobs", payload, headers,
                                              timeout=self.timeout + (wait or 0)))
        return Job.of(json.loads(answer.content), model, replayed=answer.headers.get("Idempotent-Replayed") == "true")

    def get(self, model: str, job_id: str) -> Job:
        return (yield from self._job("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}", model))

    def job(self, job_id: str) -> Job:
        """A job by its id alone (``GET /v1/jobs/{id}``: the poll body and more, its ``model`` included)."""
        return (yield from self._job("GET", f"/v1/jobs/{q(job_id)}"))

    def wait(self, model: str, job_id: str, timeout: float | None = None, poll_ms: int = 30000) -> Job:
        """Long-poll until the job is finished or ``timeout`` seconds (None:
        no limit) have passed; returns the job as last seen."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll_ms if deadline is None else max(1, min(poll_ms, int((deadline - time.monotonic()) * 1000)))
            job = yield from self._job("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}/wait", model,
                                       params={"timeout": str(left)}, timeout=self.timeout + left / 1000)
            if job.finished or (deadline is not None and time.monotonic() >= deadline):
                return job

    def result(self, model: str, job_id: str) -> Result:
        """The stored result (NotFinished before the job is done, Gone once cleaned up)."""
        answer = yield from self._answer(Call("GET", f"/v1/models/{q(model)}/jobs/{q(job_id)}/result",
                                              result_call=True))
        return Result(answer.content, answer.headers.get("Content-Type", "application/octet-stream"))

    def run(self, model: str, payload: dict, *, timeout: float | None = None, **kw: Any) -> Job:
        """Submit and wait for the end (sync mode first, then long-polls)."""
        job = yield from Api.submit(self, model, payload, wait=int(min(timeout or 60, 60)), **kw)
        return job if job.finished else (yield from Api.wait(self, model, job.job_id, timeout))

    def cancel(self, model: str, job_id: str) -> Job:
        return (yield from self._job("POST", f"/v1/models/{q(model)}/jobs/{q(job_id)}/cancel", model, safe=False))

    def batch(self, model: str, jobs: Iterable[dict]) -> BatchResult:
        """Up to 1,000 jobs (payload dicts, or items ``{"payload": ...,
        "idempotency_key": ..., ...}``); each item is admitted or refused on
        its own.  Retried after a lost answer only when every item has an idempotency_key."""
        body = {"jobs": [j if isinstance(j, dict) and "payload" in j else {"payload": j} for j in jobs]}
        safe = all(j.get("idempotency_key") for j in body["jobs"])
        answer = yield from self._answer(Call("POST", f"/v1/models/{q(model)}/jobs:batch", body, safe=safe))
        return BatchResult.of(json.loads(answer.content), model)

    def events(self, model: str, job_id: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events until its terminal one; reconnects with
        Last-Event-ID when the connection drops, missing nothing."""
        return self._stream(f"/v1/models/{q(model)}/jobs/{q(job_id)}/events", None, last_event_id, True)

    def stream(self, model: str, job_id: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's output (docs/api.md, Streamed output): ``attempt``, ``output`` (``data``: the text as the
        model sent it), then ``done`` or ``error`` (``data``: the poll body); live while the job runs, replayed
        after; reconnects with Last-Event-ID when the connection drops, missing nothing."""
        return self._stream(f"/v1/models/{q(model)}/jobs/{q(job_id)}/stream", None, last_event_id, True)

    def tenant_events(self, model: str | None = None, last_event_id: str | None = None) -> Iterator[Event]:
        """Every change of the tenant's jobs (of ``model``), endlessly; resumes on reconnect."""
        return self._stream("/v1/events", {"model": model} if model else None, last_event_id, False)


OPERATIONS = ("submit", "get", "job", "wait", "result", "run", "cancel", "batch")


def driven(wrap):
    """A class decorator: each of ``OPERATIONS`` (and the files/batches ones, model_asynch/batches.py) as
    ``wrap`` runs it."""
    from model_asynch.batches import FILE_OPERATIONS, FileOperations

    def decorate(cls):
        for name in OPERATIONS:
            setattr(cls, name, functools.wraps(getattr(Api, name))(wrap(getattr(Api, name))))
        for name in FILE_OPERATIONS:
            op = getattr(FileOperations, name)
            setattr(cls, name, functools.wraps(op)(wrap(op)))
        return cls
    return decorate


from model_asynch.batches import BlockingTransfers, FileOperations  # noqa: E402 (files and batches)


# --- the blocking client ---------------------------------------------------------------

@driven(lambda op: lambda self, *a, **kw: self._drive(op(self, *a, **kw)))
class Client(BlockingTransfers, FileOperations, Api):
    """``Client("http://host:8000", "ak_...")``; every method raises an
    ``AsynchError`` subclass for an error answer (after its retries).  Files and batches: model_asynch/batches.py."""

    def __init__(self, base_url: str, api_key: str, *, session: requests.Session | None = None, **kw: Any) -> None:
        super().__init__(base_url, api_key, **kw)
        self.session = session or requests.Session()
        self.session.headers.update(self.auth)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drive(self, op):
        sent = None
        try:
            while True:
                step = op.send(sent)  # a pause's None is sent back, never read
                sent = self._send(step) if isinstance(step, Call) else time.sleep(step)
        except StopIteration as stop:
            return stop.value

    def _send(self, call: Call) -> Answer | Exception:
        try:
            r = self.session.request(call.method, self.base_url + call.path, json=call.body, headers=call.headers,
                                     params=call.params, timeout=call.timeout or self.timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            return exc
        return Answer(r.status_code, r.headers, r.content)

    def _stream(self, path: str, params: dict | None, last: str | None, until_end: bool) -> Iterator[Event]:
        n = 0
        while True:
            try:
                with self.session.get(self.base_url + path, params=params, headers=stream_headers(last), stream=True,
                                      timeout=(self.timeout, 120)) as resp:
                    if resp.status_code >= 400:
                        n += 1
                        time.sleep(self._refused(n, Answer(resp.status_code, resp.headers, resp.content),
                                                 request=f"GET {path}"))
                        continue
                    parser = SSEParser()
                    for ev in filter(None, map(parser.feed, lines_of(resp.iter_content(chunk_size=None)))):
                        n, last = 0, ev.id or last
                        yield ev
                        if until_end and ev.id == "end":
                            return
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                n += 1
                time.sleep(self._pause(n, exc, True, f"GET {path}"))
