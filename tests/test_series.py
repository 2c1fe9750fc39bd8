"""GET /v1/overview/series (app/observe/live.py ``throughput_series``,
issue 21 item 5): buckets and P90 computed by PostgreSQL give exactly what
the Python computation over every row gave, and the rows the API reads stay
bounded by models x buckets however many jobs finished."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from helpers import auth, make_key
from sqlalchemy import event, insert, select

from app.clock import set_clock
from app.infra.db import get_engine, transaction
from app.infra.tables import tasks
from app.observe import live
from app.states import JobState

NOW = datetime(2026, 12, 2, 8, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def frozen_clock():
    set_clock(lambda: NOW)
    yield
    set_clock(None)


def _rows(specs: list[tuple[str, str, JobState, datetime, float]]) -> None:
    """(tenant, model, state, finished_at, seconds from created to finished)"""
    values = [dict(id=str(uuid.uuid4()), tenant_id=t, model_name=m, request_payload="{}", request_hash="h",
                   state=int(s), attempt=1, created_at=f - timedelta(seconds=d), enqueue_at=f - timedelta(seconds=d),
                   updated_at=f, finished_at=f) for t, m, s, f, d in specs]
    with transaction() as conn:
        for i in range(0, len(values), 1000):
            conn.execute(insert(tasks), values[i:i + 1000])


def _reference(minutes: int, bucket_minutes: int, tenant_id: str | None) -> dict:
    """The computation before issue 21: every row into Python, nearest-rank P90."""
    start = NOW - timedelta(minutes=minutes)
    q = select(tasks.c.model_name, tasks.c.created_at, tasks.c.finished_at).where(
        tasks.c.state.in_([int(JobState.DONE), int(JobState.CLAIMED)]), tasks.c.finished_at >= start)
    if tenant_id is not None:
        q = q.where(tasks.c.tenant_id == tenant_id)
    n = max(1, -(-minutes // bucket_minutes))
    per: dict[str, list[list[float]]] = {}
    with transaction() as conn:
        for m, created, finished in conn.execute(q):
            i = int((finished - start).total_seconds() // (bucket_minutes * 60))
            per.setdefault(m, [[] for _ in range(n)])[min(i, n - 1)].append((finished - created).total_seconds())

    def p90(v):
        v = sorted(v)
        return v[max(0, -(-9 * len(v) // 10) - 1)] if v else None

    return {"since": start.isoformat().replace("+00:00", "Z"), "bucket_minutes": bucket_minutes,
            "models": {m: [{"done": len(b), "p90_seconds": p90(b)} for b in bs] for m, bs in sorted(per.items())}}


def _known_data() -> None:
    start = NOW - timedelta(minutes=60)
    specs = []
    # Bucket 0 of model a: 70 jobs of 1..70 s (+ a microsecond each), P90 by nearest rank = the 63rd.
    specs += [("t1", "a", JobState.DONE, start + timedelta(seconds=10 + i), i + 1 + (i + 1) * 1e-6)
              for i in range(70)]
    # Bucket 3: ten, claimed ones count as done; one exactly on the bucket's start.
    specs += [("t1", "a", JobState.CLAIMED if i % 2 else JobState.DONE,
               start + timedelta(minutes=15, seconds=i * 7), 0.25 * (10 - i)) for i in range(10)]
    # The window's first instant and its last (now, and a finish a little in the future: the last bucket).
    specs += [("t1", "a", JobState.DONE, start, 5.5), ("t1", "a", JobState.DONE, NOW, 2.0),
              ("t1", "a", JobState.DONE, NOW + timedelta(seconds=3), 1.0)]
    # Not counted: before the window, and ended other than done.
    specs += [("t1", "a", JobState.DONE, start - timedelta(microseconds=1), 9.0),
              ("t1", "a", JobState.FAILED, start + timedelta(minutes=30), 9.0),
              ("t1", "a", JobState.TIMEOUT, start + timedelta(minutes=30), 9.0)]
    # Another tenant, another model, across buckets; one of 2 days.
    specs += [("t2", "b", JobState.DONE, start + timedelta(minutes=4 * i, seconds=59.999999), 0.1 * i)
              for i in range(15)]
    specs += [("t2", "a", JobState.DONE, start + timedelta(minutes=31), 2 * 86400 + 0.5)]
    _rows(specs)


@pytest.mark.parametrize("minutes", [60, 5, 7, 1440])
@pytest.mark.parametrize("tenant", [None, "t1", "t2", "nobody"])
def test_sql_series_equals_the_python_computation(minutes, tenant):
    _known_data()
    bucket = max(1, minutes // 12)
    assert live.throughput_series(minutes, bucket, tenant) == _reference(minutes, bucket, tenant)


def test_known_values():
    _known_data()
    out = live.throughput_series(60, 5, "t1")
    a = out["models"]["a"]
    assert len(a) == 12 and set(out["models"]) == {"a"}
    assert a[0] == {"done": 71, "p90_seconds": 63.000063}  # 70 + the first instant (5.5 s): rank 64
    assert a[3] == {"done": 10, "p90_seconds": 2.25}
    assert a[11] == {"done": 2, "p90_seconds": 2.0}
    assert [b["done"] for b in a[4:11]] == [0] * 7 and a[5]["p90_seconds"] is None


def test_rows_read_stay_bounded_with_many_jobs(settings):
    start = NOW - timedelta(minutes=60)
    _rows([("t1", f"m{i % 3}", JobState.DONE, start + timedelta(seconds=(i * 7) % 3600), (i % 97) / 10)
           for i in range(6000)])
    fetched: list[int] = []

    def count(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            fetched.append(cursor.rowcount)

    engine = get_engine()
    event.listen(engine, "after_cursor_execute", count)
    try:
        out = live.throughput_series(60, 5)
    finally:
        event.remove(engine, "after_cursor_execute", count)
    assert sum(b["done"] for bs in out["models"].values() for b in bs) == 6000
    assert fetched and max(fetched) <= 3 * 12, fetched


def test_the_route_answers_the_same_shape(client):
    _known_data()
    key = make_key("t1")
    resp = client.get("/v1/overview/series?minutes=60", headers=auth(key))
    assert resp.status_code == 200
    assert resp.get_json() == _reference(60, 5, "t1")
