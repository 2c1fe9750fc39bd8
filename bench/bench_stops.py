"""Calls that stop, measured (issue 31 item 2), each figure beside its baseline in the same run.  One Celery node
(BENCH_WORKERS processes, default 2, as `asynch dev`), the stub model in this process (it stops working for a
caller that hangs up, as vLLM does, and records when), default settings.

  cancel   tenant B's 0.1 s jobs (20, 4 a second) on a model with nothing else, and again while tenant A loops
           submit -> cancel 0.3 s after its job starts (8 s calls, max_concurrency 1, as in the issue): B's
           creation -> finish p50 / max and the ratio (goal: <= 1.5x; 5-8 s on 58d5bec); A's calls in flight at
           most (goal: its max_concurrency, 1; 2 on 58d5bec); how long after each cancel the upstream saw the
           connection close (goal: <= 1 s; the whole 8 s call on 58d5bec).

Usage: PYTHONPATH=. python -m bench.bench_stops
"""
from __future__ import annotations

import json
import os
import threading
import time

from bench import stack
from bench.bench_busy import _latencies, _paced, _pct, _submit, _wait_ended

WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))


def cancel(stub) -> dict:
    from app.jobs import service
    from app.tenancy.keys import Principal

    stack.create_model("loop", stub.url, route="/v1", max_concurrency=1, queue_limit=10_000, timeout_seconds=60,
                       model_key_headers="X-Stub-Tenant")
    b = [{"sleep_ms": 100, "i": i} for i in range(20)]
    alone = _latencies(_wait_ended(_paced("loop", "tenant-b", b, 4, model_key="X-Stub-Tenant:b")))
    stop, canceled = threading.Event(), {}

    def loop():
        a = Principal("tenant-a", "user", None)
        while not stop.is_set():
            jid = _submit("loop", "tenant-a", {"sleep_ms": 8000}, model_key="X-Stub-Tenant:a")
            t_end = time.monotonic() + 30
            while not any(c["headers"].get("X-Asynch-Job-Id") == jid for c in stub.state.calls):
                if stop.is_set() or time.monotonic() > t_end:
                    break
                time.sleep(0.01)
            time.sleep(0.3)
            canceled[jid] = time.time()
            service.cancel_job(a, jid)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(1.0)
    beside = _latencies(_wait_ended(_paced("loop", "tenant-b", b, 4, model_key="X-Stub-Tenant:b")))
    stop.set()
    t.join(30)
    time.sleep(1.0)
    closes = sorted(stub.state.hangups[j] - at for j, at in canceled.items() if j in stub.state.hangups)
    out = {"b_alone_p50": _pct(alone, 0.5), "b_alone_max": alone[-1], "b_beside_p50": _pct(beside, 0.5),
           "b_beside_max": beside[-1], "a_max_in_flight": stub.state.max_in_flight_by.get("a", 0),
           "cancels": len(canceled), "close_after_cancel_p50": _pct(closes, 0.5) if closes else None,
           "close_after_cancel_max": closes[-1] if closes else None}
    out["ratio_p50"] = out["b_beside_p50"] / out["b_alone_p50"]
    print(f"cancel loop: B alone p50 {out['b_alone_p50'] * 1000:.0f} ms max {out['b_alone_max'] * 1000:.0f} ms; "
          f"beside A's submit->cancel loop p50 {out['b_beside_p50'] * 1000:.0f} ms max "
          f"{out['b_beside_max'] * 1000:.0f} ms: {out['ratio_p50']:.2f}x (goal <= 1.5x)")
    print(f"cancel loop: A canceled {out['cancels']} calls, at most {out['a_max_in_flight']} in flight (goal 1); "
          f"the upstream saw each close {1000 * (out['close_after_cancel_p50'] or 0):.0f} ms after its cancel "
          f"(max {1000 * (out['close_after_cancel_max'] or 0):.0f} ms; goal <= 1 s)")
    return out


def main() -> None:
    stack.fresh()
    from tests.stubs import StubModelServer

    worker = stack.celery_worker("stops", "workers.celery_app", "asynch-bench", WORKERS)
    try:
        with StubModelServer() as stub:
            results = {"cancel": cancel(stub)}
    finally:
        worker.stop()
    print("STOPS-JSON " + json.dumps(results, default=str))


if __name__ == "__main__":
    main()
