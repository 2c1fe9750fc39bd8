"""The upstream controller: who backs off when a model's upstream pushes back, and how far
(docs/architecture.md, "Upstream backpressure").

Invariants:
- A busy answer (429/503) belongs to the scope that received it: the job's credential when it carried its own
  model key (``scope_of``), else its tenant.  The scope's first busy answer delays only its own job; busy
  answers in a row cut and pause the scope; the model as a whole backs off only when two tenants' scopes are
  congested on the model's own credential within ``ASYNCH_UPSTREAM_WINDOW_SECONDS`` (upstream_lib.lua).
- State lives in the model's dispatch keys (its hash slot), written only by upstream_lib.lua inside the
  dispatch steps that already run on these events, and by upstream_budget.lua (a busy answer asks whether it
  is free): an update is atomic.
- Every limit is within [1, its ceiling] and absent at the ceiling; a pause or backoff never exceeds
  ``ASYNCH_UPSTREAM_MAX_PAUSE_SECONDS``, whatever Retry-After said.
- Derived state: a wiped Redis starts at the ceilings; with ASYNCH_UPSTREAM_CONTROL off the next finish forgets it.
"""
from __future__ import annotations

import hashlib
import random
from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys, scripts
from app.infra.redis.client import get_redis


def params() -> str:
    """dispatch_lib.lua's ARGV 9: "decrease tolerance max_pause backoff window", or "-" with the controller off."""
    s = get_settings()
    if not s.upstream_control:
        return "-"
    return (f"{s.upstream_decrease} {s.upstream_latency_tolerance} {s.upstream_max_pause_seconds} "
            f"{s.upstream_backoff_seconds} {s.upstream_window_seconds}")


def scope_of(model_key: str | None) -> str:
    """The credential scope of a job that carries its own model key ("~k:" and a keyed hash of it; the key
    itself never reaches Redis), else "" (its tenant is its scope).  "~" never starts a tenant name."""
    if not model_key:
        return ""
    salt = (get_settings().key_pepper or "model-asynch").encode()
    return "~k:" + hashlib.blake2b(model_key.strip().encode(), key=salt[:64], digest_size=8).hexdigest()


def capped(retry_after: float | None) -> float | None:
    """A Retry-After in seconds under the longest pause; None stays None (none usable)."""
    return None if retry_after is None else min(max(0.0, retry_after), get_settings().upstream_max_pause_seconds)


def job_delay(retry_after: float | None, busy_answers: int) -> float:
    """How long a job that got its ``busy_answers``-th busy answer waits before it may run again: the answer's
    Retry-After (capped), else base x 2^(n-1), capped, with equal jitter."""
    if retry_after is not None:
        return capped(retry_after)
    s = get_settings()
    x = min(s.upstream_max_pause_seconds, s.upstream_backoff_seconds * 2 ** max(0, busy_answers - 1))
    return x / 2 + random.random() * x / 2


def take_busy(model: str, tenant: str, budget: int) -> bool:
    """Whether this busy answer of ``tenant``'s may return its job unspent (one of its ``budget`` free busy
    answers on ``model``, earned back one per done answer): one atomic step."""
    return bool(scripts.get("upstream_budget")(keys=[keys.dispatch_busy_budget(model)], args=[tenant, int(budget)]))


def snapshot(model_names: Iterable[str]) -> dict[str, tuple[int | None, float | None]]:
    """model -> (the model-wide limit, None at the ceiling; paused until, unix s, or None), in one round trip."""
    names = list(model_names)
    pipe = get_redis().pipeline(transaction=False)
    for n in names:
        pipe.hmget(keys.dispatch_conf(n), "ul", "pause")
    pipe.time()
    *res, (sec, usec) = pipe.execute()
    now = sec + usec / 1e6
    return {n: (int(float(ul)) if ul is not None else None,
                float(p) if p is not None and float(p) > now else None) for n, (ul, p) in zip(names, res)}


def scopes(model: str) -> dict[str, tuple[int | None, float | None, int]]:
    """The model's scopes that remember something: scope -> (its limit or None, paused until or None, busy
    answers in a row).  A tenant's scope is its name; a credential's "~k:<hash>"."""
    r = get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.dispatch_scopes(model))
    pipe.time()
    found, (sec, usec) = pipe.execute()
    now, out = sec + usec / 1e6, {}
    for scope, v in found.items():
        ul, _cut, pause, streak = v.split(" ")
        out[scope] = (None if ul == "-" else int(float(ul)), float(pause) if float(pause) > now else None, int(streak))
    return out
