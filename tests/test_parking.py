"""Parked long-polls (app/infra/parking.py) on a real gunicorn gevent API
server: a sleeping /wait is kept as a small record and answered by the
wake-up hub.  What a client sees must not change: the same status, headers
and body as the unparked path; the budget's end answers the last row seen;
a job deleted meanwhile is a 404; every place under the caps comes back."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from api_process import ApiProcess, finish_by_hand, run_by_hand
from helpers import auth, make_key, publish_terminal, submit, wait_until
from sqlalchemy import delete
from test_serving import _parked, _raw_wait, _read_answer

from app.infra.db import transaction
from app.infra.tables import tasks

pytestmark = pytest.mark.e2e

# Headers that differ between any two responses.
VOLATILE = {"date", "x-request-id", "content-length", "connection"}


def _metric(base: str, name: str) -> float:
    text = requests.get(f"{base}/metrics", timeout=10).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " ")
               or ln.startswith(name + "{"))


def _head(sock_answer: bytes) -> dict:
    head = sock_answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head)}


def _raw_answer(s) -> bytes:
    s.settimeout(10)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.fixture
def api(test_env, tmp_path):
    proc = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1).start()
    yield proc
    proc.stop()


def test_a_parked_wait_answers_as_the_unparked_path_does(api, make_model):
    make_model("pk")
    key = make_key("tenant-a")
    job = submit(api.base, key, "pk", {}).json()["job_id"]
    run_by_hand(job)
    before = _metric(api.base, "asynch_waits_parked_total")
    s = _raw_wait(api.base, key, "pk", job, 30000)
    wait_until(lambda: _parked(api.base) == 1, what="the wait parked")
    assert _metric(api.base, "asynch_waits_parked_total") == before + 1, "the wait was not parked"
    finish_by_hand(job)
    raw = _raw_answer(s)  # the server closes the connection after the answer
    s.close()
    status = int(raw.split()[1])
    body = raw.split(b"\r\n\r\n", 1)[1]
    poll = requests.get(f"{api.base}/v1/models/pk/jobs/{job}", headers=auth(key), timeout=10)
    assert status == 200 and body == poll.content, (body, poll.content)
    parked_headers = {k: v for k, v in _head(raw).items() if k not in VOLATILE}
    poll_headers = {k.lower(): v for k, v in poll.headers.items() if k.lower() not in VOLATILE}
    assert parked_headers == poll_headers
    assert _head(raw)["x-content-type-options"] == "nosniff"  # the app's after-request headers (issue 21)
    assert _head(raw)["content-length"] == str(len(body)) and _head(raw)["connection"] == "close"
    wait_until(lambda: _parked(api.base) == 0, what="the place back")


def test_the_budgets_end_answers_the_last_row_seen(api, make_model):
    make_model("pk2")
    key = make_key("tenant-a")
    job = submit(api.base, key, "pk2", {}).json()["job_id"]
    run_by_hand(job)
    t0 = time.monotonic()
    r = requests.get(f"{api.base}/v1/models/pk2/jobs/{job}/wait?timeout=1500", headers=auth(key), timeout=10)
    took = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert 1.4 <= took < 3.0, took
    assert _parked(api.base) == 0


def test_a_job_deleted_while_parked_is_a_404(api, make_model):
    make_model("pk3")
    key = make_key("tenant-a")
    job = submit(api.base, key, "pk3", {}).json()["job_id"]
    run_by_hand(job)
    s = _raw_wait(api.base, key, "pk3", job, 30000)
    wait_until(lambda: _parked(api.base) == 1, what="the wait parked")
    with transaction() as conn:
        conn.execute(delete(tasks).where(tasks.c.id == job))
    publish_terminal(job)  # a bare id: the hub reads the row, which is gone
    status, body = _read_answer(s)
    s.close()
    assert status == 404 and body == {"error": f"job not found: {job}"}, (status, body)
    wait_until(lambda: _parked(api.base) == 0, what="the place back")


def test_many_parked_waits_all_answer_and_give_their_places_back(api, make_model):
    """600 parked waits on 30 jobs, the jobs finished one by one: every wait
    answers done, and the waiter gauge returns to 0 (no place leaked)."""
    make_model("pk4", queue_limit=100)
    key = make_key("tenant-a")
    ids = [submit(api.base, key, "pk4", {}).json()["job_id"] for _ in range(30)]
    for j in ids:
        run_by_hand(j)
    socks = [_raw_wait(api.base, key, "pk4", ids[i % 30], 60000) for i in range(600)]
    wait_until(lambda: _parked(api.base) == 600, timeout=30, what="600 waits parked")
    for j in ids:
        finish_by_hand(j)
    with ThreadPoolExecutor(16) as ex:
        answers = list(ex.map(_read_answer, socks))
    for s in socks:
        s.close()
    assert [st for st, b in answers if st != 200 or b["state"] != "done"] == []
    assert {b["job_id"] for _, b in answers} == set(ids)
    wait_until(lambda: _parked(api.base) == 0, what="every place back")


def test_parking_can_be_turned_off(test_env, tmp_path, make_model):
    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1,
                     extra_env={"ASYNCH_WAIT_PARKING": "false"}).start()
    try:
        make_model("pk5")
        key = make_key("tenant-a")
        job = submit(api.base, key, "pk5", {}).json()["job_id"]
        run_by_hand(job)
        s = _raw_wait(api.base, key, "pk5", job, 30000)
        wait_until(lambda: _parked(api.base) == 1, what="the wait registered")
        finish_by_hand(job)
        status, body = _read_answer(s)
        s.close()
        assert status == 200 and body["state"] == "done"
        assert _metric(api.base, "asynch_waits_parked_total") == 0
    finally:
        api.stop()
