"""A read never needs a write (issue 32 item 8).

While PostgreSQL could not write (its disk full), a done job still polled
as done but ``GET .../result`` answered 503 (130 of 146 reads in one run):
reading a result also wrote its last-read time (``read_result_row`` ->
``mark_read``).  Here the suite's own PostgreSQL refuses every write of new
sessions to the test database (``default_transaction_read_only``, set on
the database by the admin connection and reset in a ``finally``; the
test's pools are reopened so every statement runs on such a session), and
the reads of a done job must all still answer.  No worker runs in this
module: the job is run in-process before the database turns read-only.
"""
from __future__ import annotations

from contextlib import contextmanager

import psycopg2
import pytest
from helpers import TEST_DB, auth, job_row
from sqlalchemy import update
from sqlalchemy.exc import DBAPIError

import helpers
from app.clock import now
from app.infra.db import get_engine, reset_engine
from app.infra.tables import tasks
from app.jobs import execution
from app.jobs import service as jobs
from app.states import JobState
from app.tenancy.keys import Principal

USER = Principal("tenant-a", "user", None)


def _set_read_only(on: bool) -> None:
    conn = psycopg2.connect(helpers.PG_ADMIN_DSN)
    conn.autocommit = True
    with conn.cursor() as cur:
        verb = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
        cur.execute(f'ALTER DATABASE "{TEST_DB}" {verb}')
    conn.close()
    reset_engine()  # pooled sessions keep the setting they started with: new ones take it


@contextmanager
def read_only_database():
    _set_read_only(True)
    try:
        yield
    finally:
        _set_read_only(False)


def test_a_done_jobs_reads_answer_while_the_database_cannot_write(client, make_model, user_key):
    make_model("m")
    job_id = jobs.submit(USER, "m", {"q": "read me"}).row.id
    assert execution.run_attempt(job_id, 0) == "done"
    h = auth(user_key)
    with read_only_database():
        with pytest.raises(DBAPIError, match="read-only transaction"):  # the database really refuses writes
            with get_engine().begin() as conn:
                conn.execute(update(tasks).where(tasks.c.id == job_id).values(last_read_at=now()))
        for _ in range(3):
            poll = client.get(f"/v1/models/m/jobs/{job_id}", headers=h)
            assert poll.status_code == 200 and poll.get_json()["state"] == "done", poll.get_data(as_text=True)
            result = client.get(f"/v1/models/m/jobs/{job_id}/result", headers=h)
            assert result.status_code == 200, result.get_data(as_text=True)
            assert result.get_json()["echo"] == {"q": "read me"}
            seed = client.get(f"/task/getTaskResult?taskId={job_id}", headers=h)
            assert seed.status_code == 200 and seed.get_json()["data"]["state"] == int(JobState.DONE), seed.get_json()
        # A write while it cannot write is a 503 (the database is unavailable for it), never a 500.
        refused = client.post("/v1/models/m/jobs", json={"q": 2}, headers=h)
        assert refused.status_code == 503, (refused.status_code, refused.get_data(as_text=True))
    # Writable again: the next read marks it as before.
    assert client.get(f"/v1/models/m/jobs/{job_id}/result", headers=h).status_code == 200
    assert job_row(job_id).last_read_at is not None
