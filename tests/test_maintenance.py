"""Maintenance passes in-process against real PostgreSQL, Redis (gate and
broker databases) and local storage: retry ordering on the broker, the
gate-full retry, promotion, lost messages, wipe repair, cleanup (also two
runs at once, in threads and in processes), and the triggers over HTTP and
the CLI.  No Celery worker consumes the queue here: the broker's lists show
what was published, at which priority."""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import redis as redis_lib
from helpers import auth, job_row, P, submit_job as _submit
from sqlalchemy import func, insert, select

from app.clock import now, set_clock
from app.config import get_settings
from app.infra.db import transaction
from app.infra.publisher import Priority, broker_priority
from app.infra.redis import dispatch as rd
from app.infra.redis import keys
from app.infra.storage import get_storage
from app.infra.tables import tasks
from app.jobs import execution
from app.jobs import service as jobs
from app.maintenance import passes as maintenance
from app.states import JobState


@pytest.fixture
def broker(settings):
    """The broker's Redis database, with this session's queue emptied."""
    b = redis_lib.Redis.from_url(settings.effective_broker_url, decode_responses=True)
    purge_queue(b, settings.queue_name)
    return b


def purge_queue(b, queue: str) -> None:
    from app.jobs import handoff

    handoff.flush()  # a submission's message leaves after its 202: lose it for real
    b.delete(queue, *[f"{queue}:{i}" for i in range(1, 10)])


def queued(b, queue: str) -> list[tuple[int, str, list]]:
    """(priority, task, args) of every message on the broker's queue, in the order a worker takes them:
    priority list 0 first, each list FIFO (LPUSH/BRPOP)."""
    from app.jobs import handoff

    handoff.flush()
    out = []
    for pri in range(10):
        key = queue if pri == 0 else f"{queue}:{pri}"
        for raw in reversed(b.lrange(key, 0, -1)):
            msg = json.loads(raw)
            out.append((pri, msg["headers"]["task"], json.loads(__import__("base64").b64decode(msg["body"]))[0]))
    return out


def _pull(model: str, n: int = 1) -> list[str]:
    """A worker's free slots take ``n`` jobs (the ring's picks, permits taken)."""
    return [j for _t, j, _a in rd.pull(model, n, 60).pulled]


HIGH, NORMAL = broker_priority(Priority.HIGH), broker_priority(Priority.NORMAL)


def _fail_once(model: str, tag: str) -> str:
    job_id = _submit(model, {"tag": tag, "fail_first": 1})
    assert execution.run_attempt(job_id, 0) == "retry_wait"
    return job_id


def _at(t):
    set_clock(lambda: t)


# --- priorities and retry ordering on the broker ----------------------------------------

def test_priority_mapping_per_transport():
    # kombu's Redis transport serves priority 0 first; RabbitMQ the highest number.
    assert broker_priority(Priority.HIGH, "redis://h/0") < broker_priority(Priority.NORMAL, "redis://h/0")
    assert broker_priority(Priority.HIGH, "amqp://h//") > broker_priority(Priority.NORMAL, "amqp://h//")
    assert broker_priority(Priority.HIGH, "rediss://h/0") == 0


def order(model: str) -> list[str]:
    """The jobs of tenant P waiting in its dispatch queue, in the order they
    will be dispatched."""
    from app.jobs import handoff

    handoff.flush()
    return redis_lib.Redis.from_url(get_settings().redis_url, decode_responses=True).zrange(
        f"asynch:dq:ready:{{{model}}}:{P.tenant_id}", 0, -1)


def test_a_head_retry_goes_before_every_waiting_job(make_model, settings):
    make_model("head", retry_times=1, retry_queue_max_seconds=0, max_concurrency=1)
    failed = _fail_once("head", "h")
    running = _submit("head", {"n": 0})
    waiting = [_submit("head", {"n": i}) for i in (1, 2, 3)]
    assert order("head") == [running, *waiting]
    assert _pull("head") == [running]  # a free slot takes it, with the one permit
    assert order("head") == waiting
    _at(job_row(failed).next_retry_at + timedelta(seconds=1))
    rep = maintenance.retry_due()
    assert rep.details["head"] == 1 and rep.processed == 1
    row = job_row(failed)
    assert row.state == JobState.PENDING and row.promoted_at is not None
    assert row.enqueue_at == row.created_at  # backdated: head of the queue
    assert order("head") == [failed, *waiting]
    assert execution.run_attempt(running) == "done"  # its permit back: the next free slot takes the retry
    assert _pull("head") == [failed] and order("head") == waiting


def test_tail_retry_waits_and_jumps_ahead_once_after_the_threshold(make_model, settings):
    make_model("tail", retry_times=1, retry_queue_max_seconds=60, max_concurrency=1)
    failed = _fail_once("tail", "t")
    running = _submit("tail", {"n": 0})
    waiting = [_submit("tail", {"n": i}) for i in (1, 2, 3)]
    assert _pull("tail") == [running]
    t0 = job_row(failed).next_retry_at + timedelta(seconds=1)
    _at(t0)
    assert maintenance.retry_due().details["tail"] == 1
    row = job_row(failed)
    assert row.promoted_at is None and row.enqueue_at == t0
    assert order("tail") == [*waiting, failed]
    _at(t0 + timedelta(seconds=59))  # not before the threshold
    assert maintenance.promote_waiting_retries().processed == 0 and order("tail")[-1] == failed
    _at(t0 + timedelta(seconds=61))  # after it: to the head, once
    assert maintenance.promote_waiting_retries().processed == 1
    assert maintenance.promote_waiting_retries().processed == 0
    assert order("tail") == [failed, *waiting]
    assert execution.run_attempt(running) == "done"
    assert _pull("tail") == [failed]
    assert execution.run_attempt(failed) == "done" and execution.run_attempt(failed) == "stale"


def test_full_gate_keeps_the_retry_waiting_never_dropped(make_model, r):
    make_model("narrow", queue_limit=1, retry_times=1, retry_queue_max_seconds=0)
    failed = _fail_once("narrow", "n")
    holder = _submit("narrow", {})
    _at(job_row(failed).next_retry_at + timedelta(seconds=1))
    for _ in range(3):
        rep = maintenance.retry_due()
        assert rep.processed == 0 and rep.details["gate_full"] == 1
        assert job_row(failed).state == JobState.RETRY_WAIT
    assert r.zrange("asynch:gate:{narrow}", 0, -1) == [holder]
    assert execution.run_attempt(holder, 0) == "done"  # frees the slot
    assert maintenance.retry_due().processed == 1
    assert job_row(failed).state == JobState.PENDING
    assert r.zrange("asynch:gate:{narrow}", 0, -1) == [failed]


def test_two_retry_passes_at_once_readmit_each_job_once(make_model, broker, settings, r):
    make_model("many", queue_limit=100, retry_times=1, retry_queue_max_seconds=0)
    failed = {_fail_once("many", f"m{i}") for i in range(40)}
    _at(max(job_row(j).next_retry_at for j in failed) + timedelta(seconds=1))
    barrier = threading.Barrier(4)
    reports = []

    def one():
        barrier.wait()
        reports.append(maintenance.retry_due(limit=5))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while maintenance.retry_due(limit=5).processed:
        pass
    assert sorted(order("many")) == sorted(failed)  # each re-admitted job queued once, none twice
    assert all(job_row(j).state == JobState.PENDING for j in failed)
    assert set(r.zrange("asynch:gate:{many}", 0, -1)) == failed


# --- lost messages and wipes ---------------------------------------------------------------

def test_a_job_that_lost_its_queue_entry_is_queued_again(make_model, r, settings):
    assert settings.republish_after_seconds == 300
    make_model("lost", max_concurrency=1)
    running = _submit("lost", {})
    job_id = _submit("lost", {})
    assert _pull("lost") == [running] and order("lost") == [job_id]
    r.delete("asynch:dq:ready:{lost}:tenant-a")  # its entry is lost
    assert maintenance.republish_stale_pending().processed == 0  # young: maybe on its way
    _at(now() + timedelta(seconds=301))
    assert maintenance.republish_stale_pending().processed == 2  # both looked at...
    assert order("lost") == [job_id]  # ...only the lost one queued (the other holds its permit)
    assert maintenance.republish_stale_pending().processed == 2  # harmless to repeat
    assert order("lost") == [job_id]


def test_the_lost_job_scan_costs_one_batch_per_pass(make_model, r):
    make_model("deep", max_concurrency=1, queue_limit=100)
    ids = [_submit("deep", {"i": i}) for i in range(25)]
    r.delete("asynch:dq:ready:{deep}:tenant-a")
    _at(now() + timedelta(seconds=301))
    seen = [maintenance.republish_stale_pending(limit=10).processed for _ in range(4)]
    assert seen == [10, 10, 5, 10]  # a cursor: the whole backlog in three passes, then over again
    assert sorted(order("deep")) == sorted(ids)


def _recovery_lines(caplog) -> list[tuple[int, str]]:
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "app.maintenance.recovery"]
    caplog.clear()
    return lines


def test_wipe_of_either_redis_is_detected_and_repaired(make_model, broker, settings, r, caplog):
    caplog.set_level(logging.INFO, logger="app.maintenance.recovery")
    make_model("wiped", queue_limit=10, max_concurrency=2)
    broker.delete(keys.epoch())  # the broker database outlives tests: start as a fresh deployment
    first = maintenance.repair_after_wipe()  # which looks like a wipe
    assert set(first.details["wiped"]) == {"redis", "broker"}
    # No job was active, so nothing was lost: a first start, said at INFO (issue 32, item 7).
    assert [(lvl, msg.split(":")[0]) for lvl, msg in _recovery_lines(caplog)] == [
        (logging.INFO, "first start of redis (redis, broker)")]
    assert maintenance.repair_after_wipe().details["wiped"] == []
    ids = [_submit("wiped", {"i": i}) for i in range(3)]
    done = _submit("wiped", {})
    assert execution.run_attempt(done) == "done"

    r.flushdb()
    purge_queue(broker, settings.queue_name)
    rep = maintenance.recover()
    assert rep.details["wipe"]["wiped"] == ["redis"]
    assert rep.details["wipe"]["requeued"] == 3
    # Pending jobs' gate slots and queue entries were lost: that is a WARNING.
    assert [(lvl, msg.split(":")[0]) for lvl, msg in _recovery_lines(caplog)] == [
        (logging.WARNING, "redis data lost (redis)")]
    assert set(r.zrange("asynch:gate:{wiped}", 0, -1)) == set(ids)
    # Queue order kept, and the model's doorbell rung: a worker's free slots will pull them.
    assert order("wiped") == ids
    assert [(t, a) for _, t, a in queued(broker, settings.queue_name)] == [("asynch.pull", ["wiped"])]

    # A broker wipe alone (its own Redis database) is seen too: the doorbell's message is gone, so it is
    # rung anew.
    broker.flushdb()
    rep = maintenance.run_work()
    assert rep.details["wipe"]["wiped"] == ["broker"]
    assert [(t, a) for _, t, a in queued(broker, settings.queue_name)] == [("asynch.pull", ["wiped"])]
    assert maintenance.run_work().details["wipe"]["wiped"] == []


def test_an_upgrade_from_the_layout_before_hash_tags_rebuilds_everything_from_the_rows(make_model, broker, r):
    """docs/operations.md, "Upgrading": a Redis written by the version before
    hash tags (asynch:epoch, asynch:gate:<model>, ...) has no mark under the
    new epoch name, so the first pass rebuilds the new keys from the rows and
    never reads the old ones."""
    make_model("upg", queue_limit=10, max_concurrency=1)
    maintenance.repair_after_wipe()
    ids = [_submit("upg", {"i": i}) for i in range(3)]
    # What the old version leaves behind, and none of the new layout.
    old = {"asynch:epoch": "old", "asynch:gate:upg": None, "asynch:tgate:upg:tenant-a": None}
    new_keys = [k for k in r.keys("asynch:*") if "{upg}" in k or k.startswith(keys.epoch())]
    r.delete(*new_keys)
    r.set("asynch:epoch", "old")
    r.zadd("asynch:gate:upg", {"stale-job": 1.0})
    r.zadd("asynch:tgate:upg:tenant-a", {"stale-job": 1.0})
    rep = maintenance.run_work()
    assert rep.details["wipe"]["wiped"] == ["redis"]
    assert set(r.zrange(keys.gate("upg"), 0, -1)) == set(ids)
    assert set(r.zrange(keys.tenant_gate("upg", "tenant-a"), 0, -1)) == set(ids)
    assert sum(rd.ready_counts("upg").values()) == 3  # every pending job queued
    for k in old:  # ignored: neither read nor rewritten
        assert r.exists(k)
    assert r.zrange("asynch:gate:upg", 0, -1) == ["stale-job"]


def test_failed_repair_is_retried_by_the_next_pass(make_model, r, monkeypatch):
    from app.maintenance import recovery

    make_model("again")
    maintenance.repair_after_wipe()
    _submit("again", {})
    r.flushdb()
    real = recovery.requeue_all_pending

    def broken(*a, **kw):
        raise redis_lib.ConnectionError("redis went away")

    monkeypatch.setattr(recovery, "requeue_all_pending", broken)
    with pytest.raises(redis_lib.ConnectionError):
        maintenance.repair_after_wipe()
    monkeypatch.setattr(recovery, "requeue_all_pending", real)
    assert maintenance.repair_after_wipe().details["requeued"] == 1


# --- cleanup ----------------------------------------------------------------------------------

def insert_job(job_id: str, state: JobState, *, location: str | None = None, **times) -> None:
    t = now()
    with transaction() as conn:
        conn.execute(insert(tasks).values(
            id=job_id, tenant_id="t", model_name="m", request_payload="{}", request_hash="h",
            state=int(state), attempt=1, created_at=t, enqueue_at=t, updated_at=t,
            result_location=location, result_content_type="text/plain" if location else None,
            **times))


def stored(job_id: str) -> str:
    return get_storage().put(f"clean/{job_id}", job_id.encode(), "text/plain")


def exists(location: str) -> bool:
    return get_storage()._path(location).exists()


def test_cleanup_deletes_what_expired_and_nothing_else(settings):
    from app.config import set_settings

    set_settings(settings.with_overrides(failed_retention_seconds=3600, done_retention_seconds=7200))
    t = now()
    old, young = t - timedelta(hours=3), t - timedelta(minutes=5)
    plan = {  # id: (state, extra columns, should go)
        "claimed-old": (JobState.CLAIMED, {"expire_at": t - timedelta(seconds=1), "finished_at": old}, True),
        "claimed-new": (JobState.CLAIMED, {"expire_at": t + timedelta(hours=1), "finished_at": old}, False),
        "failed-old": (JobState.FAILED, {"finished_at": old}, True),
        "timeout-old": (JobState.TIMEOUT, {"finished_at": old}, True),
        "canceled-old": (JobState.CANCELED, {"finished_at": old}, True),
        "failed-new": (JobState.FAILED, {"finished_at": young}, False),
        "done-old": (JobState.DONE, {"finished_at": t - timedelta(hours=3)}, True),
        "done-2h-ish": (JobState.DONE, {"finished_at": t - timedelta(minutes=110)}, False),
        "pending": (JobState.PENDING, {"deadline_at": t + timedelta(hours=1)}, False),
        "retry-wait": (JobState.RETRY_WAIT, {"next_retry_at": old}, False),
    }
    locations = {}
    for jid, (state, cols, _) in plan.items():
        with_object = state in (JobState.CLAIMED, JobState.DONE, JobState.CANCELED)
        locations[jid] = stored(jid) if with_object else None
        insert_job(jid, state, location=locations[jid], **cols)
    # An object already gone is not an error.
    get_storage().delete(locations["canceled-old"])

    rep = maintenance.cleanup()
    assert rep.details["claimed"] == 1 and rep.details["failed"] == 3 and rep.details["done"] == 1
    assert rep.details["object_errors"] == 0
    with transaction() as conn:
        left = {x.id for x in conn.execute(select(tasks.c.id))}
    assert left == {jid for jid, (_, _, go) in plan.items() if not go}
    for jid, loc in locations.items():
        if loc and jid != "canceled-old":
            assert exists(loc) == (jid in left), jid
    assert maintenance.cleanup().processed == 0


def test_cleanup_keeps_a_job_whose_object_could_not_be_deleted(monkeypatch):
    from app.infra.storage import StorageError

    loc = stored("sticky")
    insert_job("sticky", JobState.CLAIMED, location=loc, expire_at=now() - timedelta(seconds=5))
    storage = get_storage()
    real = storage.delete

    def failing(location):
        raise StorageError("s3 delete failed: injected")

    monkeypatch.setattr(storage, "delete", failing)
    rep = maintenance.cleanup()
    assert rep.details["claimed"] == 0 and rep.details["object_errors"] == 1
    assert job_row("sticky") is not None
    monkeypatch.setattr(storage, "delete", real)
    assert maintenance.cleanup().details["claimed"] == 1
    assert job_row("sticky") is None and not exists(loc)


def test_overdue_pending_and_running_time_out_and_release_their_slots(make_model, r):
    make_model("slow", queue_limit=5)
    a, b = _submit("slow", {}), _submit("slow", {})
    with transaction() as conn:
        from app import transitions

        transitions.claim(conn, b, 0, now() + timedelta(days=2))
    _at(job_row(a).deadline_at + timedelta(seconds=1))
    rep = maintenance.cleanup()
    assert rep.details["timeouts"] == 2
    assert {job_row(a).state, job_row(b).state} == {JobState.TIMEOUT}
    assert r.zcard("asynch:gate:{slow}") == 0


def _expired_population(n_expired: int, n_kept: int) -> tuple[dict, dict]:
    t = now()
    expired, kept = {}, {}
    rows = []
    for i in range(n_expired + n_kept):
        jid = f"job_c{i:04d}"
        loc = stored(jid)
        go = i < n_expired
        (expired if go else kept)[jid] = loc
        rows.append(dict(id=jid, tenant_id="t", model_name="m", request_payload="{}", request_hash="h",
                         state=int(JobState.CLAIMED), attempt=1, created_at=t, enqueue_at=t, updated_at=t,
                         result_location=loc, claimed_at=t,
                         expire_at=t - timedelta(seconds=60) if go else t + timedelta(hours=1)))
    with transaction() as conn:
        conn.execute(insert(tasks), rows)
    return expired, kept


def _assert_exactly_once(expired: dict, kept: dict, deletes: Counter, reported: list[int]) -> None:
    assert set(deletes) == set(expired.values())                 # nothing unexpired touched
    assert all(n == 1 for n in deletes.values()), deletes.most_common(3)  # each object once
    assert sum(reported) == len(expired)                          # each row deleted once
    assert all(n > 0 for n in reported), reported                 # the two runs really overlapped
    with transaction() as conn:
        left = {x.id for x in conn.execute(select(tasks.c.id))}
    assert left == set(kept)
    assert not any(exists(loc) for loc in expired.values())
    assert all(exists(loc) for loc in kept.values())


def test_two_cleanups_in_threads_delete_each_expired_job_and_object_once(settings, monkeypatch):
    from app.config import set_settings

    set_settings(settings.with_overrides(maintenance_batch=10))
    expired, kept = _expired_population(200, 50)
    storage = get_storage()
    real, deletes, lock = storage.delete, Counter(), threading.Lock()

    def counting(location):
        with lock:
            deletes[location] += 1
        time.sleep(0.002)  # widen the window in which both runs are busy
        return real(location)

    monkeypatch.setattr(storage, "delete", counting)
    barrier, reported = threading.Barrier(2), []

    def run():
        barrier.wait()
        reported.append(maintenance.cleanup().details["claimed"])

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_exactly_once(expired, kept, deletes, reported)


def _cleanup_in_child(start, out):
    from app.config import load_settings, set_settings
    from app.infra.storage import get_storage as storage_of
    from app.maintenance import passes as m

    set_settings(load_settings().with_overrides(maintenance_batch=10))
    storage = storage_of()
    real, calls = storage.delete, []

    def counting(location):
        calls.append(location)
        time.sleep(0.003)
        return real(location)

    storage.delete = counting
    start.wait()
    out.put((m.cleanup().details["claimed"], calls))


@pytest.mark.slow
def test_two_cleanups_in_processes_delete_each_expired_job_and_object_once():
    expired, kept = _expired_population(300, 50)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_cleanup_in_child, args=(start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    deletes = Counter(loc for _, calls in results for loc in calls)
    _assert_exactly_once(expired, kept, deletes, [n for n, _ in results])


# --- triggers ------------------------------------------------------------------------------------

def test_seed_triggers_use_the_envelope_and_need_an_admin(client, admin_key, user_key, make_model):
    make_model("m")
    for path in ("/task/runWork", "/task/cleanWork", "/model/autoTune"):
        assert client.post(path, headers=auth(user_key)).status_code == 403
        assert client.post(path).status_code == 401
        resp = client.post(path, headers=auth(admin_key))
        assert resp.status_code == 200, resp.get_json()
        body = resp.get_json()
        assert body["code"] == 0 and body["message"] == "ok" and "processed" in body["data"]
    data = client.post("/task/runWork", headers=auth(admin_key)).get_json()["data"]
    assert {"wipe", "retry", "promoted", "republished"} <= set(data)
    data = client.post("/task/cleanWork", headers=auth(admin_key)).get_json()["data"]
    assert {"cleanup", "recover"} <= set(data)
    data = client.post("/model/autoTune", json={"windowSeconds": 0, "dryRun": True},
                       headers=auth(admin_key)).get_json()["data"]
    assert data["window_seconds"] == 3600 and data["dry_run"] is True


def test_trigger_bodies_are_validated(client, admin_key, r):
    bad = client.post("/model/autoTune", json={"windowSeconds": "abc", "dryRun": "yes"}, headers=auth(admin_key))
    assert bad.status_code == 422
    assert {e["pointer"] for e in bad.get_json()["errors"]} == {"/windowSeconds", "/dryRun"}
    assert client.post("/model/autoTune", data="[1]", headers={**auth(admin_key), "Content-Type": "application/json"}
                       ).status_code == 400
    bad = client.post("/v1/maintenance/autotune", json={"window_seconds": 1.5}, headers=auth(admin_key))
    assert bad.status_code == 422 and bad.get_json()["errors"][0]["pointer"] == "/window_seconds"
    assert client.get("/v1/maintenance/runs?limit=0", headers=auth(admin_key)).status_code == 422
    assert r.keys("asynch:runtime:*") == []  # nothing written by a refused request


def test_v1_maintenance_routes(client, admin_key, user_key, make_model):
    make_model("m")
    for name in ("retry", "recover", "cleanup", "reconcile", "autotune"):
        assert client.post(f"/v1/maintenance/{name}", headers=auth(user_key)).status_code == 403
        resp = client.post(f"/v1/maintenance/{name}", headers=auth(admin_key))
        assert resp.status_code == 200 and "processed" in resp.get_json(), name
    assert client.post("/v1/maintenance/nope", headers=auth(admin_key)).status_code == 404
    assert client.get("/v1/maintenance/retry", headers=auth(admin_key)).status_code == 405
    assert client.get("/v1/maintenance/runs", headers=auth(admin_key)).get_json() == {"runs": []}


def test_cli_cleanup_and_autotune(test_env, make_model, r):
    import os
    import subprocess
    import sys

    from helpers import ROOT

    make_model("m")
    env = {**os.environ, **test_env}

    def asynch(*args):
        out = subprocess.run([sys.executable, "-m", "app.cli", "maintenance", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert asynch("cleanup")["processed"] == 0
    dry = asynch("autotune", "--window", "600", "--dry-run")
    assert dry["window_seconds"] == 600 and dry["dry_run"] is True and dry["models"][0]["model"] == "m"
    assert asynch("retry")["processed"] == 0
    assert r.keys("asynch:runtime:*") == []
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0
