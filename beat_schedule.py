"""Celery beat's schedule; intervals come from app.config."""
from __future__ import annotations

from app.config import Settings


def build_schedule(s: Settings) -> dict:
    return {
        "retry-due": {"task": "asynch.retry_due", "schedule": s.beat_retry_seconds},
        "recover": {"task": "asynch.recover", "schedule": s.beat_recover_seconds},
        "deliver-callbacks": {"task": "asynch.deliver_due_callbacks", "schedule": s.beat_callbacks_seconds},
    }
