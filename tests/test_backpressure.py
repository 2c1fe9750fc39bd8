"""Busy answers belong to whoever caused them (issue 31 item 1; docs/architecture.md "Upstream backpressure").
Real processes: one Celery node with 8 worker processes on the real broker, the stub model over HTTP (its
"room for N", "busy until", "busy for one credential" modes: 429 beyond), PostgreSQL and Redis.

- a busy answer (429/503) sends the attempt back to the queue without spending a retry while its tenant has
  free busy answers in hand (the budget, earned back one per done answer; a tenant's own override);
- it pauses and throttles the scope that received it: the job's credential when it carried its own model key,
  else its tenant; another tenant (another credential) runs on;
- the model as a whole backs off only when two tenants are congested at once;
- without a usable Retry-After (absent, garbage, negative, infinite) a job backs off exponentially with jitter,
  and a far date is capped, not ignored: a bare 429 for 3 s costs a job a handful of calls;
- the time a busy call held counts in its tenant's cost;
- the scope's concurrency drops at once and climbs back; a latency rise lowers the model's concurrency; 40 jobs
  against room for 2 all end done, and a healthy model beside them is not slowed.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
from helpers import WorkerProcess, job_row, wait_until
from helpers import submit_job as _submit
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.http.model_client import retry_after_seconds
from app.infra.redis import keys, upstream
from app.infra.tables import task_attempts, tasks
from app.states import JobState
from app.tenancy.keys import Principal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUDGET = 20
MAX_PAUSE = 8.0
A, B, C = (Principal(t, "user", None) for t in ("tenant-a", "tenant-b", "tenant-c"))


@pytest.fixture(scope="module")
def eight(test_env, tmp_path_factory):
    env = {**test_env, "ASYNCH_UPSTREAM_BUSY_BUDGET": str(BUDGET), "ASYNCH_UPSTREAM_MAX_PAUSE_SECONDS": str(MAX_PAUSE)}
    w = WorkerProcess(env, concurrency=8, log_path=tmp_path_factory.mktemp("bp") / "w.log", name="bp").start()
    yield w
    w.stop()


@pytest.fixture(autouse=True)
def _pause_cap(settings, clean_state):
    # This process (the parser's cap, job_delay) reads what the workers read; clean_state restores the rest.
    from app.config import set_settings

    set_settings(settings.with_overrides(upstream_max_pause_seconds=MAX_PAUSE, upstream_busy_budget=BUDGET))


def _states(ids: list[str]) -> dict[int, int]:
    with transaction() as conn:
        return dict(conn.execute(select(tasks.c.state, func.count()).where(tasks.c.id.in_(ids))
                                 .group_by(tasks.c.state)).all())


def _ended(ids: list[str]) -> bool:
    return sum(n for s, n in _states(ids).items() if s in (JobState.DONE, JobState.FAILED)) == len(ids)


def _run(model: str, payloads: list[dict], give_up: float = 120, who=None) -> tuple[list[str], float]:
    t0 = time.monotonic()
    ids = [_submit(model, p, who) for p in payloads]
    wait_until(lambda: _ended(ids), timeout=give_up, interval=0.02, what=f"{model}'s jobs")
    return ids, time.monotonic() - t0


def _calls_per_job(model_server) -> Counter:
    return Counter(c["headers"].get("X-Asynch-Job-Id") for c in model_server.state.calls)


def test_retry_after_is_seconds_or_an_http_date_and_anything_else_is_unusable():
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(" 1.5 ") == 1.5
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0  # past: now
    for garbage in (None, "", "soon", "nan", "NaN", "-5", "inf", "-inf", "1e999"):
        assert retry_after_seconds(garbage) is None, garbage
    # A valid date far ahead is read, then capped (not ignored: that sent the job again at once).
    far = retry_after_seconds("Fri, 31 Dec 9999 23:59:59 GMT")
    assert far > 1e9 and upstream.capped(far) == MAX_PAUSE
    # Without one, the job backs off exponentially, with jitter, under the cap.
    for n in range(1, 12):
        x = min(MAX_PAUSE, 0.5 * 2 ** (n - 1))
        assert all(x / 2 <= upstream.job_delay(None, n) <= x for _ in range(20))


def test_busy_answers_spend_the_tenants_budget_not_retries(make_model, model_server, eight):
    from app.tenancy import limits
    from app.tenancy.schemas import TenantLimitsInput

    make_model("busy", retry_times=0, max_concurrency=2)
    # 429 for the first 3 calls, done on the 4th: the budget (4) paid, no retry was allowed, none was spent.
    ok = _submit("busy", {"status_first": 429, "tag": "b3", "fail_first": 3}, A)
    wait_until(lambda: _ended([ok]), timeout=60, what="the job")
    row = job_row(ok)
    assert (row.state, row.attempt, row.busy_count, row.retry_count, row.error) == (JobState.DONE, 4, 3, 0, None)
    with transaction() as conn:
        log = conn.execute(select(task_attempts.c.attempt, task_attempts.c.outcome, task_attempts.c.error)
                           .where(task_attempts.c.job_id == ok).order_by(task_attempts.c.attempt)).all()
    assert [(a, JobState(o).label) for a, o, _ in log] == [(1, "pending"), (2, "pending"), (3, "pending"), (4, "done")]
    assert all(e.startswith("model_busy:") for _, _, e in log[:3])
    # A tenant's own budget of 2: its first job's 2 busy answers spend both, its done answer earns one back;
    # its second job's first busy answer is free, its second finds the budget spent out: a failed attempt.
    # A tenant of this test's own: the worker process caches a tenant's limits for a few seconds, and a budget
    # of 2 left on tenant-b failed the next test's busy jobs (the truncate between tests publishes nothing).
    own = Principal("tenant-budget2", "user", None)
    limits.update(own.tenant_id, TenantLimitsInput(busy_budget=2))
    first = _submit("busy", {"status_first": 503, "tag": "f2", "fail_first": 2}, own)
    wait_until(lambda: _ended([first]), timeout=60, what="the first job")
    second = _submit("busy", {"status_first": 503, "tag": "s9", "fail_first": 9}, own)
    wait_until(lambda: _ended([second]), timeout=60, what="the second job")
    assert (job_row(first).state, job_row(first).busy_count) == (JobState.DONE, 2)
    row = job_row(second)
    assert (row.state, row.attempt, row.busy_count) == (JobState.FAILED, 2, 1)
    assert row.error.startswith("model_http_error:") and "503" in row.error
    # Visible: the poll body says how many busy answers the job got (none: absent).
    from app.jobs.schemas import JobStatus

    assert JobStatus.values_of(job_row(ok))["busy_answers"] == 3
    plain = _submit("busy", {"i": 0}, C)
    wait_until(lambda: _ended([plain]), timeout=30, what="a plain job")
    assert "busy_answers" not in JobStatus.values_of(job_row(plain))


def test_one_tenants_busy_answers_pause_that_tenant_only(make_model, model_server, eight):
    make_model("shared", retry_times=0, max_concurrency=4, queue_limit=100)
    # Tenant A's calls are refused (its payload, its quota): 429 with Retry-After, for a long while.
    busy = [_submit("shared", {"busy_until": time.time() + 300, "retry_after": str(int(MAX_PAUSE)), "i": i}, A)
            for i in range(4)]
    wait_until(lambda: model_server.state.busy_answers >= 2, timeout=30, what="A's busy answers")
    wait_until(lambda: (upstream.scopes("shared").get("tenant-a") or (None, None, 0))[1] is not None, timeout=30,
               what="A's scope paused")
    # Tenant B on the same model runs at once: B is not paused, and neither is the model.
    b_ids = [_submit("shared", {"sleep_ms": 50, "i": i}, B) for i in range(8)]
    wait_until(lambda: _ended(b_ids), timeout=30, interval=0.02, what="B's jobs")
    assert _states(b_ids) == {JobState.DONE: 8}
    assert upstream.snapshot(["shared"])["shared"] == (None, None)
    assert "tenant-b" not in upstream.scopes("shared")
    # A's jobs were still waiting out their pause when B's were all done.
    assert _states(busy).get(JobState.PENDING) == 4


def test_a_credentials_busy_answers_pause_that_credential_only(make_model, model_server, eight):
    make_model("keyed", retry_times=0, max_concurrency=4, queue_limit=100, model_key_headers="X-Stub-Key")
    spent = [_submit("keyed", {"busy_key": "spent", "retry_after": str(int(MAX_PAUSE)), "i": i}, A,
                     model_key="X-Stub-Key:spent") for i in range(3)]
    wait_until(lambda: any(s.startswith("~k:") and p for s, (_, p, _n) in upstream.scopes("keyed").items()),
               timeout=30, what="the credential's scope paused")
    # The same tenant's jobs with another credential, or with the model's own, run on.
    fine = [_submit("keyed", {"busy_key": "spent", "i": 10 + i}, A, model_key="X-Stub-Key:fine") for i in range(3)]
    plain = [_submit("keyed", {"busy_key": "spent", "i": 20 + i}, A) for i in range(3)]
    wait_until(lambda: _ended(fine + plain), timeout=30, interval=0.02, what="the other credentials' jobs")
    assert _states(fine + plain) == {JobState.DONE: 6}
    assert _states(spent).get(JobState.PENDING) == 3
    assert "tenant-a" not in upstream.scopes("keyed")  # the tenant itself is not paused
    assert upstream.snapshot(["keyed"])["keyed"] == (None, None)
    # The credential itself never reaches Redis, only a keyed hash of it.
    assert not [k for k in upstream.scopes("keyed") if "spent" in k]


def test_two_congested_tenants_make_the_model_back_off(make_model, model_server, eight):
    make_model("overload", retry_times=0, max_concurrency=4, queue_limit=100)
    until = time.time() + 300
    ids = [_submit("overload", {"busy_until": until, "retry_after": "5", "i": i}, who)
           for i in range(3) for who in (A, B)]
    wait_until(lambda: upstream.snapshot(["overload"])["overload"][1] is not None, timeout=30,
               what="the model paused")
    limit, _paused = upstream.snapshot(["overload"])["overload"]
    assert limit is not None and limit < 4
    # None failed: no retry was spent.
    assert set(_states(ids)) <= {JobState.PENDING, JobState.RUNNING}, [
        (r.busy_count, r.error, r.error_detail) for r in map(job_row, ids) if r.state == JobState.FAILED]


@pytest.mark.parametrize("retry_after", [None, "nan", "-5", "inf", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_bare_429_for_3_seconds_costs_each_job_a_handful_of_calls(make_model, model_server, eight, retry_after):
    make_model("bare", retry_times=0, max_concurrency=8, queue_limit=100)
    until = time.time() + 3
    payload = {"busy_until": until} | ({} if retry_after is None else {"retry_after": retry_after})
    ids, _ = _run("bare", [{**payload, "i": i} for i in range(8)], give_up=90)
    assert _states(ids) == {JobState.DONE: 8}
    calls = _calls_per_job(model_server)
    assert max(calls[j] for j in ids) <= 6, [calls[j] for j in ids]  # it was 21 per job in 1.2-1.5 s


def test_the_time_a_busy_call_held_is_charged_to_its_tenant(make_model, model_server, eight, r):
    make_model("charged", retry_times=0, max_concurrency=2)
    jid = _submit("charged", {"sleep_ms": 600, "status": 429, "i": 0}, C)
    wait_until(lambda: job_row(jid).busy_count >= 1, timeout=30, what="the busy answer")
    # The busy call's 0.6 s fed the tenant's run-time average (what each dispatch of it is charged).
    assert float(r.hget(keys.dispatch_cost("charged"), "tenant-c")) >= 0.5


def test_a_scopes_concurrency_drops_on_busy_answers_and_climbs_back(make_model, model_server, eight):
    make_model("full", retry_times=0, max_concurrency=8, queue_limit=100)
    ids, _ = _run("full", [{"sleep_ms": 150, "room": 2, "i": i} for i in range(16)], who=A)
    assert _states(ids) == {JobState.DONE: 16}
    dropped = upstream.scopes("full")["tenant-a"][0]
    assert dropped is not None and dropped <= 4, dropped
    assert upstream.snapshot(["full"])["full"][0] is None  # one tenant: the model itself is not cut
    # The upstream has room again: the tenant's limit climbs back to the configured 8 (then it is forgotten).
    model_server.state.reset()
    for _round in range(4):
        _run("full", [{"sleep_ms": 20, "i": i} for i in range(60)], who=A)
        if "tenant-a" not in upstream.scopes("full"):
            break
    assert "tenant-a" not in upstream.scopes("full")
    assert model_server.state.busy_answers == 0


def test_a_latency_rise_above_the_baseline_lowers_concurrency(make_model, model_server, eight):
    make_model("slowing", retry_times=0, max_concurrency=8, queue_limit=100)
    # +150 ms per other call in flight.  The limit settles where the recent run
    # time is 2x the baseline: at 1.2 + overhead/150 calls, so a loaded machine's
    # per-call overhead (which inflates the baseline) still leaves it under 4.
    payload = {"sleep_ms": 30, "crowd_ms": 150, "room_tag": "s"}
    for i in range(12):  # one at a time: the baseline is ~30 ms
        _run("slowing", [{**payload, "i": i}])
    assert upstream.snapshot(["slowing"])["slowing"][0] is None
    ids = [_submit("slowing", {**payload, "i": i}) for i in range(40)]  # 8 at once: ~1.1 s each
    seen = set()
    while not _ended(ids):
        seen.add(upstream.snapshot(["slowing"])["slowing"][0] or 8)
        time.sleep(0.02)
    assert min(seen) <= 4, seen
    assert model_server.state.busy_answers == 0  # no 429: the run time alone did it


def test_an_upstream_with_room_for_2_gets_40_jobs_done_and_a_healthy_model_is_not_slowed(
        make_model, model_server, eight):
    make_model("room2", retry_times=0, max_concurrency=8, queue_limit=100)
    make_model("healthy", retry_times=0, max_concurrency=4, queue_limit=100)
    healthy = [{"sleep_ms": 100, "i": i} for i in range(20)]
    _run("healthy", healthy[:4])  # warm up
    _, alone = _run("healthy", healthy)

    sleep_s, n = 0.3, 40
    t0 = time.monotonic()
    ids = [_submit("room2", {"sleep_ms": sleep_s * 1000, "room": 2, "i": i}) for i in range(n)]
    _, beside = _run("healthy", healthy)
    wait_until(lambda: _ended(ids), timeout=120, interval=0.02, what="the 40 jobs")
    took = time.monotonic() - t0
    ideal = n / 2 * sleep_s
    assert _states(ids) == {JobState.DONE: n}
    assert model_server.state.busy_answers <= n, model_server.state.busy_answers
    assert took <= 3 * ideal + 5, (took, ideal)
    assert beside <= 2 * alone + 1, (beside, alone)
