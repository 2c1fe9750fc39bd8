"""Cost per job, counted: SQL statements (BEGIN, COMMIT and ROLLBACK included) and Redis round trips (including the
broker publish, which goes to Redis too) per admitted job and per completed
job, in-process against the real services.  The admission INSERT runs in
autocommit (no BEGIN/COMMIT on the wire), which is why no COMMIT is counted
for it."""
from __future__ import annotations

import json
import sys
from collections import Counter

from sqlalchemy import event

from bench import stack

N = int(__import__("os").environ.get("BENCH_COST_JOBS", "200"))


class Counting:
    def __init__(self) -> None:
        self.sql = Counter()
        self.redis = 0

    def install(self, engine) -> None:
        import redis.connection

        self.install_sql(engine)
        real = redis.connection.AbstractConnection.send_packed_command
        me = self

        def send(self_, command, check_health=True):
            me.redis += 1  # one write to the socket = one round trip (pipelines count once)
            return real(self_, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = send

    def install_sql(self, engine) -> None:
        @event.listens_for(engine, "before_cursor_execute")
        def _count(_conn, _cur, statement, *_a):
            self.sql[statement.split(None, 1)[0].upper()] += 1

        @event.listens_for(engine, "begin")
        def _begin(conn):
            # psycopg2 sends BEGIN before a transaction's first statement;
            # an autocommit connection sends none.
            if not conn.connection.dbapi_connection.autocommit:
                self.sql["BEGIN"] += 1

        @event.listens_for(engine, "commit")
        def _commit(_conn):
            self.sql["COMMIT"] += 1

        @event.listens_for(engine, "rollback")
        def _rollback(conn):
            # A rollback on an autocommit connection (its release to the pool)
            # sends nothing to the server.
            if not conn.connection.dbapi_connection.autocommit:
                self.sql["ROLLBACK"] += 1

    def snapshot(self):
        return sum(self.sql.values()), dict(self.sql), self.redis


def main() -> dict:
    stack.fresh()
    mport = stack.free_port()
    model = stack.stub_model(mport)

    from app.infra.db import get_engine
    from app.infra.publisher import producer_app
    from app.jobs import execution, handoff
    from app.jobs import service as jobs
    from app.tenancy.keys import Principal

    stack.create_model("bench-echo", f"http://127.0.0.1:{mport}")
    p = Principal("bench", "user", None)
    # Warm up connections, scripts and the producer so they do not count.
    warm = jobs.submit(p, "bench-echo", {"w": 1}).row
    execution.run_attempt(warm.id, 0)
    producer_app()
    c = Counting()
    c.install(get_engine())
    c.install_sql(get_engine(autocommit=True))  # the admission INSERT's pool
    try:
        s0, _, r0 = c.snapshot()
        # One at a time: the outbox then sends each message alone (under
        # concurrent load one LPUSH carries many), so this is the worst case.
        ids = []
        for i in range(N):
            ids.append(jobs.submit(p, "bench-echo", {"i": i}).row.id)
            handoff.flush()
        s1, by1, r1 = c.snapshot()
        for jid in ids:
            assert execution.run_attempt(jid, 0) == "done"
        s2, by2, r2 = c.snapshot()
    finally:
        model.stop()
    out = {
        "admit_sql": (s1 - s0) / N, "admit_redis": (r1 - r0) / N,
        "complete_sql": (s2 - s1) / N, "complete_redis": (r2 - r1) / N,
        "admit_sql_by_kind": {k: v / N for k, v in by1.items()},
        "complete_sql_by_kind": {k: (v - by1.get(k, 0)) / N for k, v in by2.items()},
    }
    print(f"cost per job (n={N}): admitted: {out['admit_sql']:.1f} SQL statements, {out['admit_redis']:.1f} Redis "
          f"round trips | completed: {out['complete_sql']:.1f} SQL, {out['complete_redis']:.1f} Redis")
    print(f"  admit SQL by kind: {out['admit_sql_by_kind']}")
    print(f"  complete SQL by kind: {out['complete_sql_by_kind']}")
    print("COST-JSON " + json.dumps(out))  # for tests/test_bench_cost.py
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
