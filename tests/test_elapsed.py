"""A job's ``elapsed_ms`` never steps back because a row was answered later
than it was read (issue 32 item 8).

A job that has not ended shows its elapsed time up to the read of its row
(app/infra/tables.py ``read_at``), not up to the moment the answer is
rendered: a long-poll whose budget ends answers the last row it saw, and
when the job ended meanwhile without a wake-up reaching the waiter (a lost
publish), that stale running row was shown with the elapsed time at the
budget's end -- up to the whole budget more than the done row the next poll
shows.  Real API server (in-process), PostgreSQL and Redis; the job is moved
by hand through the transitions a worker uses, and its terminal wake-up is
deliberately not published.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import requests
from helpers import auth, submit, wait_until

from app import transitions
from app.clock import now
from app.infra.db import transaction
from app.infra.wakeups import hub

BUDGET_MS = 1500


def test_a_long_polls_last_row_shows_its_elapsed_time_as_read_not_as_answered(api_url, make_model, user_key):
    make_model("el")
    job_id = submit(api_url, user_key, "el", {"q": 1}).json()["job_id"]
    with transaction() as conn:  # pending -> running, as a worker's claim
        assert transitions.claim(conn, job_id, 0, now() + timedelta(minutes=10)) is not None
    answer: dict = {}

    def wait():
        answer["body"] = requests.get(f"{api_url}/v1/models/el/jobs/{job_id}/wait?timeout={BUDGET_MS}",
                                      headers=auth(user_key), timeout=30).json()

    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: job_id in hub.jobs, timeout=10, interval=0.01, what="the wait registered and reading")
    # running -> done, committed, and no wake-up published (the effects are not run): the wait
    # answers at its budget's end with the running row it read.
    with transaction() as conn:
        assert transitions.complete(conn, job_id, 1, location="x", content_type="application/json", size=0)
    t.join(30)
    waited = answer["body"]
    done = requests.get(f"{api_url}/v1/models/el/jobs/{job_id}", headers=auth(user_key), timeout=10).json()
    assert (waited["state"], done["state"]) == ("running", "done")
    assert waited["elapsed_ms"] <= done["elapsed_ms"], (waited, done)
    # The next polls only grow (done is final).
    again = requests.get(f"{api_url}/v1/models/el/jobs/{job_id}", headers=auth(user_key), timeout=10).json()
    assert again["elapsed_ms"] == done["elapsed_ms"]
