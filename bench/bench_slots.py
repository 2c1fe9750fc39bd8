"""A slot per call, measured (issue 31 item 3): fairness by model time and the work done, held together, with
default settings, beside the baselines in the same run.

The scenario (the issue's): two tenants at equal weight, one with 2 s jobs and one with 0.1 s jobs, both kept
backlogged (a feeder tops each tenant up to 64 pending jobs) on one model whose max_concurrency (32) is above
what the worker node runs at once (one node, BENCH_WORKERS processes, default 2), so the node is what they
share.  After a 5 s warm-up, over BENCH_SLOTS_SECONDS (20): each tenant's model time (claim to end, clipped to
the window), their ratio (goal: <= 1.3x), the model time served in all, and a third tenant's first job (0.1 s,
submitted 8 s in): how long it waited to start (goal: <= 1 s).

Rows: this tree with its defaults, and the same scenario run on a baseline tree (BENCH_BASELINE_TREE, default a
worktree of 58d5bec made on demand under bench/logs/): its defaults (window 16, groups of 8), its
ASYNCH_DISPATCH_WINDOW=2 and its ASYNCH_DISPATCH_FAIRNESS=turns.  Each row is a fresh database and Redis; the
baseline rows run in a child process whose `app` and `bench.stack` are the baseline tree's.

Usage: PYTHONPATH=. python -m bench.bench_slots [--no-baseline]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
BASE_COMMIT = "58d5bec"
SECONDS = float(os.environ.get("BENCH_SLOTS_SECONDS", "20"))
WARMUP = 5.0
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
TENANTS = {"fast": 100, "slow": 2000}  # tenant -> its jobs' milliseconds


def _pending(tenant: str) -> int:
    from sqlalchemy import func, select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        return conn.execute(select(func.count()).where(tasks.c.tenant_id == tenant, tasks.c.state == 0)).scalar()


def _submit(tenant: str, ms: int, i: int) -> str:
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    return jobs.submit(Principal(tenant, "user", None), "shared", {"sleep_ms": ms, "i": i}).row.id


def _model_seconds(t0, t1) -> dict[str, float]:
    from sqlalchemy import select

    from app.infra.db import transaction
    from app.infra.tables import tasks

    with transaction() as conn:
        rows = conn.execute(select(tasks.c.tenant_id, tasks.c.started_at, tasks.c.finished_at).where(
            tasks.c.started_at.is_not(None))).all()
    out = dict.fromkeys(TENANTS, 0.0)
    for t, start, end in rows:
        if t in out:
            out[t] += max(0.0, (min(end or t1, t1) - max(start, t0)).total_seconds())
    return out


def scenario(label: str, env: dict[str, str]) -> dict:
    """One row: a fresh stack with ``env``, the two tenants fed for the warm-up and the window."""
    from datetime import timedelta

    from bench import stack

    stack.fresh(**env)
    from app.clock import now
    from tests.stubs import StubModelServer

    out: dict = {"row": label}
    with StubModelServer() as stub:
        stack.create_model("shared", stub.url, route="/v1", max_concurrency=32, queue_limit=1_000_000,
                           timeout_seconds=30)
        stop, counter = threading.Event(), iter(range(10**9))

        def fill():
            for tenant, ms in TENANTS.items():
                for _ in range(max(0, 64 - _pending(tenant))):
                    _submit(tenant, ms, next(counter))

        def feed():
            while not stop.wait(0.2):
                fill()

        fill()  # before any worker
        feeder = threading.Thread(target=feed, daemon=True)
        worker = stack.celery_worker(f"slots-{label.split()[0]}", "workers.celery_app", os.environ["ASYNCH_QUEUE_NAME"],
                                     WORKERS, env)
        try:
            feeder.start()
            t0 = now() + timedelta(seconds=WARMUP)
            time.sleep(WARMUP + 8)
            third = _submit("third", 100, -1)
            time.sleep(SECONDS - 8)
            t1 = t0 + timedelta(seconds=SECONDS)
            got = _model_seconds(t0, t1)
        finally:
            stop.set()
            worker.stop()
        from app.infra.db import transaction
        from app.infra.tables import tasks
        from sqlalchemy import select

        with transaction() as conn:
            r = conn.execute(select(tasks.c.created_at, tasks.c.started_at).where(tasks.c.id == third)).first()
    hi, lo = max(got.values()), max(min(got.values()), 1e-9)
    out.update(model_seconds=got, ratio=hi / lo, served=sum(got.values()),
               third_start=(r.started_at - r.created_at).total_seconds() if r.started_at else None)
    return out


def _print(r: dict) -> None:
    g = r["model_seconds"]
    third = f"{r['third_start']:.2f} s" if r["third_start"] is not None else "not started"
    print(f"{r['row']:<34} model time 0.1 s jobs {g['fast']:6.1f} s, 2 s jobs {g['slow']:6.1f} s: "
          f"{r['ratio']:5.2f}x apart (goal <= 1.3x); served {r['served']:6.1f} s in {SECONDS:.0f} s; "
          f"a third tenant started after {third} (goal <= 1 s)", flush=True)


def _baseline_tree() -> Path:
    tree = Path(os.environ.get("BENCH_BASELINE_TREE") or HERE.parent / "logs" / f"baseline-{BASE_COMMIT}")
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), BASE_COMMIT], cwd=HERE.parent.parent,
                       check=True, capture_output=True)
    return tree


BASELINES = [("58d5bec defaults (window 16, groups of 8)", {}),
             ("58d5bec window 2", {"ASYNCH_DISPATCH_WINDOW": "2"}),
             ("58d5bec turns", {"ASYNCH_DISPATCH_FAIRNESS": "turns"})]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:  # a baseline row, run with the baseline tree's app
        label, env = argv[1], json.loads(argv[2])
        print("SLOTS-ROW " + json.dumps(scenario(label, env), default=str), flush=True)
        return
    rows = [scenario("this tree, defaults", {})]
    _print(rows[-1])
    if "--no-baseline" not in argv:
        tree = _baseline_tree()
        for label, env in BASELINES:
            child = subprocess.run([sys.executable, str(HERE), "--child", label, json.dumps(env)], cwd=tree,
                                   env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
            line = next((x for x in child.stdout.splitlines() if x.startswith("SLOTS-ROW ")), None)
            if line is None:
                print(f"{label}: failed\n{child.stderr[-3000:]}")
                continue
            rows.append(json.loads(line[len("SLOTS-ROW "):]))
            _print(rows[-1])
    print("SLOTS-JSON " + json.dumps(rows, default=str))


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main(sys.argv[1:])
