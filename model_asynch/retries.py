"""What a retry waits for: the notice both clients hand ``on_retry`` (or log)
before they sleep, so a caller is never kept waiting without a word.

Invariants: one notice per sleep, sent before it; ``delay`` is the sleep
itself (the server's Retry-After capped at ``max_backoff``, or the backoff);
the default is one INFO line on the ``model_asynch`` logger.  HTTP only:
nothing here imports the server package.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import unquote

log = logging.getLogger("model_asynch")
_MODEL = re.compile(r"^/v1/models/([^/]+)/")


@dataclass(frozen=True)
class Retrying:
    """A retry about to wait: ``request`` ("POST /v1/models/demo-echo/jobs"), ``attempt`` (this retry's
    number, from 1), ``delay`` (the seconds it sleeps), ``error`` (the ``AsynchError`` answer -- 429,
    503 -- or the connection failure), ``retry_after`` (the server's Retry-After in seconds, or None)."""

    request: str
    attempt: int
    delay: float
    error: Exception
    retry_after: float | None = None

    @property
    def model(self) -> str | None:
        """The model the request is about (its path's ``/v1/models/{model}/``), if any."""
        m = _MODEL.match(self.request.partition(" ")[2])
        return unquote(m.group(1)) if m else None

    @property
    def queue_full(self) -> bool:
        """A 429 from the model's queue (``async queue full``, ``tenant queue share full``)."""
        message = getattr(self.error, "message", "")
        return getattr(self.error, "status", 0) == 429 and ("queue full" in message or "queue share full" in message)

    @property
    def reason(self) -> str:
        """What it waits for, in words: ``queue full for demo-echo``, the API's error text, or the failure."""
        if self.queue_full:
            return f"queue full for {self.model}" if self.model else "queue full"
        status = getattr(self.error, "status", None)
        if status is not None:
            return f"{self.error.message} (HTTP {status})"
        return f"connection failed ({type(self.error).__name__})"

    def __str__(self) -> str:
        why = "Retry-After" if self.retry_after is not None else "backoff"
        if self.retry_after is not None and self.delay < self.retry_after:
            why += f" {self.retry_after:g} s, capped"
        return f"{self.reason}, retrying in {self.delay:.3g} s ({why})"


def log_retry(notice: Retrying) -> None:
    """The default ``on_retry``: one INFO line (``logging.basicConfig(level=logging.INFO)`` shows it)."""
    log.info("%s: %s", notice.request, notice)
