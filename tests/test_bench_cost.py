"""The round-trip budget of a job, counted by bench/bench_cost.py against the
real services (in a subprocess: the bench uses its own database and Redis
databases, on the suite's own servers).  A change that adds a statement or a Redis call to the
admission or the worker path fails here, not only in a benchmark."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import PG_ADMIN_DSN, REDIS_BASE, ROOT

pytestmark = pytest.mark.slow


def test_admission_is_one_statement_and_a_job_costs_six_redis_round_trips_in_all():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCH_")}
    env.update(PYTHONPATH=str(ROOT), BENCH_COST_JOBS="30", BENCH_PG_ADMIN=PG_ADMIN_DSN, BENCH_REDIS=REDIS_BASE)
    out = subprocess.run([sys.executable, "-m", "bench.bench_cost"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("COST-JSON ")]
    cost = json.loads(line[len("COST-JSON "):])
    # The INSERT in autocommit (no BEGIN/COMMIT); the queue estimate's and
    # the gate's EVALSHA in the request (app/jobs/estimates.py: the 202's
    # queue_position, a deadline judged before the gate), then the outbox's
    # dispatch step and, when the job may run now, the LPUSH of its message
    # (both after the 202).
    assert cost["admit_sql_by_kind"] == {"INSERT": 1.0}
    assert 3.0 <= cost["admit_redis"] <= 4.0
    # Read, claim, then BEGIN + stats upsert + done UPDATE + COMMIT; the
    # claim's dispatch step and the finish's (slot, permit, wake-up, next
    # job), plus the LPUSH of a job dispatched then.  Every job's message is
    # published once, at admission or when a permit frees: five in all (a
    # message batch split by priority, or a step that finds nothing to
    # publish, moves it by a few per cent either way); six with the estimate.
    assert cost["complete_sql"] <= 6.0, cost["complete_sql_by_kind"]
    assert cost["admit_redis"] + cost["complete_redis"] <= 6.2, cost
