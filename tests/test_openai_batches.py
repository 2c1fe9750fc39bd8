"""The Batch API through the real OpenAI client (openai.files / openai.batches) against the test API, with real
Celery workers calling the stub model: upload, create, retrieve until done, output and error files, cancel,
list, a refused window, validation errors, another tenant.  The batches pass (app/batches/progress.py) is
what beat runs; here the test runs it while it waits (no beat process)."""
from __future__ import annotations

import io
import json

import openai
import pytest
from helpers import job_row, wait_until
from sqlalchemy import func, select

from app.batches import progress
from app.infra.db import transaction
from app.infra.tables import batch_items, batches, tasks

pytestmark = pytest.mark.e2e
ENDPOINT = "/v1/chat/completions"


def client(api_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key=key, max_retries=0, timeout=30)


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())


def line(cid: str, model: str = "echo", **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": ENDPOINT,
            "body": {"model": model, "messages": [{"role": "user", "content": cid}], **body}}


def upload(oa: openai.OpenAI, lines: list[dict]) -> str:
    return oa.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch").id


def until(oa: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 60):
    def ended():
        progress.advance_all()
        b = oa.batches.retrieve(batch_id)
        return b if b.status in statuses else None
    return wait_until(ended, timeout=timeout, interval=0.2, what=f"batch {batch_id} in {statuses}")


def read_lines(oa: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(x) for x in oa.files.content(file_id).read().decode().splitlines()]


def test_a_batch_runs_to_completed_with_output_and_error_files(api_url, workers, make_model, user_key):
    make_model("echo", queue_limit=8)  # fewer slots than lines: the batch is fed as the queue frees
    oa = client(api_url, user_key)
    lines = [line(f"ok-{i}") for i in range(20)] + [line("bad", status=500)]
    batch = oa.batches.create(input_file_id=upload(oa, lines), endpoint=ENDPOINT, completion_window="24h",
                              metadata={"run": "1"})
    assert batch.status == "in_progress" and batch.request_counts.total == 21 and batch.metadata == {"run": "1"}
    assert batch.expires_at == batch.created_at + 86400
    done = until(oa, batch.id, ("completed",))
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 1)
    out = read_lines(oa, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"ok-{i}" for i in range(20))
    first = next(o for o in out if o["custom_id"] == "ok-3")
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["body"]["echo"]["messages"][0]["content"] == "ok-3"  # what the upstream received
    job = job_row(first["response"]["request_id"])
    assert job.tenant_id == "tenant-a" and job.caller_deadline_at is not None  # the window is its deadline
    (err,) = read_lines(oa, done.error_file_id)
    assert err["custom_id"] == "bad" and err["response"] is None and err["error"]["code"] == "model_http_error"
    assert oa.files.retrieve(done.output_file_id).purpose == "batch_output"
    with transaction() as conn:  # outcomes written once: one per line
        assert conn.execute(select(func.count()).select_from(batch_items).where(
            batch_items.c.outcome.is_not(None))).scalar_one() == 21
    assert progress.advance(batch.id) == "completed"  # a later pass changes nothing
    assert oa.batches.retrieve(batch.id).output_file_id == done.output_file_id


def test_validation_fails_the_batch_with_line_numbers_and_admits_nothing(api_url, make_model, user_key):
    make_model("echo", form=[{"field": "messages", "type": "array", "required": True}])
    oa = client(api_url, user_key)
    raw = (json.dumps(line("a")) + "\n" + "not json\n" + json.dumps(line("a")) + "\n"
           + json.dumps({**line("m"), "method": "GET"}) + "\n" + json.dumps({**line("u"), "url": "/v1/embeddings"})
           + "\n" + json.dumps(line("x", model="nope")) + "\n"
           + json.dumps({"custom_id": "f", "method": "POST", "url": ENDPOINT, "body": {"model": "echo"}}) + "\n")
    fid = oa.files.create(file=("in.jsonl", raw.encode()), purpose="batch").id
    b = oa.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window="24h")
    assert b.status == "failed" and b.failed_at is not None
    got = [(e.line, e.code) for e in b.errors.data]
    assert got == [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "invalid_method"),
                   (5, "mismatched_endpoint"), (6, "model_not_found"), (7, "invalid_request")], got
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(batch_items)).scalar_one() == 0


def test_bad_create_bodies_are_422_and_write_nothing(api_url, make_model, user_key):
    make_model("echo")
    oa = client(api_url, user_key)
    fid = upload(oa, [line("a")])
    for window in ("1s", "0h", "31d", "soon"):
        with pytest.raises(openai.UnprocessableEntityError):
            oa.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window=window)
    other = oa.files.create(file=("x.txt", b"{}\n"), purpose="user_data").id
    with pytest.raises(openai.UnprocessableEntityError):
        oa.batches.create(input_file_id=other, endpoint=ENDPOINT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        oa.batches.create(input_file_id="file-nope", endpoint=ENDPOINT, completion_window="24h")
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(batches)).scalar_one() == 0


def test_a_window_the_queue_cannot_meet_is_refused_with_the_estimate(api_url, make_model, user_key):
    make_model("slow", expected_seconds=60, max_concurrency=1)
    oa = client(api_url, user_key)
    fid = upload(oa, [line(f"s{i}", model="slow") for i in range(40)])  # 40 x 60 s at 1: 40 min
    with pytest.raises(openai.RateLimitError) as exc:
        oa.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window="30m")
    body = exc.value.response.json()
    assert body["code"] == "deadline_unmeetable" and "estimated_done_at" in body and "deadline_at" in body
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(batches)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 0
    assert oa.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window="2h").status == "in_progress"


def test_cancel_stops_running_lines_and_cancels_pending_ones(api_url, workers, make_model, user_key, model_server):
    make_model("echo", queue_limit=4, max_concurrency=2)
    oa = client(api_url, user_key)
    lines = [line(f"h{i}", hold="cancel-me") for i in range(10)]
    b = oa.batches.create(input_file_id=upload(oa, lines), endpoint=ENDPOINT, completion_window="24h")
    wait_until(lambda: len(model_server.state.calls) >= 2, timeout=30, what="two calls in flight")
    c = oa.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled")
    ended = until(oa, b.id, ("cancelled",))
    assert ended.cancelled_at is not None and ended.request_counts.failed == 10
    errs = read_lines(oa, ended.error_file_id)
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"} and len(errs) == 10
    wait_until(lambda: len(model_server.state.hangups) >= 2, timeout=30, what="the running calls stopped")
    with transaction() as conn:
        assert conn.execute(select(func.count()).select_from(tasks).where(tasks.c.state.in_([0, 1, 7])))\
            .scalar_one() == 0
    with pytest.raises(openai.NotFoundError):
        oa.batches.cancel("batch_nope")


def test_expiry_ends_the_batch_expired_with_partial_output(api_url, workers, make_model, user_key, settings):
    from datetime import timedelta

    from sqlalchemy import update

    make_model("echo", queue_limit=2, max_concurrency=1)
    oa = client(api_url, user_key)
    lines = [line("quick")] + [line(f"slow-{i}", sleep_ms=400) for i in range(8)]
    b = oa.batches.create(input_file_id=upload(oa, lines), endpoint=ENDPOINT, completion_window="30m")
    wait_until(lambda: (progress.advance_all() and False) or oa.batches.retrieve(b.id).request_counts.completed >= 1,
               timeout=30, what="a first line done")
    with transaction() as conn:  # the window ends now
        conn.execute(update(batches).where(batches.c.id == b.id).values(
            expires_at=func.now() - timedelta(seconds=1)))
    ended = until(oa, b.id, ("expired",))
    assert ended.expired_at is not None and ended.request_counts.completed >= 1
    assert ended.request_counts.completed + ended.request_counts.failed == 9
    assert any(o["custom_id"] == "quick" for o in read_lines(oa, ended.output_file_id))
    assert {e["error"]["code"] for e in read_lines(oa, ended.error_file_id)} <= {"batch_expired"}


def test_list_pages_and_another_tenant_sees_nothing(api_url, make_model, user_key, other_key):
    make_model("echo", form=[{"field": "messages", "type": "array", "required": True}])
    oa, ob = client(api_url, user_key), client(api_url, other_key)
    fid = oa.files.create(file=("in.jsonl", b"nope\n"), purpose="batch").id
    ids = [oa.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window="24h").id for _ in range(3)]
    assert [b.id for b in oa.batches.list(limit=10).data] == ids[::-1]
    page = oa.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[:0:-1] and page.has_more
    assert [b.id for b in oa.batches.list(limit=2, after=ids[1]).data] == [ids[0]]
    assert ob.batches.list().data == []
    for call in (lambda: ob.batches.retrieve(ids[0]), lambda: ob.batches.cancel(ids[0]),
                 lambda: ob.batches.create(input_file_id=fid, endpoint=ENDPOINT, completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()


def test_a_batch_leaves_room_for_another_tenant(api_url, workers, make_model, user_key, other_key, model_server):
    """A large batch fills at most ASYNCH_BATCH_QUEUE_SHARE of the model's queue: another tenant's submit is
    admitted (not 429) and runs while the batch's lines are held."""
    from helpers import auth, submit

    make_model("echo", queue_limit=8, max_concurrency=2)
    oa = client(api_url, user_key)
    b = oa.batches.create(input_file_id=upload(oa, [line(f"h{i}", hold="room") for i in range(30)]),
                          endpoint=ENDPOINT, completion_window="24h")
    for _ in range(3):
        progress.advance_all()
    with transaction() as conn:
        active = conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.tenant_id == "tenant-a", tasks.c.state.in_([0, 1, 7]))).scalar_one()
    assert active == 4, active  # 0.5 of 8
    r = submit(api_url, other_key, "echo", {"prompt": "mine"})
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    wait_until(lambda: job_row(job).state == 2, timeout=30, what="the other tenant's job done")
    model_server.state.release("room")
    assert until(oa, b.id, ("completed",), timeout=120).request_counts.completed == 30


def test_the_sdk_and_the_cli_run_a_batch(api_url, workers, make_model, user_key, tmp_path):
    """model_asynch's files/batches methods and `asynch files/batches` (click's runner) against the test API."""
    import threading

    from click.testing import CliRunner

    from app.cli.batch_cmds import batches as batches_cmd, files as files_cmd
    from model_asynch import Client, RateLimited

    make_model("echo")
    make_model("slow", expected_seconds=60, max_concurrency=1)
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([line(f"c{i}") for i in range(3)]).getvalue())
    stop = threading.Event()

    def beat():  # what beat does in a deployment
        while not stop.is_set():
            progress.advance_all()
            stop.wait(0.2)
    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        c = Client(api_url, user_key)
        up = c.upload_file(src, purpose="batch")
        assert up["bytes"] == src.stat().st_size and c.file(up["id"])["filename"] == "in.jsonl"
        b = c.wait_batch(c.create_batch(up["id"], ENDPOINT, "2h", {"k": "v"})["id"], timeout=60, poll=0.2)
        assert b["status"] == "completed" and b["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        c.file_content(b["output_file_id"], to=tmp_path / "out.jsonl")
        assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
        assert c.list_batches()["data"][0]["id"] == b["id"]
        (tmp_path / "slow.jsonl").write_bytes(jsonl([line(f"s{i}", model="slow") for i in range(40)]).getvalue())
        slow = c.upload_file(tmp_path / "slow.jsonl")
        with pytest.raises(RateLimited):
            c.create_batch(slow["id"], ENDPOINT, "30m")

        run = CliRunner()
        base = ["--url", api_url, "--key", user_key]
        out = run.invoke(batches_cmd, ["create", "--input", str(src), "--window", "30m", "-q", *base])
        assert out.exit_code == 0, out.output
        bid = out.output.strip()
        waited = run.invoke(batches_cmd, ["wait", bid, "--timeout", "60", "--poll", "0.2", *base])
        assert waited.exit_code == 0, waited.output
        out_id = json.loads(waited.output)["output_file_id"]
        content = run.invoke(files_cmd, ["content", out_id, *base])
        assert content.exit_code == 0 and len(content.output.splitlines()) == 3
        listed = run.invoke(batches_cmd, ["list", *base])
        assert bid in listed.output
        bad = run.invoke(batches_cmd, ["create", "--input", str(tmp_path / "slow.jsonl"), "--window", "30m", *base])
        assert bad.exit_code == 1 and "deadline_unmeetable" in bad.output and "HTTP 429" in bad.output
    finally:
        stop.set()
        t.join(5)


def test_the_asyncio_sdk_runs_uploads_and_cancels_a_batch(api_url, workers, make_model, user_key, tmp_path,
                                                          model_server):
    """AsyncClient's files/batches methods: the same calls as Client's (FileOperations), aiohttp transfers."""
    import asyncio
    import threading

    from model_asynch import AsyncClient, NotFound, RateLimited

    make_model("echo")
    make_model("slow", expected_seconds=60, max_concurrency=1)
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([line(f"a{i}") for i in range(4)]).getvalue())
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            progress.advance_all()
            stop.wait(0.2)

    async def run():
        async with AsyncClient(api_url, user_key) as c:
            up = await c.upload_file(src, purpose="batch")
            assert up["bytes"] == src.stat().st_size and (await c.file(up["id"]))["filename"] == "in.jsonl"
            created = await c.create_batch(up["id"], ENDPOINT, "2h", {"k": "v"})
            b = await c.wait_batch(created["id"], timeout=60, poll=0.2)
            assert b["status"] == "completed" and b["request_counts"]["completed"] == 4, b
            body = await c.file_content(b["output_file_id"])
            await c.file_content(b["output_file_id"], to=tmp_path / "out.jsonl")
            assert (tmp_path / "out.jsonl").read_bytes() == body
            assert sorted(json.loads(x)["custom_id"] for x in body.decode().splitlines()) == [f"a{i}" for i in range(4)]
            assert b["id"] in [x["id"] for x in (await c.list_batches(limit=5))["data"]]
            assert up["id"] in [x["id"] for x in (await c.files(purpose="batch"))["data"]]
            with io.BytesIO(jsonl([line(f"s{i}", model="slow") for i in range(40)]).getvalue()) as f:
                slow = await c.upload_file(f, filename="slow.jsonl")
            with pytest.raises(RateLimited):
                await c.create_batch(slow["id"], ENDPOINT, "30m")
            assert (await c.delete_file(slow["id"]))["deleted"] is True
            with pytest.raises(NotFound):
                await c.file(slow["id"])
            held = [line(f"h{i}", hold="cancel-me-aio") for i in range(2)]
            hang = await c.upload_file(io.BytesIO(jsonl(held).getvalue()), filename="hang.jsonl")
            hb = await c.create_batch(hang["id"], ENDPOINT, "2h")
            await asyncio.to_thread(wait_until, lambda: any(x["payload"].get("hold") == "cancel-me-aio" for x in
                                    model_server.state.calls), timeout=30, what="a held call in flight")
            assert (await c.cancel_batch(hb["id"]))["status"] in ("cancelling", "cancelled")
            ended = await c.wait_batch(hb["id"], timeout=60, poll=0.2)
            assert ended["status"] == "cancelled", ended

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        asyncio.run(run())
    finally:
        stop.set()
        t.join(5)


def test_a_batch_survives_a_redis_and_broker_wipe(api_url, workers, make_model, user_key, r, model_server):
    """Its state is in PostgreSQL: after the gate Redis and the broker are wiped mid-run, recovery requeues its
    admitted jobs, the pass admits the rest, and every line ends once."""
    from helpers import BROKER_DB, redis_db

    from app.maintenance import passes as maintenance

    make_model("echo", queue_limit=8, max_concurrency=2)
    maintenance.repair_after_wipe()  # the deployment's epoch marks exist before the wipe
    oa = client(api_url, user_key)
    lines = [line(f"w{i}", hold="wipe" if i < 2 else None) for i in range(12)]
    b = oa.batches.create(input_file_id=upload(oa, lines), endpoint=ENDPOINT, completion_window="24h")
    wait_until(lambda: sum(1 for c in model_server.state.calls if c["payload"].get("hold")) == 2, timeout=30,
               what="two lines held in flight")
    r.flushdb()
    redis_db(BROKER_DB).flushdb()
    model_server.state.release("wipe")

    def ended():
        maintenance.recover()
        progress.advance_all()
        return oa.batches.retrieve(b.id).status == "completed"
    wait_until(ended, timeout=120, interval=0.3, what="the batch completed after the wipe")
    done = oa.batches.retrieve(b.id)
    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    assert sorted(json.loads(x)["custom_id"] for x in oa.files.content(done.output_file_id).text.splitlines()) \
        == sorted(f"w{i}" for i in range(12))
