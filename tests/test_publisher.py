"""The Redis fast path writes exactly what Celery's producer writes."""
from __future__ import annotations

import json

import pytest
import redis as redis_lib
from celery import Celery

from app.celery_config import RUN_JOB_TASK, celery_settings
from app.publisher import redis_message

SCRATCH_DB = 7


@pytest.mark.parametrize("priority", [None, 0, 3, 9])
def test_fast_message_matches_celery_send_task(settings, priority):
    s = settings.with_overrides(broker_url=f"redis://127.0.0.1:6379/{SCRATCH_DB}", queue_name="probe-q")
    r = redis_lib.Redis(db=SCRATCH_DB)
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
