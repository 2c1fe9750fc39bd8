"""An upstream that pushes back, measured (issue 24 item 2): 40 jobs of
0.3 s on a model configured for concurrency 8 (retry_times 3), against an
upstream with room for 2 calls at once that answers 429 beyond that (the
stub model's "room" mode; with BENCH_RETRY_AFTER=<s> it also sends
Retry-After).  One Celery node, 8 processes; the beat's run_work pass every
5 s (retries re-admitted, dispatch kicked), as a deployment runs it.

Two rows in the same run: the controller on (ASYNCH_UPSTREAM_CONTROL=1)
and off (today's behaviour: a 429 is a failed attempt).  Each: jobs done
and failed, 429s the upstream sent, seconds taken, against the ideal
(40 / 2 x 0.3 s = 6 s).

Usage: BENCH_PG_ADMIN=... BENCH_REDIS=... PYTHONPATH=. python -m bench.bench_backpressure
"""
from __future__ import annotations

import json
import os
import threading
import time

from bench import stack

N, ROOM, SLEEP_S, CONCURRENCY = 40, 2, 0.3, 8


def _round(control: bool, stub) -> dict:
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks
    from app.jobs import service as jobs
    from app.maintenance import passes
    from app.states import JobState
    from app.tenancy.keys import Principal

    name = f"room{ROOM}-{'on' if control else 'off'}"
    stack.create_model(name, stub.url, max_concurrency=CONCURRENCY, retry_times=3, queue_limit=1000)
    worker = stack.celery_worker(f"bp-{name}", "workers.celery_app", "asynch-bench", CONCURRENCY,
                                 extra_env={"ASYNCH_UPSTREAM_CONTROL": "1" if control else "0"})
    stub.state.reset()
    stop = threading.Event()

    def beat():  # the leader's run_work every ASYNCH_BEAT_RETRY_SECONDS (5 s)
        while not stop.wait(5.0):
            passes.run_work(0)

    threading.Thread(target=beat, daemon=True).start()
    payload = {"sleep_ms": SLEEP_S * 1000, "room": ROOM}
    if os.environ.get("BENCH_RETRY_AFTER"):
        payload["retry_after"] = os.environ["BENCH_RETRY_AFTER"]
    t0 = time.monotonic()
    ids = [jobs.submit(Principal("bench", "user", None), name, {**payload, "i": i}).row.id for i in range(N)]
    ended = (int(JobState.DONE), int(JobState.FAILED))
    while time.monotonic() - t0 < 300:
        with transaction() as conn:
            states = dict(conn.execute(select(tasks.c.state, func.count()).where(tasks.c.id.in_(ids))
                                       .group_by(tasks.c.state)).all())
        if sum(states.get(s, 0) for s in ended) == N:
            break
        time.sleep(0.05)
    took = time.monotonic() - t0
    stop.set()
    worker.stop()
    return {"controller": "on" if control else "off", "done": states.get(int(JobState.DONE), 0),
            "failed": states.get(int(JobState.FAILED), 0), "answers_429": stub.state.busy_answers,
            "seconds": round(took, 2), "ideal_seconds": N / ROOM * SLEEP_S}


def main() -> None:
    stack.recreate_database()
    stack.flush_redis()
    stack.apply_env()
    from tests.stubs import StubModelServer  # the demo model, recording its calls

    with StubModelServer() as stub:
        rows = [_round(True, stub), _round(False, stub)]
    for r in rows:
        print(f"controller {r['controller']:>3}: {r['done']}/{N} done, {r['failed']} failed, "
              f"{r['answers_429']} answers of 429, {r['seconds']:.1f} s (ideal {r['ideal_seconds']:.1f} s; "
              f"target: all done, <= {N} x 429, <= {3 * r['ideal_seconds'] + 5:.0f} s)")
    print("BACKPRESSURE-JSON " + json.dumps(rows))


if __name__ == "__main__":
    main()
