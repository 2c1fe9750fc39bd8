"""Streamed output (issue 31 item 4): a streaming model's output forwarded live as the upstream sends it,
resumable with Last-Event-ID, replayed from the stored result once the job is done, many readers for one
upstream read, a retry's output started anew, tenant-scoped and under the streams cap.  Real API server,
PostgreSQL, Redis, Celery worker processes and the stub model streaming over HTTP (chunked)."""
from __future__ import annotations

import json
import random
import threading

import pytest
import requests
from helpers import auth, job_row, submit, wait_until
from stress_util import maintenance_loop

from app.config import get_settings, set_settings
from app.jobs import output
from model_asynch.client import lines_of

pytestmark = pytest.mark.e2e


class OutputStream:
    """A client of a job's output stream: ``next()`` is (id, event, data as text) or None at its end."""

    def __init__(self, url: str, key: str, last: str | None = None) -> None:
        headers = {**auth(key), "Accept": "text/event-stream", **({"Last-Event-ID": last} if last else {})}
        self.resp = requests.get(url, headers=headers, stream=True, timeout=30)
        self.lines = lines_of(self.resp.iter_content(chunk_size=None))

    def next(self):
        ev: dict = {}
        for line in self.lines:
            if line == "":
                if "data" in ev:
                    return ev.get("id", ""), ev.get("event", "message"), "\n".join(ev["data"])
                ev = {}
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                ev.setdefault("data", []).append(value)
            else:
                ev[field] = value
        return None

    def all(self) -> list:
        out = []
        while (ev := self.next()) is not None:
            out.append(ev)
            if ev[0] == "end":
                break
        return out

    def close(self) -> None:
        self.resp.close()


def _url(api_url, model, job):
    return f"{api_url}/v1/models/{model}/jobs/{job}/stream"


def _text(events, attempt=None) -> str:
    return "".join(d for i, e, d in events if e == "output" and (attempt is None or i.startswith(f"{attempt}-")))


def _stored(api_url, key, model, job) -> bytes:
    resp = requests.get(f"{api_url}/v1/models/{model}/jobs/{job}/result", headers=auth(key), timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.content


def test_output_arrives_live_before_the_job_ends_and_equals_the_stored_result(api_url, workers, make_model,
                                                                              user_key, model_server):
    make_model("chat", streaming=True)
    accepted = submit(api_url, user_key, "chat", {"stream": True, "chunks": 6, "chunk_ms": 10,
                                                  "stream_hold": "live", "hold_at": 3,
                                                  "messages": [{"role": "user", "content": "one two three"}]})
    job = accepted.json()["job_id"]
    assert accepted.json()["stream_url"] == f"/v1/models/chat/jobs/{job}/stream"
    s = OutputStream(_url(api_url, "chat", job), user_key)
    try:
        assert s.resp.status_code == 200 and s.resp.headers["Content-Type"].startswith("text/event-stream")
        first = [s.next() for _ in range(4)]  # attempt + 3 chunks, while the upstream holds the 4th
        assert first[0][1] == "attempt" and first[0][0] == "1-0", first
        assert [e for _i, e, _d in first[1:]] == ["output"] * 3
        assert job_row(job).state == 1  # running: the output came live
        assert '"content":"one "' in first[1][2]
        model_server.state.release("live")
        rest = s.all()
    finally:
        s.close()
    assert rest[-1][1] == "done" and rest[-1][0] == "end"
    events = first + rest
    stored = _stored(api_url, user_key, "chat", job)
    assert _text(events).encode() == stored  # byte for byte: what was streamed is what is kept
    assert stored.endswith(b"data: [DONE]\n\n")
    ends = [int(i.split("-")[1]) for i, e, _d in events if e == "output"]
    assert ends == sorted(ends) and ends[-1] == len(stored)
    poll = requests.get(f"{api_url}/v1/models/chat/jobs/{job}", headers=auth(user_key), timeout=10).json()
    assert poll["stream_url"].endswith(f"/jobs/{job}/stream")


def test_last_event_id_resumes_live_and_after_the_end_with_the_same_ids(api_url, workers, make_model, user_key,
                                                                        model_server):
    make_model("chat2", streaming=True)
    job = submit(api_url, user_key, "chat2", {"stream": True, "chunks": 5, "chunk_ms": 5, "stream_hold": "resume",
                                              "hold_at": 2}).json()["job_id"]
    s = OutputStream(_url(api_url, "chat2", job), user_key)
    got = [s.next() for _ in range(3)]  # attempt, output, output
    s.close()
    last = got[-1][0]
    resumed = OutputStream(_url(api_url, "chat2", job), user_key, last=last)
    model_server.state.release("resume")
    after = resumed.all()
    resumed.close()
    assert after[0][1] == "output" and after[-1][1] == "done", after  # no attempt event: same attempt
    live_ids = [i for i, e, _d in got + after if e == "output"]
    assert len(live_ids) == len(set(live_ids))
    # Replayed from the stored result: the same events with the same ids, from the start or after any of them.
    replay = OutputStream(_url(api_url, "chat2", job), user_key).all()
    assert [(i, d) for i, e, d in replay if e == "output"] == [(i, d) for i, e, d in got + after if e == "output"]
    mid = live_ids[1]
    tail = OutputStream(_url(api_url, "chat2", job), user_key, last=mid).all()
    assert [i for i, e, _d in tail if e == "output"] == live_ids[2:] and tail[-1][1] == "done"
    again = OutputStream(_url(api_url, "chat2", job), user_key, last="end").all()
    assert [e for _i, e, _d in again] == ["done"]
    junk = OutputStream(_url(api_url, "chat2", job), user_key, last="x-1").all()
    assert _text(junk).encode() == _stored(api_url, user_key, "chat2", job)


def test_a_retry_starts_the_output_anew_and_the_stored_result_is_the_last_attempts(api_url, workers, make_model,
                                                                                   user_key, model_server):
    make_model("chat3", streaming=True, retry_times=2)
    job = submit(api_url, user_key, "chat3", {"stream": True, "chunks": 6, "chunk_ms": 5, "break_at": 3,
                                              "break_once": True, "tag": "chat3"}).json()["job_id"]
    with maintenance_loop():  # beat's retry pass: the broken attempt's retry is re-admitted after its backoff
        events = OutputStream(_url(api_url, "chat3", job), user_key).all()
    assert events[-1][1] == "done", events
    attempts = [d for _i, e, d in events if e == "attempt"]
    stored = _stored(api_url, user_key, "chat3", job)
    last = job_row(job).attempt
    assert last >= 2 and _text(events, attempt=last).encode() == stored
    assert len(attempts) >= 1 and f'"attempt": {last}'.replace(" ", "") in attempts[-1].replace(" ", "")


def test_ndjson_and_a_model_that_does_not_stream(api_url, workers, make_model, user_key):
    make_model("lines", streaming=True)
    job = submit(api_url, user_key, "lines", {"stream": True, "ndjson": True, "chunks": 4, "chunk_ms": 5}).json()
    events = OutputStream(_url(api_url, "lines", job["job_id"]), user_key).all()
    outs = [d for _i, e, d in events if e == "output"]
    assert len(outs) == 4 and all(o.endswith("\n") for o in outs)
    assert "".join(outs).encode() == _stored(api_url, user_key, "lines", job["job_id"])
    # Not a streaming model: no stream_url; its stream still answers, the whole body at the end.
    make_model("plain")
    plain = submit(api_url, user_key, "plain", {"x": 1}).json()
    assert "stream_url" not in plain
    events = OutputStream(_url(api_url, "plain", plain["job_id"]), user_key).all()
    assert [e for _i, e, _d in events] == ["attempt", "output", "done"]
    assert events[1][2].encode() == _stored(api_url, user_key, "plain", plain["job_id"])


def test_many_readers_of_one_job_cost_one_upstream_call_and_see_the_same_output(api_url, workers, make_model,
                                                                                user_key, model_server):
    make_model("fan", streaming=True)
    job = submit(api_url, user_key, "fan", {"stream": True, "chunks": 10, "chunk_ms": 20,
                                            "stream_hold": "fan"}).json()["job_id"]
    results: list = [None] * 6

    def read(i):
        results[i] = OutputStream(_url(api_url, "fan", job), user_key).all()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: any(c["headers"].get("X-Asynch-Job-Id") == job for c in model_server.state.calls),
               what="the call")
    model_server.state.release("fan")
    for t in threads:
        t.join(30)
    stored = _stored(api_url, user_key, "fan", job)
    assert all(r is not None and r[-1][1] == "done" and _text(r).encode() == stored for r in results)
    assert sum(c["headers"].get("X-Asynch-Job-Id") == job for c in model_server.state.calls) == 1


def test_another_tenant_gets_404_and_streams_count_under_the_streams_cap(api_url, workers, make_model, user_key,
                                                                         other_key, model_server):
    make_model("mine", streaming=True)
    job = submit(api_url, user_key, "mine", {"stream": True, "chunks": 3, "stream_hold": "cap"}).json()["job_id"]
    assert requests.get(_url(api_url, "mine", job), headers=auth(other_key), timeout=10).status_code == 404
    settings = get_settings()
    set_settings(settings.with_overrides(events_streams_per_tenant=1))
    first = OutputStream(_url(api_url, "mine", job), user_key)
    try:
        assert first.resp.status_code == 200
        second = requests.get(_url(api_url, "mine", job), headers=auth(user_key), timeout=10)
        assert second.status_code == 429 and "streams cap 1" in second.json()["error"], second.text
    finally:
        first.close()
        set_settings(settings)
        model_server.state.release("cap")


@pytest.mark.parametrize("ctype", ["text/event-stream", "application/x-ndjson"])
def test_the_cuts_do_not_depend_on_how_the_body_arrives(ctype):
    rnd = random.Random(7)
    parts = []
    for i in range(200):
        end = rnd.choice(["\n", "\r\n", "\r"])
        if ctype == "text/event-stream":
            parts.append(f"event: x{end}data: {i} é{end}{end}")
        else:
            parts.append(f'{{"i": {i}}}{end}')
    body = "".join(parts).encode() + b"data: tail without end"
    whole = output.events_of(body, ctype)
    assert b"".join(d for _e, d in whole) == body and whole[-1][0] == len(body)
    for _ in range(20):  # the same body in random pieces, down to single bytes
        c, got, i = output.Cutter(ctype), [], 0
        while i < len(body):
            n = rnd.choice([1, 2, 3, 7, 64, 500])
            got += c.feed(body[i:i + n])
            i += n
        assert got + c.close() == whole


def test_the_sdk_sync_and_asyncio_and_the_cli_follow_the_output(api_url, workers, make_model, user_key):
    import asyncio

    from click.testing import CliRunner

    from app.cli import main
    from model_asynch import AsyncClient, Client

    make_model("sdkchat", streaming=True)
    payload = {"stream": True, "chunks": 4, "chunk_ms": 5, "messages": [{"role": "user", "content": "a b c d"}]}
    with Client(api_url, user_key) as c:
        job = c.submit("sdkchat", payload)
        events = list(c.stream("sdkchat", job.job_id))
    assert events[0].event == "attempt" and events[-1].event == "done" and events[-1].data["state"] == "done"
    text = "".join(e.data for e in events if e.event == "output")
    assert text.encode() == _stored(api_url, user_key, "sdkchat", job.job_id)

    async def follow():
        async with AsyncClient(api_url, user_key) as c:
            return [e async for e in c.stream("sdkchat", job.job_id)]

    replayed = asyncio.run(follow())
    assert [(e.id, e.data) for e in replayed if e.event == "output"] == \
        [(e.id, e.data) for e in events if e.event == "output"]
    run = CliRunner().invoke(main, ["stream", "--url", api_url, "--key", user_key, "--content", job.job_id])
    assert run.exit_code == 0 and run.output.strip() == "a b c d", run.output
    run = CliRunner().invoke(main, ["submit", "--url", api_url, "--key", user_key, "--stream", "sdkchat",
                                    json.dumps({**payload, "messages": [{"role": "user", "content": "x y"}]})])
    assert run.exit_code == 0 and "x y" in run.output, run.output
