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


# --- the hand-off: admissions handed to their queues after the 202, batched; one doorbell per model --------

def _bells(settings) -> list[tuple[str, list]]:
    """(task, args) of every message on the session's queue, in serving order."""
    import base64

    b = redis_lib.Redis.from_url(settings.effective_broker_url)
    out = []
    for key in [settings.queue_name] + [f"{settings.queue_name}:{i}" for i in range(1, 10)]:
        for raw in reversed(b.lrange(key, 0, -1)):
            msg = json.loads(raw)
            out.append((msg["headers"]["task"], json.loads(base64.b64decode(msg["body"]))[0]))
    return out


def _queued(model: str, tenant: str) -> list[str]:
    from app.infra.redis import dispatch as rd

    return [j for j, _s in rd.get_redis().zrange(rd.keys.dispatch_ready(model, tenant), 0, -1, withscores=True)]


@pytest.fixture
def empty_queue(settings):
    from app.infra.redis import dispatch as rd
    from app.jobs import handoff

    handoff.flush()
    rd.set_cap("ob", 10_000)  # a max_concurrency no test here reaches
    b = redis_lib.Redis.from_url(settings.effective_broker_url)
    b.delete(settings.queue_name, *[f"{settings.queue_name}:{i}" for i in range(1, 10)])
    yield
    b.delete(settings.queue_name, *[f"{settings.queue_name}:{i}" for i in range(1, 10)])


def test_outbox_queues_every_job_once_in_few_steps_and_rings_one_doorbell(settings, empty_queue, monkeypatch):
    import threading

    from app.infra.redis import dispatch as rd
    from app.jobs import handoff

    steps, real = [], rd.enqueue

    def recording(model, entries, **kw):
        steps.append(len(list(entries)))
        return real(model, entries, **kw)

    monkeypatch.setattr(rd, "enqueue", recording)
    barrier = threading.Barrier(8)

    def send(t):
        barrier.wait()
        for i in range(100):
            handoff.send_many([("ob", (f"tenant{t}", f"job_t{t}_{i}", float(i), "0", ""))])

    threads = [threading.Thread(target=send, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handoff.flush(10)
    for t in range(8):  # every job queued once, each thread's in the order it sent them
        assert _queued("ob", f"tenant{t}") == [f"job_t{t}_{i}" for i in range(100)]
    assert sum(steps) == 800 and len(steps) < 800, steps
    assert _bells(settings) == [("asynch.pull", ["ob"])]  # no message per job: one doorbell for the model


def test_a_doorbell_the_broker_refused_is_rung_by_the_next_step(settings, empty_queue, monkeypatch):
    from app.infra import publisher
    from app.jobs import handoff

    class Down:
        def lpush(self, *a):
            raise redis_lib.ConnectionError("broker down (injected)")

    import dataclasses

    real = publisher._current.get()
    monkeypatch.setattr(publisher._current, "_value", dataclasses.replace(real, broker=Down()))
    handoff.send_many([("ob", ("t", "job_refused", 1.0, "0", ""))])
    assert handoff.flush(5)  # the doorbell refused, logged; the job is in its queue all the same
    monkeypatch.undo()
    assert _bells(settings) == [] and _queued("ob", "t") == ["job_refused"]
    handoff.send_many([("ob", ("t", "job_after", 2.0, "0", ""))])
    assert handoff.flush(5)
    assert _bells(settings) == [("asynch.pull", ["ob"])]  # not held back by the refused one
    assert _queued("ob", "t") == ["job_refused", "job_after"]


def _send_in_child(out):
    from app.jobs import handoff

    handoff.send_many([("ob", ("t", "job_from_child", 2.0, "0", ""))])
    out.put(handoff.flush(10))


def test_a_forked_child_gets_its_own_sender(settings, empty_queue):
    import multiprocessing as mp

    from app.jobs import handoff

    handoff.send_many([("ob", ("t", "job_from_parent", 1.0, "0", ""))])  # the parent's sender thread exists before the fork
    assert handoff.flush(5)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_send_in_child, args=(q,))
    p.start()
    assert q.get(timeout=20) is True
    p.join(10)
    assert p.exitcode == 0
    assert _queued("ob", "t") == ["job_from_parent", "job_from_child"]
