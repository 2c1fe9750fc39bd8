"""Logging: one line of JSON per record, with job_id/model/tenant/attempt passed as ``extra`` or
bound for the current request/task with ``bind()`` (a context variable: requests do not mix).

Secrets never reach a log line by construction (nothing logs headers, head_msg or modelKey); as
a second line of defence anything shaped like an API key or a Bearer credential is masked.
"""
from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar, Token

_FIELDS = ("job_id", "model", "tenant", "attempt")
_ctx: ContextVar[dict] = ContextVar("asynch_log_context", default={})
_SECRET_SHAPES = [
    (re.compile(r"\b(ak_[a-z0-9]{12})_[A-Za-z0-9_-]{8,}"), r"\1_***"),
    (re.compile(r"(?i)\b(bearer)\s+[^\s\"',]+"), r"\1 ***"),
    # PostgreSQL quotes the failing statement, with psycopg2's interpolated values (payloads,
    # modelKey), in its error text (the engine hides SQLAlchemy's own: hide_parameters).
    (re.compile(r"(?m)^LINE \d+: .*$"), "LINE n: [statement hidden]"),
    # SQLAlchemy's error text carries the statement; one whose values were rendered into it (the
    # admission INSERT's mogrified rows: payloads, modelKey) would carry them too.
    (re.compile(r"(?s)\[SQL: .*?\](?=\n\[SQL parameters|\n\(Background on this error|\Z)"), "[SQL: statement hidden]"),
]


def bind(**fields) -> Token:
    """Add fields to every record logged in this context; reset() undoes it."""
    return _ctx.set({**_ctx.get(), **{k: v for k, v in fields.items() if v is not None}})


reset = _ctx.reset  # undoes a bind(), given its token


def mask_secrets(text: str) -> str:
    for pattern, repl in _SECRET_SHAPES:
        text = pattern.sub(repl, text)
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
               "logger": record.name, "msg": mask_secrets(record.getMessage())}
        bound = _ctx.get()  # formatted in the logging thread: its request's or task's fields
        for k in _FIELDS:
            v = getattr(record, k, None)
            v = bound.get(k) if v is None else v  # an ``extra`` field wins over the bound one
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


def json_handler(stream=None) -> logging.Handler:
    h = logging.StreamHandler(stream or sys.stderr)
    h.setFormatter(JsonFormatter())
    return h


_configured = False


def configure_logging(level: str = "INFO") -> None:
    global _configured
    if _configured:
        return
    root = logging.getLogger()
    root.handlers[:] = [json_handler()]
    root.setLevel(level.upper())
    _configured = True


# Celery's loggers of the two lines it writes for every task: "received" (the
# worker's consumer) and "succeeded in" (the pool process that ran it).
_CELERY_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


class _RoutineTasks(logging.Filter):
    """Celery's INFO "received" / "succeeded" lines of the named tasks, at
    DEBUG (dropped unless the logger is enabled for DEBUG); their failures and
    retries (ERROR, WARNING) and every other task's lines stay as they are."""

    def __init__(self, names) -> None:
        super().__init__()
        self.names = frozenset(names)

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)  # celery passes the line's fields as extra={"data": ...}
        if record.levelno != logging.INFO or not isinstance(data, dict) or data.get("name") not in self.names:
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_routine_tasks(names) -> None:
    """Log the named (periodic) tasks' routine lines at DEBUG: beat sends one
    every few seconds, and their ~150 lines a minute buried everything else
    (the dev stack's banner with its admin key).  A pass that did something
    says so itself (app/maintenance/periodic.py run_periodic)."""
    for name in _CELERY_TASK_LOGGERS:
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if not isinstance(f, _RoutineTasks)]
        logger.addFilter(_RoutineTasks(names))
