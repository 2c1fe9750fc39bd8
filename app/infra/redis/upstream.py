"""The upstream controller: each model's effective concurrency, adapted to an upstream that pushes back
(docs/architecture.md, "Upstream backpressure").

Invariants:
- One state per model, fields of its dispatch conf hash, written only by upstream_lib.lua inside the dispatch steps
  (dispatch_finish.lua, dispatch_return.lua): an update is atomic and costs no round trip.
- The limit is within [1, the ceiling (max_concurrency or autotune's lower override)] and absent at the ceiling;
  dispatch_lib.lua caps every tenant's permits at it, and at 0 while the model is paused.
- Derived state: a wiped Redis starts at the ceiling; with ASYNCH_UPSTREAM_CONTROL off the next finish forgets it.
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
    """dispatch_finish.lua's ARGV 11: the parameters, or "-" with the controller off (forget its state)."""
    return params() if get_settings().upstream_control else "-"


def snapshot(model_names: Iterable[str]) -> dict[str, tuple[int | None, float | None]]:
    """model -> (the limit, None at the ceiling; paused until, unix s, or None), in one round trip."""
    names = list(model_names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.hmget(keys.dispatch_conf(n), "ul", "pause")
    pipe.time()
    *res, (sec, usec) = pipe.execute()
    now = sec + usec / 1e6
    return {n: (int(float(ul)) if ul is not None else None,
                float(p) if p is not None and float(p) > now else None) for n, (ul, p) in zip(names, res)}
