"""Logs are JSON lines carrying job_id/model/tenant/attempt, and no secret
(API key, head_msg value, modelKey) ever reaches them: neither the API's
(in process, at DEBUG) nor a worker process's (its log file, at DEBUG)."""
from __future__ import annotations

import io
import json
import logging

import pytest
from helpers import WorkerProcess, auth, job_row, wait_until

from app.infra.logs import bind, json_handler, mask_secrets, reset

HEAD_SECRET = "hm-SECRET-7f3a9c"
MODEL_KEY_SECRET = "mk-SECRET-42d1e8"
BAD_SPEC_SECRET = "bad-SECRET-99aa"


@pytest.fixture
def api_log():
    """Everything the API process logs, as our JSON handler writes it."""
    buf = io.StringIO()
    h = json_handler(buf)
    root = logging.getLogger()
    old = root.level
    root.addHandler(h)
    root.setLevel(logging.DEBUG)
    yield buf
    root.removeHandler(h)
    root.setLevel(old)


def _lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


@pytest.mark.e2e
def test_no_secret_in_api_or_worker_logs_and_job_fields_present(
        client, make_model, user_key, test_env, tmp_path, api_log):
    worker_log = tmp_path / "worker.log"
    w = WorkerProcess({**test_env, "ASYNCH_LOG_LEVEL": "DEBUG"}, concurrency=1, log_path=worker_log).start()
    try:
        make_model("echo", head_msg=f"X-Secret:{HEAD_SECRET}", retry_times=0, model_key_headers="X-Job")
        make_model("getter", http_method="GET", head_msg=f"X-Secret:{HEAD_SECRET}", retry_times=0,
                   model_key_headers="X-Job")
        h = {**auth(user_key), "X-Model-Key": f"X-Job:{MODEL_KEY_SECRET}"}
        done = client.post("/v1/models/echo/jobs", json={"prompt": "hi"}, headers=h).get_json()
        failed = client.post("/v1/models/echo/jobs", json={"status": 500}, headers=h).get_json()
        got = client.post("/v1/models/getter/jobs", json={"q": 1}, headers=h).get_json()
        bad = client.post("/v1/models/echo/jobs", json={"a": 1},
                          headers={**auth(user_key), "X-Model-Key": f"no-colon-{BAD_SPEC_SECRET}"})
        assert bad.status_code == 422
        forged = user_key[:16] + "forgedforgedforgedforged"
        assert client.get("/v1/jobs", headers=auth(forged)).status_code == 401
        for job in (done, failed, got):
            wait_until(lambda j=job: job_row(j["job_id"]).state in (2, 3), timeout=30, what="terminal")
            client.get(job["poll_url"] + "/wait?timeout=1000", headers=auth(user_key))
        assert job_row(done["job_id"]).state == 2 and job_row(failed["job_id"]).state == 3
        client.get(done["result_url"], headers=auth(user_key))
        # The worker logs just after its commit: let it finish before stopping it.
        finals = {done["job_id"]: "job done", failed["job_id"]: "job failed", got["job_id"]: "job done"}
        wait_until(lambda: all(any(d.get("job_id") == j and d["msg"].startswith(m)
                                   for d in _lines(worker_log.read_text(errors="replace")))
                               for j, m in finals.items()), timeout=20, what="worker log lines")
    finally:
        w.stop()

    api_text = api_log.getvalue()
    worker_text = worker_log.read_text(errors="replace")
    for secret in (HEAD_SECRET, MODEL_KEY_SECRET, BAD_SPEC_SECRET, user_key, user_key.split("_", 2)[2], forged):
        assert secret not in api_text, f"{secret} in API log"
        assert secret not in worker_text, f"{secret} in worker log"

    api = _lines(api_text)
    admitted = [d for d in api if d["msg"] == "job admitted" and d.get("job_id") == done["job_id"]]
    assert admitted and admitted[0]["model"] == "echo" and admitted[0]["tenant"] == "tenant-a"
    polled = [d for d in api if d["logger"] == "asynch.request" and d.get("job_id") == done["job_id"]]
    assert polled and all(d["model"] == "echo" and d["tenant"] == "tenant-a" for d in polled)

    work = _lines(worker_text)
    finished = [d for d in work if d.get("job_id") == done["job_id"] and d["msg"] == "job done"]
    assert finished and finished[0] | {"model": "echo", "tenant": "tenant-a", "attempt": 1} == finished[0]
    failed_line = [d for d in work if d.get("job_id") == failed["job_id"] and d["msg"].startswith("job failed")]
    assert failed_line and failed_line[0]["attempt"] == 1 and failed_line[0]["tenant"] == "tenant-a"
    # Lines logged on a call's thread without extra= still carry the job (bound per call): a process's
    # slots, here in this process at DEBUG.
    from app.jobs import slots

    here = slots.Slots()
    mine = client.post("/v1/models/echo/jobs", json={"prompt": "here"}, headers=auth(user_key)).get_json()["job_id"]
    from app.jobs import handoff

    assert handoff.flush()  # queued in the dispatcher (by the outbox's thread) before the pull
    here.answer_bell("echo", "here#1")
    wait_until(lambda: job_row(mine).state == 2, what="the job run here")
    here.drain(10)
    assert any(d.get("job_id") == mine and d["msg"] == "calling the model" and "attempt" not in d
               and d["tenant"] == "tenant-a" for d in _lines(api_log.getvalue()))


def test_secret_shapes_are_masked_and_context_binds():
    key = "ak_0123456789ab_" + "S" * 40
    assert mask_secrets(f"key={key} auth=Bearer abc.def") == "key=ak_0123456789ab_*** auth=Bearer ***"
    buf = io.StringIO()
    log = logging.getLogger("asynch.test.bind")
    log.addHandler(json_handler(buf))
    log.propagate = False
    try:
        token = bind(job_id="job_1", tenant="t")
        log.warning("inside %s", key)
        reset(token)
        log.warning("outside")
    finally:
        log.propagate = True
    inside, outside = _lines(buf.getvalue())
    assert inside["job_id"] == "job_1" and inside["tenant"] == "t" and key not in inside["msg"]
    assert "job_id" not in outside


def test_a_logged_database_error_carries_no_statement_values():
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from app.infra.db import transaction

    buf = io.StringIO()
    log = logging.getLogger("asynch.test.db")
    log.addHandler(json_handler(buf))
    log.propagate = False
    try:
        with transaction() as conn:
            conn.execute(text("INSERT INTO no_such_table (k) VALUES (:k)"), {"k": MODEL_KEY_SECRET})
    except DBAPIError as exc:
        log.exception("database error: %s", exc)
    finally:
        log.propagate = True
    out = buf.getvalue()
    assert "no_such_table" in out and "statement hidden" in out
    assert MODEL_KEY_SECRET not in out


def test_a_logged_database_error_of_a_rendered_statement_carries_no_values():
    """The admission INSERT renders its rows into the statement (psycopg2's
    mogrify): a refused one was logged ("admission INSERT failed: ...") with
    SQLAlchemy's [SQL: ...] holding every payload and modelKey of the batch."""
    from sqlalchemy.exc import DBAPIError

    from app.infra.db import single_statement

    buf = io.StringIO()
    log = logging.getLogger("asynch.test.db")
    log.addHandler(json_handler(buf))
    log.propagate = False
    try:
        with single_statement() as conn:
            conn.exec_driver_sql(f"INSERT INTO no_such_table (k) VALUES ('{MODEL_KEY_SECRET}')")
    except DBAPIError as exc:
        assert MODEL_KEY_SECRET in str(exc)  # what the log line was given
        log.error("admission INSERT failed: %s", exc)
    finally:
        log.propagate = True
    out = buf.getvalue()
    assert "no_such_table" in out and "[SQL: statement hidden]" in out
    assert MODEL_KEY_SECRET not in out
