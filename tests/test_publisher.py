"""The Redis fast path writes exactly what Celery's producer writes."""
from __future__ import annotations

import json

import pytest
import redis as redis_lib
from celery import Celery
from helpers import REDIS_BASE, redis_db

from app.infra.celery_config import RUN_JOB_TASK, celery_settings
from app.infra.publisher import redis_message

SCRATCH_DB = 7


@pytest.mark.parametrize("priority", [None, 0, 3, 9])
def test_fast_message_matches_celery_send_task(settings, priority):
    s = settings.with_overrides(broker_url=f"{REDIS_BASE}/{SCRATCH_DB}", queue_name="probe-q")
    r = redis_db(SCRATCH_DB)
    r.delete(*[k for k in r.keys("probe-q*")] or ["probe-q"])
    app = Celery("probe", set_as_current=False)
    app.conf.update(celery_settings(s))
    kw = {} if priority is None else {"priority": priority}
    app.send_task(RUN_JOB_TASK, args=["job_x", 2], queue="probe-q", **kw)
    [celery_key] = [k.decode() for k in r.keys("probe-q*") if r.type(k) == b"list"]
    theirs = json.loads(r.lpop(celery_key))
    key, payload = redis_message(RUN_JOB_TASK, ["job_x", 2], "probe-q", priority)
    ours = json.loads(payload)
    assert key == celery_key
    assert ours["body"] == theirs["body"]
    for part in ("headers", "properties"):
        assert set(ours[part]) == set(theirs[part])
        for k, v in theirs[part].items():
            if k in ("id", "root_id", "correlation_id", "delivery_tag", "reply_to", "origin"):
                assert type(ours[part][k]) is type(v)
            else:
                assert ours[part][k] == v, (part, k)
    assert {k: v for k, v in ours.items() if k not in ("headers", "properties")} == \
        {k: v for k, v in theirs.items() if k not in ("headers", "properties")}
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]


# --- the outbox: admissions' messages sent after the 202, batched ----------------------------

def _queued_args(settings) -> list:
    """[job_id, attempt] of every job of every run_jobs message on the session's queue, in serving order."""
    import base64

    b = redis_lib.Redis.from_url(settings.effective_broker_url)
    out = []
    for key in [settings.queue_name] + [f"{settings.queue_name}:{i}" for i in range(1, 10)]:
        for raw in reversed(b.lrange(key, 0, -1)):
            out.extend(json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0])
    return out


@pytest.fixture
def empty_queue(settings):
    from app.config import set_settings
    from app.infra.redis import dispatch as rd
    from app.jobs import outbox

    outbox.flush()
    # Room for every message: a window and a max_concurrency no test here reaches.
    set_settings(settings.with_overrides(dispatch_window=10_000))
    rd.set_cap("ob", 10_000)
    b = redis_lib.Redis.from_url(settings.effective_broker_url)
    b.delete(settings.queue_name, *[f"{settings.queue_name}:{i}" for i in range(1, 10)])
    yield
    b.delete(settings.queue_name, *[f"{settings.queue_name}:{i}" for i in range(1, 10)])


def test_outbox_sends_every_message_once_in_few_lpushes_from_many_threads(settings, empty_queue, monkeypatch):
    import threading

    from app.infra import publisher
    from app.jobs import outbox

    batches, real = [], publisher.publish_run_jobs

    def recording(jobs, *a, **kw):
        batches.append(len(jobs))
        return real(jobs, *a, **kw)

    monkeypatch.setattr(publisher, "publish_run_jobs", recording)
    barrier = threading.Barrier(8)

    def send(t):
        barrier.wait()
        for i in range(100):
            outbox.send_many([("ob", (f"tenant{t}", f"job_t{t}_{i}", float(i), "0", ""))])

    threads = [threading.Thread(target=send, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outbox.flush(10)
    got = _queued_args(settings)
    assert sorted(map(tuple, got)) == sorted((f"job_t{t}_{i}", 0) for t in range(8) for i in range(100))
    for t in range(8):  # each thread's messages are served in the order it sent them
        mine = [a[0] for a in got if a[0].startswith(f"job_t{t}_")]
        assert mine == [f"job_t{t}_{i}" for i in range(100)]
    assert sum(batches) == 800 and len(batches) < 800, batches


def test_outbox_survives_a_refused_batch_and_flush_still_returns(settings, empty_queue, monkeypatch):
    from app.infra import publisher
    from app.jobs import outbox

    class Down:
        def lpush(self, *a):
            raise redis_lib.ConnectionError("broker down (injected)")

    import dataclasses

    real = publisher._current.get()
    monkeypatch.setattr(publisher._current, "_value", dataclasses.replace(real, broker=Down()))
    outbox.send_many([("ob", ("t", "job_refused", 1.0, "0", ""))])
    assert outbox.flush(5)  # refused, logged: the dispatcher re-queues it when its lease ends
    monkeypatch.undo()
    outbox.send_many([("ob", ("t", "job_after", 2.0, "0", ""))])
    assert outbox.flush(5)
    assert _queued_args(settings) == [["job_after", 0]]


def _send_in_child(out):
    from app.jobs import outbox

    outbox.send_many([("ob", ("t", "job_from_child", 2.0, "0", ""))])
    out.put(outbox.flush(10))


def test_a_forked_child_gets_its_own_sender(settings, empty_queue):
    import multiprocessing as mp

    from app.jobs import outbox

    outbox.send_many([("ob", ("t", "job_from_parent", 1.0, "0", ""))])  # the parent's sender thread exists before the fork
    assert outbox.flush(5)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_send_in_child, args=(q,))
    p.start()
    assert q.get(timeout=20) is True
    p.join(10)
    assert p.exitcode == 0
    assert _queued_args(settings) == [["job_from_parent", 0], ["job_from_child", 0]]


@pytest.mark.parametrize("group, sizes", [(4, [4, 3, 3]), (8, [5, 5]), (1, [1] * 10), (64, [10])])
def test_one_dispatch_step_goes_out_in_as_few_even_groups_as_the_size_allows(settings, empty_queue, group, sizes):
    """Ten jobs of one step: ceil(10 / group) run_jobs messages, each about as large (every pool process gets
    work), in one LPUSH, served in dispatch order (the first message holds the first picks)."""
    import base64

    from app.config import set_settings
    from app.infra import publisher

    set_settings(settings.with_overrides(dispatch_group=group))
    jobs = [(f"job_g{i}", i % 3) for i in range(10)]
    assert publisher.publish_run_jobs(jobs) == 10
    b = redis_lib.Redis.from_url(settings.effective_broker_url)
    key = settings.queue_name + ":" + str(publisher.broker_priority(publisher.Priority.NORMAL))
    groups = [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0] for raw in reversed(b.lrange(key, 0, -1))]
    assert [len(g) for g in groups] == sizes
    assert [tuple(j) for g in groups for j in g] == jobs
