"""Express notices for a worker process's express slot (docs/architecture.md, "A slot per call").

A job queued for a tenant that holds no permit on its model (its first, or its next after all its calls ended)
makes the queueing step answer ``express`` (dispatch_enqueue.lua), and its caller publishes the model's name
(app/infra/redis/events.py publish_express).  Every worker process that built its slots listens here; one whose
express slot is free pulls that model's lowest-pass idle tenant's job (``dispatch.pull_idle``) and runs it
beside its ``ASYNCH_WORKER_SLOTS`` calls.  So a tenant with nothing running does not wait for another
tenant's calls to end (the wait of issue 33's other tenant during a batch), and a busy tenant never gets more
than the slots it already had: the express slot takes only a tenant holding no permit.

Invariants:
- One listener thread per process, started with its slots (again in a forked child; the subscriber loop is
  app/infra/redis/events.py ``listen``, as the stop notices'); a notice is handled on it (one Lua step and one
  claim at most), never on a call's thread.
- Best effort: a lost notice, or a Redis away, changes only where the job runs -- the next free slot pulls it
  as any job; nothing is queued here and nothing is waited for.
"""
from __future__ import annotations

import os
import threading
from typing import Callable

from app.infra.redis import events, keys

RETRY_SECONDS = 1.0  # how soon a listener that lost Redis subscribes again


def listen(on_notice: Callable[[str], object]) -> threading.Thread:
    """Start this process's listener: ``on_notice(model)`` for each express notice."""
    t = threading.Thread(target=events.listen, name="asynch-express", daemon=True, args=(
        f"asynch-express-{os.getpid()}", keys.express_channel(), on_notice, "express notices", RETRY_SECONDS))
    t.start()
    return t
