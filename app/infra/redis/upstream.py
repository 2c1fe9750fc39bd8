"""The upstream controller: each model's effective concurrency, adapted to
an upstream that pushes back (docs/architecture.md, "Upstream backpressure").

Invariants:
- One state per model in Redis, shared by every worker: fields of the
  model's dispatch conf hash (``keys.dispatch_conf``), written only inside
  the dispatch steps by upstream_lib.lua (a done job's run time in
  dispatch_finish.lua, a busy answer in dispatch_return.lua), so an update
  is one atomic step that costs no round trip of its own.
- The limit is never above the ceiling (the model's max_concurrency, or
  autotune's lower runtime override) and never below 1; at the ceiling it is
  absent.  dispatch_lib.lua's ``limit()`` takes min(ceiling, limit) as every
  tenant's permit cap on the model, and 0 while the model is paused.
- Derived state: a wiped Redis starts again at the ceiling; with
  ASYNCH_UPSTREAM_CONTROL off the next finish forgets it.
"""
from __future__ import annotations

from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys
from app.infra.redis.client import get_redis


def params() -> str:
    """upstream_lib.lua's parameters: "decrease tolerance retry_after_max"."""
    s = get_settings()
    return f"{s.upstream_decrease} {s.upstream_latency_tolerance} {s.upstream_retry_after_max_seconds}"


def finish_arg() -> str:
    """dispatch_finish.lua's ARGV 15: the parameters, or "-" with the
    controller off (the step forgets its state)."""
    return params() if get_settings().upstream_control else "-"


def snapshot(model_names: Iterable[str]) -> dict[str, tuple[int | None, float | None]]:
    """model -> (the controller's limit, None at the ceiling; paused until,
    unix s, None if not paused), in one round trip."""
    names = list(model_names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.hmget(keys.dispatch_conf(n), "ul", "pause")
    pipe.time()
    *res, (sec, usec) = pipe.execute()
    now = sec + usec / 1e6
    return {n: (int(float(ul)) if ul is not None else None,
                float(p) if p is not None and float(p) > now else None) for n, (ul, p) in zip(names, res)}
