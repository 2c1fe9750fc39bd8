"""The worker path's round trips and dead-worker recovery (issue
"Performance, second round", parts 2 and 3), on real PostgreSQL, Redis,
a stub model over HTTP and real worker processes.

- A done write is ONE statement with its usage count (a data-modifying
  CTE), and a small result stays in the row: no storage round trip.
- A finished job's Redis bookkeeping is one script call after its claim's
  (issue 25's behaviour test), and the model call reuses its connection.
- A worker node whose heartbeat is gone has its running attempts failed by
  the next maintenance pass, long before their lease would run out; a node
  that restarted under the same name is told apart by its instance; after a
  wiped Redis no live node is taken for dead.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from helpers import Count, WorkerProcess, job_row, P, wait_until
from sqlalchemy import event, select, text

from app.clock import now as clock_now
from app.config import set_settings
from app.infra.db import get_engine, transaction
from app.infra.redis import keys
from app.infra.tables import model_stats
from app.jobs import execution, handoff
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.states import JobState


@pytest.fixture
def inline_default(settings):
    """The product's default: small results kept in the row (file:// storage)."""
    set_settings(settings.with_overrides(inline_result_bytes=-1))
    yield
    set_settings(settings)


def _statements():
    seen: list[str] = []

    def count(_conn, _cur, statement, *_a):
        seen.append(statement.lstrip().split(None, 1)[0].upper())

    return seen, count


def _count_row(model: str) -> int:
    with transaction() as conn:
        return sum(r.request_count for r in conn.execute(select(model_stats).where(model_stats.c.model_name == model)))


def test_a_small_result_stays_in_the_row_and_done_is_one_statement(make_model, model_server, settings,
                                                                    inline_default, r):
    make_model("small")
    job_id = jobs.submit(P, "small", {"prompt": "hi"}).row.id
    assert handoff.flush()
    execution.run_attempt(jobs.submit(P, "small", {}).row.id, 0)  # warm: statements built, pools open
    seen, count = _statements()
    for autocommit in (True, False):
        event.listen(get_engine(autocommit), "before_cursor_execute", count)
    try:
        assert execution.run_attempt(job_id, 0, worker="w1#abc") == "done"
    finally:
        for autocommit in (True, False):
            event.remove(get_engine(autocommit), "before_cursor_execute", count)
    # Read the job, the claim with its model's row (a WITH: the claim's UPDATE joined to the model), then done +
    # the usage count as one statement.
    assert seen == ["SELECT", "WITH", "WITH"], seen
    row = job_row(job_id)
    assert row.state == JobState.DONE and row.result_location == "inline:" and row.worker == "w1#abc"
    data, ctype, _ = jobs.result_bytes(P, job_id)
    assert data == bytes(row.result_inline) and ctype == "application/json" and b"hi" in data
    root = settings.storage_url[len("file://"):]
    assert not any(files for _d, _s, files in os.walk(root) if job_id in _d)  # nothing in object storage
    assert _count_row("small") == 2  # the warm-up call and this one


def test_a_finished_job_is_one_redis_script_call_and_its_model_connection_is_reused(make_model, model_server,
                                                                                      inline_default, monkeypatch):
    """After its claim's step, a job's end (slot and permit back, the next job, the wake-up, the run time)
    is ONE script call; the model call reuses this process's keep-alive connection to the upstream."""
    from app.infra.http import deadline

    # A pause of a loaded machine between two calls must not age the idle connection out of the pool (1 s).
    monkeypatch.setattr(deadline, "POOL_IDLE_SECONDS", 60.0)
    make_model("fin")
    warm, *ids = [jobs.submit(P, "fin", {"i": i}).row.id for i in range(4)]
    assert handoff.flush()
    execution.run_attempt(warm, 0)  # warm: scripts loaded, the upstream connected
    for job_id in ids:
        with Count() as c:
            assert execution.run_attempt(job_id, 0, worker="w1#abc") == "done"
        assert c.sql == ["SELECT", "WITH", "WITH"], c.sql  # read, claim with its model's row, done
        assert c.redis == ["EVALSHA", "EVALSHA"], c.redis  # the claim's step, then the finish
    peers = [c["peer"] for c in model_server.state.calls]
    assert len(peers) == 4 and len(set(peers)) == 1, peers  # one connection: every call reused the warm-up's


def test_a_large_result_goes_to_storage(make_model, model_server, settings, inline_default):
    make_model("large")
    job_id = jobs.submit(P, "large", {"prompt": "x" * 6000}).row.id  # the echo answers > 4096 bytes
    assert execution.run_attempt(job_id, 0) == "done"
    row = job_row(job_id)
    assert row.result_location.startswith("file:") and row.result_inline is None
    data, _, _ = jobs.result_bytes(P, job_id)
    assert len(data) == row.result_size > 4096


def test_a_failed_attempt_is_counted_in_the_same_statement(make_model, model_server, inline_default):
    make_model("fails", retry_times=1)
    job_id = jobs.submit(P, "fails", {"status": 500}).row.id
    assert execution.run_attempt(job_id, 0) == "retry_wait"
    assert job_row(job_id).state == JobState.RETRY_WAIT and _count_row("fails") == 1


def test_a_canceled_attempt_keeps_no_inline_result_and_cleanup_needs_no_storage(make_model, model_server,
                                                                               inline_default, settings):
    make_model("gone")
    lost = jobs.submit(P, "gone", {"sleep_ms": 600}).row.id
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(execution.run_attempt(lost, 0)))
    t.start()
    wait_until(lambda: job_row(lost).state == JobState.RUNNING, what="running")
    jobs.cancel_job(P, lost)
    t.join(10)
    assert out == ["stopped"] and job_row(lost).result_inline is None  # its call was stopped
    assert _count_row("gone") == 1  # the call reached the model: counted, whoever owns the row

    kept = jobs.submit(P, "gone", {}).row.id
    assert execution.run_attempt(kept, 0) == "done"
    set_settings(settings.with_overrides(inline_result_bytes=-1, done_retention_seconds=0))
    time.sleep(0.05)
    rep = maintenance.cleanup()
    assert job_row(kept) is None and rep.processed >= 1


# --- dead workers ----------------------------------------------------------------------

HEARTBEAT = 1.0  # seconds: the liveness key expires after 3


@pytest.fixture
def fast_liveness(settings):
    set_settings(settings.with_overrides(worker_heartbeat_seconds=HEARTBEAT))
    yield
    set_settings(settings)


def _worker(test_env, tmp_path, name: str, node: str | None = None) -> WorkerProcess:
    env = {**test_env, "ASYNCH_WORKER_HEARTBEAT_SECONDS": str(HEARTBEAT)}
    # node: a fixed node name (a restarted container keeps its hostname); the
    # last -n on the command line is the one Celery takes.
    return WorkerProcess(env, concurrency=2, log_path=tmp_path / f"{name}.log", name=name,
                         extra_args=("-n", node) if node else ())


def _kill_node(w: WorkerProcess) -> None:
    os.killpg(w.proc.pid, signal.SIGKILL)  # the main process and its pool: the whole node
    w.proc.wait(10)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dead_nodes_attempts_run_again_long_before_their_lease(test_env, tmp_path, make_model, model_server,
                                                                fast_liveness, r):
    # Lease: 60 s timeout + 120 s grace.  Recovery by heartbeat must not wait for it.
    make_model("hb", timeout_seconds=60, retry_times=2, max_concurrency=4, queue_limit=20)
    first = _worker(test_env, tmp_path, "doomed").start()
    ids = [jobs.submit(P, "hb", {"hold": f"h{i}", "i": i}).row.id for i in range(2)]
    try:
        wait_until(lambda: all(job_row(j).state == JobState.RUNNING for j in ids), timeout=30, what="both running")
        held_by = {job_row(j).worker for j in ids}
        assert len(held_by) == 1 and held_by.pop().startswith("doomed-")
        maintenance.recover_dead_workers()  # a live node: nothing to do (and liveness is now established)
        assert all(job_row(j).state == JobState.RUNNING for j in ids)
        _kill_node(first)
        killed = time.monotonic()

        def recovered():
            maintenance.run_work()
            return all(job_row(j).state != JobState.RUNNING for j in ids)

        wait_until(recovered, timeout=30, interval=0.5, what="the dead node's attempts recovered")
        took = time.monotonic() - killed
        for j in ids:
            row = job_row(j)
            assert row.error == "worker_lost: worker lost (stopped heartbeating)"
            assert row.lease_expires_at is None  # failed by heartbeat; its lease had ~3 minutes left
            # No backoff for a lost node: the same run_work sweep re-queued it.
            assert row.state == JobState.PENDING, row.state
        print(f"\nheartbeat recovery: {took:.1f} s after the SIGKILL (lease would have been 180 s)")
        for j in ids:
            model_server.state.release(f"h{ids.index(j)}")
        second = _worker(test_env, tmp_path, "rescuer").start()
        try:
            def done():
                maintenance.run_work()
                return all(job_row(j).state == JobState.DONE for j in ids)

            wait_until(done, timeout=60, interval=0.5, what="the retries done on another node")
        finally:
            second.stop()
        assert all(job_row(j).attempt == 2 for j in ids)
        calls = Counter(c["payload"]["i"] for c in model_server.state.calls)
        assert calls == Counter({0: 2, 1: 2})  # once per attempt
    finally:
        first.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_restarted_node_with_the_same_name_is_told_apart(test_env, tmp_path, make_model, model_server,
                                                          fast_liveness, r):
    make_model("same", timeout_seconds=60, retry_times=1, max_concurrency=4, queue_limit=20)
    node = f"fixed-{time.time_ns()}@test"
    w = _worker(test_env, tmp_path, "fixed1", node=node).start()
    job = jobs.submit(P, "same", {"hold": "s1"}).row.id
    try:
        wait_until(lambda: job_row(job).state == JobState.RUNNING, timeout=30, what="running")
        maintenance.recover_dead_workers()
        _kill_node(w)
        w = _worker(test_env, tmp_path, "fixed2", node=node).start()  # the same name, a new start
        model_server.state.release("s1")
        wait_until(lambda: (maintenance.run_work(), job_row(job).state != JobState.RUNNING)[1], timeout=30,
                   interval=0.5, what="the old start's attempt recovered")
        assert job_row(job).error == "worker_lost: worker lost (stopped heartbeating)"
    finally:
        w.stop()


@pytest.mark.e2e
def test_a_wiped_redis_does_not_make_live_nodes_look_dead(test_env, tmp_path, make_model, model_server,
                                                          fast_liveness, r):
    make_model("wipe", timeout_seconds=60, retry_times=1, max_concurrency=4, queue_limit=20)
    w = _worker(test_env, tmp_path, "alive").start()
    job = jobs.submit(P, "wipe", {"hold": "w1"}).row.id
    try:
        wait_until(lambda: job_row(job).state == JobState.RUNNING, timeout=30, what="running")
        time.sleep(3 * HEARTBEAT + 0.5)  # old enough to be recovered if its node looked dead
        r.flushdb()  # every liveness hash gone at once, live nodes' too
        rep = maintenance.recover_dead_workers()
        assert rep.processed == 0 and "skipped" in rep.details, rep.details
        wait_until(lambda: r.exists(f"asynch:worker:{job_row(job).worker.split('#')[0]}"), timeout=10,
                   what="the node beating again")
        assert maintenance.recover_dead_workers().processed == 0
        assert job_row(job).state == JobState.RUNNING
        model_server.state.release("w1")
        wait_until(lambda: job_row(job).state == JobState.DONE, timeout=30, what="done by its own node")
    finally:
        w.stop()


def test_the_claim_records_its_node_and_an_unknown_node_is_left_to_the_lease(make_model, model_server,
                                                                            fast_liveness, r):
    """A running attempt claimed without a node (runWork, an older worker)
    is never judged by heartbeat: only its lease recovers it."""
    make_model("anon", timeout_seconds=60)
    job = jobs.submit(P, "anon", {}).row.id
    from app import transitions
    from app.infra.db import single_statement

    with single_statement() as conn:
        assert transitions.claim(conn, job, 0, clock_now() + timedelta(seconds=300))
    with transaction() as conn:
        conn.execute(text("UPDATE asynch_task SET started_at = now() - interval '1 hour' WHERE id = :j"), {"j": job})
    maintenance.recover_dead_workers()  # establishes liveness
    r.set(keys.liveness_since(), 0)  # as if it had been established long ago
    assert maintenance.recover_dead_workers().processed == 0
    assert job_row(job).state == JobState.RUNNING and job_row(job).worker is None
