"""Where an idle job's submit -> model-call start goes, step by step
(docs/performance.md, "Latency"): the API runs in this process (Flask's
test client) with its steps wrapped in timers, a real worker node claims and
calls the stub model (in this process too: one clock).  60 jobs, one every
100 ms; prints each step's p50 and max.  A probe, not a benchmark: it has
no baseline (bench_latency.py has)."""
from __future__ import annotations

import statistics
import time
import uuid

from bench import stack

STEPS = ("request -> estimate", "estimate", "gate", "INSERT + commit", "202 after the INSERT",
         "outbox -> dispatch step", "dispatch step", "LPUSH", "LPUSH -> claim (started_at)", "claim -> call")


def main() -> None:
    stack.fresh()
    from tests.stubs import StubModelServer  # the demo model, recording its calls

    stub = StubModelServer().start()
    stack.create_model("bench-echo", stub.url, max_concurrency=64)
    key = stack.create_key()
    from app import create_app
    from app.infra import publisher
    from app.infra.redis import dispatch as rd, gate
    from app.jobs import admission, estimates

    spans: dict[str, list[tuple[float, float]]] = {}

    def timed(mod, name: str, label: str) -> None:
        f = getattr(mod, name)

        def wrapper(*a, **k):
            t0 = time.time()
            try:
                return f(*a, **k)
            finally:
                spans.setdefault(label, []).append((t0, time.time()))
        setattr(mod, name, wrapper)

    for mod, name, label in ((estimates, "for_new_many", "estimate"), (gate, "gate_admit_many", "gate"),
                             (admission, "_insert", "insert"), (rd, "enqueue", "dispatch"),
                             (publisher, "publish_bell", "lpush")):
        timed(mod, name, label)
    client = create_app().test_client()
    worker = stack.celery_worker("worker", "workers.celery_app", "asynch-bench")
    sent = []
    try:
        for _ in range(60):
            tag = uuid.uuid4().hex
            t0 = time.time()
            r = client.post("/v1/models/bench-echo/jobs", json={"n": tag}, headers={"Authorization": f"Bearer {key}"})
            sent.append((tag, r.get_json()["job_id"], t0, time.time()))
            time.sleep(0.1)
        time.sleep(1)
        from sqlalchemy import select

        from app.clock import as_utc
        from app.infra.db import transaction
        from app.infra.tables import tasks

        with transaction() as conn:
            rows = conn.execute(select(tasks.c.id, tasks.c.started_at)).all()
        started = {x.id: as_utc(x.started_at).timestamp() for x in rows}
        with stub.state.lock:
            called = {c["payload"].get("n"): c["t"] for c in stub.state.calls if isinstance(c["payload"], dict)}
        parts: dict[str, list[float]] = {k: [] for k in STEPS}
        for i, (tag, job, t0, t1) in enumerate(sent):
            e, g, ins, d, lp = (spans[k][i] for k in ("estimate", "gate", "insert", "dispatch", "lpush"))
            s = started[job]
            for k, v in zip(STEPS, (e[0] - t0, e[1] - e[0], g[1] - g[0], ins[1] - ins[0], t1 - ins[1],
                                    d[0] - ins[1], d[1] - d[0], lp[1] - d[1], s - lp[1], called[tag] - s)):
                parts[k].append(v * 1000)
        for k, v in parts.items():
            print(f"{k:28s} p50 {statistics.median(v):6.2f} ms   max {max(v):6.2f} ms")
    finally:
        worker.stop()
        stub.stop()


if __name__ == "__main__":
    main()
