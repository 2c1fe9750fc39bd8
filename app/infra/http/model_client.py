"""Calls a configured model service exactly as its row says: base_url+route,
GET with the payload as query parameters or POST with it as JSON, head_msg
headers merged with the job's modelKey, timeout_seconds for the whole call,
and a cap on the response size."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

import requests

from app.infra.http.headers import merge_headers, parse_header_spec


class ModelCallError(Exception):
    """The call failed.  ``permanent`` errors are not retried; ``called`` says
    whether the request reached the model service (it counts in the stats)."""

    def __init__(self, message: str, *, permanent: bool, called: bool):
        super().__init__(message)
        self.permanent = permanent
        self.called = called


@dataclass(frozen=True)
class ModelResponse:
    body: bytes
    content_type: str
    status: int


_local = threading.local()


def _session() -> requests.Session:
    # One session (and connection pool) per thread per process.
    s = getattr(_local, "session", None)
    if s is None or getattr(_local, "pid", None) != os.getpid():
        s = requests.Session()
        s.trust_env = False  # no proxy surprises from the environment
        _local.session, _local.pid = s, os.getpid()
    return s


def model_url(base_url: str, route: str) -> str:
    if not route:
        return base_url
    return base_url.rstrip("/") + "/" + route.lstrip("/")


def query_params(payload: dict) -> dict[str, str]:
    out = {}
    for k, v in payload.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v, separators=(",", ":"), ensure_ascii=False)
        else:
            out[k] = str(v)
    return out


def call_model(*, base_url: str, route: str, http_method: str, head_msg: str, model_key: str | None,
               payload: dict, timeout_seconds: float, max_bytes: int) -> ModelResponse:
    headers = merge_headers(parse_header_spec(head_msg), parse_header_spec(model_key))
    url = model_url(base_url, route)
    deadline = time.monotonic() + timeout_seconds
    kw: dict = {"headers": headers, "timeout": (min(10.0, timeout_seconds), timeout_seconds),
                "stream": True, "allow_redirects": False}
    if http_method.upper() == "GET":
        kw["params"] = query_params(payload)
    else:
        kw["json"] = payload
    try:
        resp = _session().request(http_method.upper(), url, **kw)
    except requests.Timeout as exc:
        # A read timeout reached the model (it counts); a connect timeout did not.
        raise ModelCallError(f"model call timed out after {timeout_seconds}s", permanent=False,
                             called=isinstance(exc, requests.ReadTimeout)) from exc
    except requests.ConnectionError as exc:
        raise ModelCallError(f"model unreachable: {type(exc).__name__}", permanent=False, called=False) from exc
    except requests.RequestException as exc:
        raise ModelCallError(f"model call failed: {exc}", permanent=True, called=False) from exc
    with resp:
        try:
            chunks, size = [], 0
            for chunk in resp.iter_content(64 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    raise ModelCallError(f"model response exceeds {max_bytes} bytes", permanent=True, called=True)
                if time.monotonic() > deadline:
                    raise ModelCallError(f"model call timed out after {timeout_seconds}s", permanent=False,
                                         called=True)
                chunks.append(chunk)
        except requests.RequestException as exc:
            raise ModelCallError(f"model response broken: {type(exc).__name__}", permanent=False,
                                 called=True) from exc
        body = b"".join(chunks)
        if resp.status_code >= 300:
            snippet = body[:200].decode("utf-8", "replace")
            # 5xx, 408 and 429 may pass; other 3xx/4xx will fail the same way again.
            transient = resp.status_code >= 500 or resp.status_code in (408, 429)
            raise ModelCallError(f"model returned HTTP {resp.status_code}: {snippet}",
                                 permanent=not transient, called=True)
        ctype = resp.headers.get("Content-Type") or "application/octet-stream"
        return ModelResponse(body=body, content_type=ctype, status=resp.status_code)
