"""Calls a configured model service exactly as its row says: base_url+route, GET with the payload as query parameters
or POST with it as JSON, head_msg merged with the job's modelKey headers (headers.py), a cap on the response size,
connections kept alive per thread and process, and ``timeout_seconds`` as a hard deadline for the whole call
(deadline.py).

Errors (ModelCallError): ``code`` and ``public`` are what the tenant sees (no model body, addresses or exception
text); ``str(exc)`` is for logs and admins.  ``permanent`` ones are not retried (other 3xx/4xx, an oversize answer,
a request we cannot send); 5xx, 408, 429, timeouts and network failures are.  ``called``: a byte reached the model
(only those count in the stats).  A 429 or 503 is also ``busy``, with its Retry-After in seconds.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from app.infra.http import deadline
from app.infra.http.headers import ATTEMPT_HEADER, JOB_HEADER, HeaderSpecError, job_headers, merge_headers

USER_AGENT = "model-asynch/1"


class ModelCallError(Exception):
    def __init__(self, message: str, *, permanent: bool, called: bool, code: str = "model_request_invalid",
                 public: str | None = None, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.permanent, self.called, self.code = permanent, called, code
        self.public = public if public is not None else message
        self.status = status            # the model's HTTP status, if it answered
        self.retry_after = retry_after  # its Retry-After, in seconds from now

    @property
    def stopped(self) -> bool:
        """Our side ended the call (its job was canceled, timed out or recovered): no answer, no failure."""
        return self.code == "model_call_stopped"

    @property
    def busy(self) -> bool:
        """The upstream is full (429 Too Many Requests, 503 Service Unavailable), not failing."""
        return self.status in (429, 503)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After (RFC 9110: seconds or an HTTP date) as seconds from ``now``; None if absent or unusable
    (garbage, negative, NaN, infinite).  A date in the past is 0; a far one is returned as it is (the caller
    caps it: app/infra/redis/upstream.py capped)."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        seconds = float(value)  # delay-seconds; a decimal is read too
    except ValueError:
        seconds = None
    if seconds is not None:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if at is None or at.tzinfo is None:
        return None
    return max(0.0, at.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class ModelResponse:
    body: bytes
    content_type: str
    status: int


def model_url(model) -> str:
    """The URL a model's calls go to: base_url + route."""
    return model.base_url.rstrip("/") + "/" + model.route.lstrip("/") if model.route else model.base_url


def call_model(*, base_url: str, route: str, http_method: str, head_msg: str, model_key: str | None,
               payload: dict, timeout_seconds: float, max_bytes: int,
               job: tuple[str, int] | None = None, model_key_headers: str = "",
               abort: deadline.Abort | None = None, body: deadline.StreamBody | None = None,
               stream=None, trace_headers: dict | None = None) -> ModelResponse:
    """``job``: (job id, attempt), sent as X-Asynch-Job-Id / X-Asynch-Attempt so a model (or a proxy) can
    deduplicate: an attempt calls it at most once. ``model_key_headers``: the names ``model_key`` may set.
    ``abort``: ends the call from another thread (app/jobs/calls.py): ModelCallError ``stopped``.  ``stream``:
    (content type) -> a sink for the pieces of a 2xx answer's body as they arrive, or None (app/jobs/output.py).
    ``trace_headers``: the W3C trace context to send (app/infra/tracing.py), over any head_msg sets."""
    try:
        configured = job_headers(head_msg, model_key, model_key_headers)
    except HeaderSpecError as exc:
        raise ModelCallError(f"model call not sent: {exc}", permanent=True, called=False,
                             public="model call not sent: a header may not be sent") from exc
    # Case-insensitive merges: head_msg's "user-agent" replaces our default
    # instead of travelling beside it, and ours replace any X-Asynch-* there.
    ours = ({JOB_HEADER: job[0], ATTEMPT_HEADER: str(job[1])} if job is not None else {}) | (trace_headers or {})
    headers = merge_headers(merge_headers({"User-Agent": USER_AGENT, "Accept": "*/*"}, configured), ours)
    method = http_method.upper()
    kw: dict = {"json": payload} if method != "GET" else {"params": {  # booleans, objects and arrays as JSON
        k: json.dumps(v, separators=(",", ":"), ensure_ascii=False) if isinstance(v, (bool, dict, list)) else str(v)
        for k, v in payload.items() if v is not None}}
    if body is not None:  # a payload by reference (app/jobs/references.py): the file's bytes as the JSON body
        kw = {"body": body}
        headers = merge_headers({"Content-Type": "application/json"}, headers)
    url = base_url.rstrip("/") + "/" + route.lstrip("/") if route else base_url
    try:
        resp = deadline.request(method, url, headers=headers, timeout=timeout_seconds,
                                connect_timeout=min(10.0, timeout_seconds), max_bytes=max_bytes,
                                keep_alive=True, abort=abort, on_body=None if stream is None else (
                                    lambda hs: stream(next((v for k, v in hs if k == "content-type"), ""))), **kw)
    except deadline.Stopped as exc:
        raise ModelCallError(f"model call {exc}", permanent=False, called=exc.reached, code="model_call_stopped",
                             public="model call stopped") from exc
    except deadline.RequestError as exc:  # ``reached``: False for ConnectFailed and InvalidRequest
        message, permanent, code, public = {
            deadline.DeadlineExceeded: (f"model call timed out after {timeout_seconds}s", False, "model_timeout", None),
            deadline.ConnectFailed: (f"model unreachable: {exc}", False, "model_unreachable", "model unreachable"),
            deadline.ResponseTooLarge: (f"model response exceeds {max_bytes} bytes", True,
                                        "model_response_too_large", None),
            deadline.InvalidRequest: (f"model call failed: {exc}", True, "model_request_invalid",
                                      "model call could not be sent"),
        }.get(type(exc), (f"model response broken: {exc}", False, "model_response_broken",  # reset, closed, not HTTP
                          "model response broken"))
        raise ModelCallError(message, permanent=permanent, called=exc.reached, code=code, public=public) from exc
    except (TypeError, ValueError) as exc:  # a payload JSON cannot carry (NaN)
        raise ModelCallError(f"model call failed: {exc}", permanent=True, called=False,
                             public="model call could not be sent (payload not encodable)") from exc
    if resp.status >= 300:
        snippet = resp.body[:200].decode("utf-8", "replace")
        # 5xx, 408 and 429 may pass; other 3xx/4xx will fail the same way again.
        transient = resp.status >= 500 or resp.status in (408, 429)
        raise ModelCallError(f"model returned HTTP {resp.status}: {snippet}", permanent=not transient, called=True,
                             code="model_http_error", public=f"model returned HTTP {resp.status}",
                             status=resp.status, retry_after=retry_after_seconds(resp.header("Retry-After")))
    return ModelResponse(resp.body, resp.header("Content-Type") or "application/octet-stream", resp.status)
