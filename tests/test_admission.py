"""Group-committed admission (app/jobs/admission.py) on real PostgreSQL and
Redis: a batch is one gate step per model, one INSERT and one LPUSH; every
submission gets its own answer; nothing refused or failed keeps a slot or
leaves a row."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_lib
from helpers import Count, gate_depth, gate_members
from sqlalchemy import func, select

from app.errors import QueueFull, TenantQueueFull
from app.infra.db import transaction
from app.infra.tables import tasks
from app.jobs import admission, handoff
from app.jobs import service as jobs
from app.jobs.submission import SubmitOptions
from app.states import JobState
from app.tenancy.keys import Principal

A, B = Principal("tenant-a", "user", None), Principal("tenant-b", "user", None)


def _sub(principal: Principal, model_row, i: int, key: str | None = None,
         estimate: bool = False) -> admission.Submission:
    """A submission as service.submit builds it, for a direct batch (``estimate``: with its place in line)."""
    from app.clock import now
    from app.tenancy import limits

    t = now()
    return admission.Submission(
        values=dict(id=jobs.new_job_id(), tenant_id=principal.tenant_id, creator="", model_name=model_row.model_name,
                    biz_name="", callback_url=None, model_key=None, request_payload=f'{{"i": {i}}}',
                    request_hash=f"h{i}", passthrough_headers=None, idempotency_key=key,
                    state=int(JobState.PENDING), attempt=0, retry_count=0, created_at=t, enqueue_at=t, updated_at=t,
                    deadline_at=jobs.job_deadline(model_row, t)),
        queue_limit=model_row.queue_limit, tenant_cap=limits.tenant_queue_cap(principal.tenant_id, model_row),
        retry_after=1, model_row=model_row if estimate else None, want_estimate=estimate)


def _model(name: str):
    from app.catalog.registry import enabled_model

    return enabled_model(name)


def _rows(model: str) -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks).where(tasks.c.model_name == model)).scalar_one()


def test_a_batch_is_one_gate_step_one_insert_and_no_message_per_job(make_model, settings, r):
    make_model("grp", queue_limit=100, max_concurrency=100)
    m = _model("grp")
    warm = [_sub(A, m, 99)]  # scripts loaded, connections open: count the steady state
    admission.commit_batch(warm)
    assert handoff.flush(5) and warm[0].error is None
    batch = [_sub(A if i % 2 else B, m, i) for i in range(40)]
    broker = redis_lib.Redis.from_url(settings.effective_broker_url)
    pushes0 = int(broker.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))
    with Count() as c:
        admission.commit_batch(batch)
        assert handoff.flush(5)
    assert all(s.event.is_set() and s.error is None and s.row.state == JobState.PENDING for s in batch)
    assert [s.row.id for s in batch] == [s.job_id for s in batch]
    assert c.sql == ["INSERT"], c.sql
    assert c.redis.count("EVALSHA") == 2, c.redis  # the gate step, then the outbox's one dispatch step
    pushes = int(broker.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0)) - pushes0
    # No message per job: the jobs wait in their queues for free call slots.  The model's doorbell, rung by the
    # warm-up's submission and not answered (no worker here), is still out: not rung again.
    assert pushes == 0, pushes
    assert _rows("grp") == 41 and gate_depth("grp") == 41


def test_a_batch_is_estimated_in_one_round_trip_for_all_its_tenants_and_a_late_deadline_keeps_nothing(make_model, r):
    """Single submits that share a batch share its estimate: one step per
    (model, tenant), all in one pipeline whatever the number of tenants, each
    item behind its tenant's earlier ones; an item that cannot meet its
    deadline is answered 429 before the gate."""
    from datetime import timedelta

    from app.clock import now
    from app.errors import DeadlineUnmeetable

    make_model("est", queue_limit=100, max_concurrency=1, expected_seconds=10)
    m = _model("est")
    warm = [_sub(A, m, 99, estimate=True), _sub(B, m, 98, estimate=True)]
    admission.commit_batch(warm)  # scripts loaded, connections open: count the steady state
    assert handoff.flush(5) and all(s.estimate is not None for s in warm)
    tenants = [A, B] + [Principal(f"tenant-{x}", "user", None) for x in "cde"]
    batch = [_sub(tenants[i % 5], m, i, estimate=True) for i in range(15)]
    late = _sub(A, m, 50, estimate=True)
    late.values["caller_deadline_at"] = now() + timedelta(seconds=5)
    with Count() as c:
        admission.commit_batch(batch + [late])
        assert handoff.flush(5)
    # Five tenants' estimates in one pipeline (redis-py's SCRIPT EXISTS first), the gate, the dispatch step.
    assert c.redis.count("EVALSHA") == 3 and c.redis.count("SCRIPT") == 1, c.redis
    for tenant in tenants:
        mine = [s.estimate.position for s in batch if s.tenant == tenant.tenant_id]
        assert mine == sorted(mine) and len(set(mine)) == 3, (tenant, mine)
    assert all(s.error is None and s.row is not None for s in batch)
    assert isinstance(late.error, DeadlineUnmeetable) and late.row is None
    assert _rows("est") == 17 and gate_depth("est") == 17 and late.job_id not in gate_members("est")


def test_refusals_in_a_batch_are_answered_each_and_keep_nothing(make_model, r):
    """A batch over the model's limit and over tenant A's share: the gate
    decides item by item in arrival order; refused items get their 429s and
    hold no slot and no row."""
    make_model("grp", queue_limit=6, max_concurrency=10, tenant_queue_limit=4)
    m = _model("grp")
    batch = [_sub(A, m, i) for i in range(5)] + [_sub(B, m, 10 + i) for i in range(3)]
    admission.commit_batch(batch)
    outcome = [type(s.error).__name__ if s.error else "ok" for s in batch]
    # A: 4 admitted, the 5th at its share; B: 2 more fill the model's 6, the 3rd is refused.
    assert outcome == ["ok"] * 4 + ["TenantQueueFull"] + ["ok", "ok", "QueueFull"], outcome
    assert isinstance(batch[4].error, TenantQueueFull) and isinstance(batch[7].error, QueueFull)
    assert _rows("grp") == 6 and gate_depth("grp") == 6
    assert gate_members("grp") == {s.job_id for s in batch if s.error is None}


def test_an_idempotency_race_inside_one_batch_has_one_row_and_releases_the_loser(make_model, r):
    make_model("grp", queue_limit=10)
    m = _model("grp")
    first, second = _sub(A, m, 1, key="same-key"), _sub(A, m, 2, key="same-key")
    admission.commit_batch([first, second])
    assert first.error is None and isinstance(second.error, admission.IdempotencyConflict)
    assert _rows("grp") == 1 and gate_members("grp") == {first.job_id}


def test_a_row_the_database_refuses_fails_only_itself(make_model, r):
    make_model("grp", queue_limit=10)
    m = _model("grp")
    good1, bad, good2 = _sub(A, m, 1), _sub(B, m, 2), _sub(A, m, 3)
    bad.values["biz_name"] = "x" * 300  # over the column's 128: the database refuses this row only
    admission.commit_batch([good1, bad, good2])
    assert good1.error is None and good2.error is None and bad.error is not None
    assert _rows("grp") == 2 and gate_members("grp") == {good1.job_id, good2.job_id}


def test_concurrent_submissions_share_batches_and_the_gate_holds(make_model, r, monkeypatch):
    """64 threads at a gate of 8 through service.submit: 8 rows and 8 slots
    (9 when one tenant filled the 8 before the other's first job, which the
    newcomer reserve, ceil(8 x 0.05) = 1 above the limit, then admits), every
    other request a 429, and fewer batches than requests."""
    make_model("grp", queue_limit=8, max_concurrency=8)
    start = threading.Barrier(64)
    real, batches = admission.admit_many, []  # the sizes of the batches the committer thread commits
    monkeypatch.setattr(admission, "admit_many", lambda batch: batches.append(len(batch)) or real(batch))

    def one(i: int) -> str:
        start.wait()
        try:
            jobs.submit(A if i % 2 else B, "grp", {"i": i}, SubmitOptions())
            return "ok"
        except QueueFull:  # TenantQueueFull is a QueueFull too
            return "429"

    with ThreadPoolExecutor(64) as ex:
        outcomes = list(ex.map(one, range(64)))
    ok = outcomes.count("ok")
    assert ok in (8, 9) and outcomes.count("429") == 64 - ok
    assert _rows("grp") == ok and gate_depth("grp") == ok
    assert 0 < len(batches) < 64


@pytest.mark.parametrize("down", ["redis", "database"])
def test_an_outage_answers_every_waiting_submission_and_keeps_nothing(make_model, settings, r, down):
    """The gate's Redis or the database is a port nobody listens on: every
    submission of the batch is told 503, and no row and no slot remains."""
    from helpers import free_port

    from app.config import set_settings
    from app.errors import Unavailable
    from app.infra.db import reset_engine
    from app.infra.redis.client import reset_redis

    make_model("grp", queue_limit=10)
    m = _model("grp")
    batch = [_sub(A, m, i) for i in range(3)]
    dead = (dict(redis_url=f"redis://127.0.0.1:{free_port()}/0") if down == "redis"
            else dict(database_url=f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/nowhere"))
    set_settings(settings.with_overrides(**dead))
    reset_redis()
    reset_engine()
    try:
        admission.commit_batch(batch)
    finally:
        set_settings(settings)
        reset_redis()
        reset_engine()
    assert all(isinstance(s.error, Unavailable) for s in batch), [s.error for s in batch]
    assert _rows("grp") == 0 and gate_depth("grp") == 0
