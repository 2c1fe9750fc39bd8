"""Traces: a job's W3C trace context, from its submit to its model call and its deliveries (OpenTelemetry;
docs/operations.md "Traces", docs/architecture.md "Traces").

- Accepted on every submit face: the web layer hands each request's ``traceparent``/``tracestate`` to
  ``accept`` (a context variable); ``for_new_job`` (app/jobs/service.py new_submission, the one place every
  face's jobs are built) keeps it with the job (asynch_task.traceparent/tracestate, revision 0027).  With
  tracing on, the job gets a span of its own (``asynch.submit``: a child of the caller's, or a new root), and
  that span's context is what the job keeps.  Malformed headers are ignored (W3C: start a new trace).
- Carried by the row: a worker's claim reads it with the job (jobs are pulled per call slot; a doorbell
  message names a model, not a job), so every span of every attempt joins the job's trace: admission (gate,
  insert), the queue wait (its reasons as attributes), the claim, the model call (HTTP client semantic
  conventions), the storage, the terminal write, each delivery attempt.  A retry is new spans in the same trace.
- Sent: the model call and each callback or webhook carry ``traceparent`` (the call's or the attempt's own
  span with tracing on; the job's kept context, as received, with it off), so an upstream's spans (vLLM) join.
- Exported over OTLP/HTTP only when the standard environment says so (``enabled``): OTEL_SDK_DISABLED not
  true, and OTEL_TRACES_EXPORTER naming an exporter other than ``none``, or an OTLP endpoint set
  (OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).  Off (the default): no SDK is loaded,
  no span object is made, no id is generated; every hook is one cached boolean (bench/bench_tracing.py).

Invariants: tracing never fails or delays a job (every export is the SDK's batch thread's; a tracing error
is swallowed and logged once); the provider is per process (forked children build their own).
"""
from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Iterable, Iterator

from app.infra.process import PerProcess

log = logging.getLogger(__name__)

# version-traceid-parentid-flags; a later version may append fields (W3C Trace Context, level 1 section 3.2).
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_incoming: ContextVar[tuple[str, str | None] | None] = ContextVar("asynch_traceparent", default=None)
service_name = "model-asynch-api"  # the worker sets its own (workers/celery_app.py)


def valid_traceparent(value: str | None) -> str | None:
    """``value`` if it is a usable traceparent, else None."""
    m = _TRACEPARENT.match((value or "").strip())
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
        return None
    if set(m.group(2)) == {"0"} or set(m.group(3)) == {"0"}:
        return None
    return m.group(0)


def _env_enabled() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {x.strip().lower() for x in env.get("OTEL_TRACES_EXPORTER", "").split(",") if x.strip()}
    if exporters:
        return bool(exporters - {"none"})
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _provider():
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                                        or service_name}))
    names = {x.strip().lower() for x in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")} - {"none", ""}
    for name in names or {"otlp"}:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console); ignored", name)
    return provider


_on: PerProcess[list[bool]] = PerProcess(lambda: [_env_enabled()])
_sdk: PerProcess[Any] = PerProcess(lambda: (p := _provider(), p.get_tracer("model-asynch")),
                                   on_reset=lambda pt: pt[0].shutdown())


def enabled() -> bool:
    return _on.get()[0]


def reset() -> None:
    """Read the environment again (tests); the previous provider is flushed and shut down."""
    _sdk.reset()
    _on.reset()


def flush(timeout_ms: int = 5000) -> None:
    pt = _sdk.peek()
    if pt is not None:
        pt[0].force_flush(timeout_ms)


def _tracer():
    return _sdk.get()[1]


# --- contexts --------------------------------------------------------------------------------------------------

def accept(traceparent: str | None, tracestate: str | None):
    """A request's trace headers (or none: ``None``), for the jobs it submits; the token ``forget`` takes at
    the request's end (a thread serves many requests: one's context must not reach the next's jobs)."""
    tp = valid_traceparent(traceparent) if traceparent else None
    return _incoming.set((tp, (tracestate or "").strip()[:512] or None) if tp else None)


def forget(token) -> None:
    _incoming.reset(token)


def _context(traceparent: str | None, tracestate: str | None):
    """The OpenTelemetry context whose remote parent ``traceparent`` is (kept valid: valid_traceparent)."""
    from opentelemetry.context import Context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

    if not traceparent:
        return Context()
    _v, trace_id, span_id, flags = traceparent.split("-")[:4]
    state = TraceState.from_header([tracestate]) if tracestate else None
    return set_span_in_context(NonRecordingSpan(SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                                                            trace_flags=TraceFlags(int(flags, 16)),
                                                            trace_state=state)))


def _traced(row) -> bool:
    """Whether the job ``row``'s spans are made: tracing on, and its trace sampled (the SDK's parent-based
    samplers, the default, drop a child of an unsampled parent: making it would cost and record nothing)."""
    tp = getattr(row, "traceparent", None)
    return bool(tp) and enabled() and int(tp[53:55] or "0", 16) & 1 == 1


def _format(span) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def for_new_job(job_id: str, model: str, tenant: str) -> dict[str, str | None]:
    """The trace context a new job keeps: the request's (tracing off), or its own ``asynch.submit`` span's,
    a child of the request's or a new root (tracing on)."""
    got = _incoming.get()
    if not enabled():
        return {"traceparent": got[0], "tracestate": got[1]} if got else {}
    try:
        span = _tracer().start_span("asynch.submit", context=_context(*(got or (None, None))), attributes={
            "asynch.job_id": job_id, "asynch.model": model, "asynch.tenant": tenant})
        span.end()
        return {"traceparent": _format(span), "tracestate": got[1] if got else None}
    except Exception:  # never a job's failure
        log.exception("trace context not made")
        return {"traceparent": got[0], "tracestate": got[1]} if got else {}


def _ns(at: datetime | float) -> int:
    return int((at.timestamp() if isinstance(at, datetime) else at) * 1e9)


def record(name: str, row, start: datetime | float, end: datetime | float, attributes: dict | None = None,
           error: str | None = None) -> None:
    """A span of the job ``row`` (its traceparent, tracestate) over [start, end], after the fact."""
    if not _traced(row):
        return
    try:
        from opentelemetry.trace import Status, StatusCode

        span = _tracer().start_span(name, context=_context(row.traceparent, row.tracestate),
                                    attributes=_attrs(row, attributes), start_time=_ns(start))
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end))
    except Exception:
        log.exception("span %s not recorded", name)


def record_many(name: str, rows: Iterable, start: datetime | float, end: datetime | float,
                attributes=None) -> None:
    """``record`` for each row (``attributes``: a dict, or a function of the row)."""
    if not enabled():
        return
    for row in rows:
        record(name, row, start, end, attributes(row) if callable(attributes) else attributes)


def _attrs(row, extra: dict | None) -> dict:
    out = {"asynch.job_id": row.id}
    for key, col in (("asynch.model", "model_name"), ("asynch.tenant", "tenant_id"), ("asynch.attempt", "attempt")):
        if getattr(row, col, None) is not None:
            out[key] = getattr(row, col)
    return {**out, **{k: v for k, v in (extra or {}).items() if v is not None}}


class _Traced:
    """What a traced call sends (``headers``) and tells its span (``answered``); with no span, its own
    context manager (tracing off: no generator, nothing to end)."""

    def __init__(self, span=None, headers: dict | None = None) -> None:
        self.span, self.headers = span, headers or {}

    def __enter__(self) -> "_Traced":
        return self

    def __exit__(self, *_exc) -> bool:
        return False

    def answered(self, status: int) -> None:
        if self.span is not None:
            self.span.set_attribute("http.response.status_code", status)
            if status >= 400:
                from opentelemetry.trace import Status, StatusCode
                self.span.set_attribute("error.type", str(status))
                self.span.set_status(Status(StatusCode.ERROR))


def _passed_on(row) -> dict:
    tp = getattr(row, "traceparent", None)
    return ({"traceparent": tp} | ({"tracestate": row.tracestate} if getattr(row, "tracestate", None) else {})
            if tp else {})


def client_call(name: str, row, method: str, url: str, attributes: dict | None = None):
    """An outgoing HTTP request of the job ``row`` (its model call, a delivery attempt), as a context manager
    giving a ``_Traced``: a CLIENT span with the HTTP semantic conventions, and the ``traceparent`` to send
    (the span's; tracing off: the job's own, if any).  An exception ends the span in error (``error.type``:
    its ``code``, else its type)."""
    if not _traced(row):
        return _Traced(headers=_passed_on(row))
    return _client_span(name, row, method, url, attributes)


@contextmanager
def _client_span(name: str, row, method: str, url: str, attributes: dict | None) -> Iterator[_Traced]:
    from urllib.parse import urlsplit

    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parts = urlsplit(url)
    attrs = _attrs(row, {"http.request.method": method.upper(), "url.full": url, "server.address": parts.hostname,
                         "server.port": parts.port or (443 if parts.scheme == "https" else 80), **(attributes or {})})
    span = _tracer().start_span(name, context=_context(row.traceparent, row.tracestate), kind=SpanKind.CLIENT,
                                attributes=attrs)
    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(span))
    traced = _Traced(span, headers)
    try:
        yield traced
    except BaseException as exc:
        status = getattr(exc, "status", None)
        if status:
            span.set_attribute("http.response.status_code", status)
        span.set_attribute("error.type", str(getattr(exc, "code", None) or type(exc).__name__))
        span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        raise
    finally:
        span.end()


_NOTHING = _Traced()


def span(name: str, row, attributes: dict | None = None):
    """A span of the job ``row`` around a block (its storage, ...), as a context manager; an exception ends
    it in error."""
    if not _traced(row):
        return _NOTHING
    return _block_span(name, row, attributes)


@contextmanager
def _block_span(name: str, row, attributes: dict | None) -> Iterator[None]:
    from opentelemetry.trace import Status, StatusCode

    sp = _tracer().start_span(name, context=_context(row.traceparent, row.tracestate),
                              attributes=_attrs(row, attributes))
    try:
        yield
    except BaseException as exc:
        sp.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        raise
    finally:
        sp.end()
