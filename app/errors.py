"""Domain errors.  Raised anywhere inside; turned into HTTP once, at the edge
(app/web/errors.py), each with its status and its ``error`` text."""
from __future__ import annotations


class DomainError(Exception):
    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(DomainError):
    status = 400


class Unauthorized(DomainError):
    status = 401


class Forbidden(DomainError):
    status = 403


class NotFound(DomainError):
    status = 404


class Conflict(DomainError):
    status = 409


class Gone(DomainError):
    status = 410


class ValidationFailed(DomainError):
    """422 with a list of {"pointer", "message"}."""

    status = 422

    def __init__(self, message: str, errors: list[dict]):
        super().__init__(message)
        self.errors = errors


class Throttled(DomainError):
    """429 with a ``limit``; ``retry_after`` goes out as Retry-After."""

    status = 429

    def __init__(self, message: str, limit: int, retry_after: int):
        super().__init__(message)
        self.limit, self.retry_after = limit, retry_after


class QueueFull(Throttled):
    def __init__(self, limit: int, retry_after: int):
        super().__init__(f"async queue full (max {limit})", limit, retry_after)


class DeadlineUnmeetable(QueueFull):
    """429 deadline_unmeetable: the queue's estimate (``body``, added to the error
    body) ends after the job's deadline; nothing was written, no slot taken."""

    def __init__(self, estimate: dict, deadline_at, retry_after: int):
        Throttled.__init__(self, "deadline_unmeetable: the queue cannot finish this job by its deadline", 0,
                           retry_after)
        self.body = {"code": "deadline_unmeetable", **estimate, "deadline_at": deadline_at}


class RateLimited(DomainError):
    """429 from the request rate limit (nothing was done); ``headers``: Retry-After
    and the RateLimit fields."""

    status = 429

    def __init__(self, message: str, headers: dict[str, str]):
        super().__init__(message)
        self.headers = dict(headers)


class TenantQueueFull(QueueFull):
    """The tenant holds its share of the model's queue; other tenants are
    still admitted (docs/api.md, "Fair share")."""

    def __init__(self, tenant: str, limit: int, retry_after: int):
        Throttled.__init__(self, f"tenant queue share full: tenant {tenant} may hold at most {limit} of this "
                                 "model's queue slots", limit, retry_after)


class TooManyWaiters(Throttled):
    """429: this API process holds as many long-polls as the tenant (``cap="tenant"``)
    or the process (``cap="process"``) may have; nothing was waited for."""

    def __init__(self, message: str, cap: str, limit: int, retry_after: int):
        super().__init__(message, limit, retry_after)
        self.cap = cap


class Unavailable(DomainError):
    """A dependency (database, Redis) is down: 503, and nothing was admitted."""

    status = 503


class NotConfigured(Unavailable):
    """No usable ASYNCH_DATABASE_URL: a 503 to a request, one line from the CLI."""


# What NotConfigured says when ASYNCH_DATABASE_URL is empty (the default).
NO_DATABASE = ("no database configured: set ASYNCH_DATABASE_URL (postgresql+psycopg2://...), "
               "or run `asynch dev` and use asynch inside its checkout")


class IllegalTransition(DomainError):
    """A state change the state machine does not allow (a bug, not a race)."""

    status = 409
