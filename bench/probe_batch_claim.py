"""Probe for issue 25's next design step: what claiming a node's dispatched jobs in ONE guarded
``UPDATE ... RETURNING`` would save against today's read + claim per job, on the real schema
(every index of asynch_task) and the real statements, one connection, autocommit (each claim durable).

    today     per job: the worker's read (app/jobs/execution.py _JOB_WITH_MODEL) + transitions.claim,
              then (printed apart) the done write, transitions.complete with its usage count
    batch N   per N jobs: one read of the N rows with their model + one guarded UPDATE of the N
              (WHERE id = ANY(:ids) AND state = pending AND attempt = the one dispatched), RETURNING

Prints wall milliseconds per job and the PostgreSQL backend's CPU milliseconds per job (/proc of the
connection's backend, exact for this connection), each variant beside today's in the same run.

    BENCH_OWN_SERVERS=1 PYTHONPATH=. .venv/bin/python -m bench.probe_batch_claim   (BENCH_JOBS=2000)
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

from bench import stack

JOBS = int(os.environ.get("BENCH_JOBS", "2000"))


def _backend_cpu_ms(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _fill(n: int) -> list[str]:
    from app.jobs import handoff
    from app.jobs.batch import submit_batch
    from app.tenancy.keys import Principal

    p, ids = Principal("bench", "user", None), []
    while len(ids) < n:
        out = submit_batch(p, "probe", [{"payload": {"prompt": "x", "i": len(ids) + k}} for k in range(100)])
        assert all(o.error is None for o in out), [o.error for o in out if o.error][:1]
        ids += [o.submitted.row.id for o in out]
    handoff.flush()
    return ids[:n]


def main() -> None:
    from sqlalchemy import bindparam, select, text, update

    from app import transitions
    from app.clock import now
    from app.infra.db import single_statement
    from app.infra.tables import models, tasks
    from app.jobs import stats
    from app.jobs.execution import _JOB_WITH_MODEL
    from app.states import JobState

    stack.fresh()
    stack.create_model("probe", "http://127.0.0.1:9", max_concurrency=10000, queue_limit=100000)
    read_many = (select(tasks.c.id, tasks.c.state, tasks.c.attempt, tasks.c.tenant_id, tasks.c.caller_deadline_at,
                        *[c for c in models.c if c.name != "id"])
                 .select_from(tasks.outerjoin(models, models.c.model_name == tasks.c.model_name))
                 .where(tasks.c.id.in_(bindparam("ids", expanding=True))))
    claim_many = (update(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)),
                                      tasks.c.state == int(JobState.PENDING), tasks.c.attempt == 0)
                  .values(state=int(JobState.RUNNING), attempt=1, updated_at=bindparam("t"), started_at=bindparam("t"),
                          lease_expires_at=bindparam("lease"), worker="probe#1").returning(*tasks.c))
    results = {}
    for name, group in (("today", 1), ("batch 4", 4), ("batch 8", 8), ("batch 16", 16), ("today", 1)):
        ids = _fill(JOBS)
        with single_statement() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            for job_id in ids[:20]:  # warm: plans cached, pages read
                conn.execute(_JOB_WITH_MODEL, {"job_id": job_id}).first()
            c0, t0, p0 = _backend_cpu_ms(pid), time.perf_counter(), time.process_time()
            claimed, rows = 0, []
            for i in range(0, len(ids), group):
                lease = now() + timedelta(seconds=60)
                if group == 1:
                    conn.execute(_JOB_WITH_MODEL, {"job_id": ids[i]}).first()
                    row = transitions.claim(conn, ids[i], 0, lease, "probe#1")
                    claimed += row is not None
                    rows.append(row)
                else:
                    chunk = ids[i:i + group]
                    conn.execute(read_many, {"ids": chunk}).all()
                    claimed += len(conn.execute(claim_many, {"ids": chunk, "t": now(), "lease": lease}).all())
            wall, cpu = (time.perf_counter() - t0) * 1000 / len(ids), (_backend_cpu_ms(pid) - c0) / len(ids)
            mine = (time.process_time() - p0) * 1000 / len(ids)
            if rows:  # today's done write (done + usage count + attempt log in one statement), per job
                c1, t1, p1 = _backend_cpu_ms(pid), time.perf_counter(), time.process_time()
                for row in rows:
                    assert transitions.complete(conn, row.id, 1, location="inline:", content_type="application/json",
                                                size=2, inline=b"{}", alongside=stats.call_counted(
                                                    conn, now().date(), row.tenant_id, row.creator, row.model_name))
                print(f"{'done':9s} today   : {(time.perf_counter() - t1) * 1000 / len(rows):.3f} ms wall / job, "
                      f"PostgreSQL backend {(_backend_cpu_ms(pid) - c1) / len(rows):.3f} ms CPU / job, this process "
                      f"{(time.process_time() - p1) * 1000 / len(rows):.3f} ms CPU / job", flush=True)
        assert claimed == len(ids), (name, claimed)
        results.setdefault(name, []).append((wall, cpu, mine))
        print(f"{name:9s} group {group:2d}: {wall:.3f} ms wall / job, PostgreSQL backend {cpu:.3f} ms CPU / job, "
              f"this process (the worker's side) {mine:.3f} ms CPU / job", flush=True)
        stack.truncate_jobs()
        stack.flush_redis()
    base = [min(r[k] for r in results["today"]) for k in range(3)]
    for name, runs in results.items():
        w, c, m = (min(r[k] for r in runs) for k in range(3))
        print(f"probe {name:9s}: {w:.3f} ms wall ({w / base[0]:.2f}x today), {c:.3f} ms PG CPU ({c / base[1]:.2f}x), "
              f"{m:.3f} ms worker-side CPU ({m / base[2]:.2f}x)")


if __name__ == "__main__":
    main()
