"""Job states: the nine state codes (docs/architecture.md, "Job states") and how each face shows them."""
from __future__ import annotations

from enum import IntEnum


class JobState(IntEnum):
    PENDING = 0      # admitted, holds a gate slot, waiting for a worker
    RUNNING = 1      # an attempt is calling the model / uploading
    DONE = 2         # result stored
    FAILED = 3       # retries exhausted or permanent error (terminal)
    CLAIMED = 4      # done and batch-claimed; expires after auto_clean_seconds
    TIMEOUT = 5      # job budget exceeded (terminal)
    CANCELED = 6     # canceled by the client (terminal)
    RETRY_WAIT = 7   # an attempt failed, retries remain; slot released
    EXPIRED = 8      # still pending when its caller's deadline passed; never run (terminal)

    @property
    def label(self) -> str:
        return self.name.lower()


# States that hold a gate slot.  Leaving this set releases the slot.
SLOT_STATES = frozenset({JobState.PENDING, JobState.RUNNING})
# Absorbing states (CLAIMED is DONE seen by the business side).
TERMINAL_STATES = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.CLAIMED, JobState.TIMEOUT, JobState.CANCELED, JobState.EXPIRED}
)
# The states a result is read in.
RESULT_STATES = (JobState.DONE, JobState.CLAIMED)
# States that still have work ahead of them.
ACTIVE_STATES = frozenset({JobState.PENDING, JobState.RUNNING, JobState.RETRY_WAIT})

# A job's ``error`` as its tenant sees it: "<code>: <short message>".  The
# codes are stable (docs/api.md, "Job error codes"); the message never holds
# internals (storage exceptions, endpoints, paths, the model's error body):
# those go to the logs and to ``asynch_task.error_detail``, which only admin
# views show.
JOB_ERROR_CODES = frozenset({
    "model_timeout", "model_unreachable", "model_http_error", "model_response_too_large",
    "model_response_broken", "model_request_invalid", "model_not_configured", "storage_error",
    "internal_error", "worker_lost", "job_timeout", "canceled", "deadline_expired", "model_busy",
})


def job_error(code: str, message: str) -> str:
    assert code in JOB_ERROR_CODES, code
    return f"{code}: {message}"

# The v1 face (seed 000 wire contract): a caller sees pending until a worker
# is on it, and done for a claimed job.
_V1_NAMES = {s: s.label for s in JobState} | {JobState.CLAIMED: "done", JobState.RETRY_WAIT: "pending"}

# The seed-002 face: 0 queued, 1 running, 2 done, 3 failed (and every other end), 4 claimed.
_SEED_CODES = {s: 3 for s in JobState} | {JobState.PENDING: 0, JobState.RUNNING: 1, JobState.DONE: 2,
                                          JobState.CLAIMED: 4}


def v1_name(state: int) -> str:
    return _V1_NAMES[JobState(state)]


def seed_code(state: int) -> int:
    return _SEED_CODES[JobState(state)]


def is_terminal(state: int) -> bool:
    return JobState(state) in TERMINAL_STATES


def parse_v1_filter(name: str) -> list[JobState]:
    """Internal states a v1 state name covers (for list filters; the query's V1State admits only names)."""
    return [s for s, n in _V1_NAMES.items() if n == name]
