"""The serving path (issue "Capacity isolation", part 1) on real API server
processes: long-polls must not take request capacity from anyone.

- The stall: tenant A holds 96 waits on one running job; tenant B's submits
  and polls keep their latency, and A's waits all answer when the job ends.
  Under gthread (2 x 16 threads) the same scenario stalls B: that case is a
  strict xfail, so the scenario is shown to fail where it should.
- Waiter caps: 429 + Retry-After + the cap in the message; another tenant
  unaffected; the count comes back when waits end and when a client hangs
  up mid-wait.
- Wake-ups: a woken job is read once for all its waiters; none is lost
  while the listeners' connections are cut under load.
- Nothing blocks the gevent hub: a query, the outbox's idle sender and the
  wake-up listener leave a ticker greenlet on time.
"""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
import requests
from api_process import ApiProcess, finish_by_hand, run_by_hand
from helpers import ROOT, auth, make_key, publish_terminal, submit, wait_until
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.infra import wakeups as waiters
from app.jobs import service as jobs
from app.tenancy import limits as tenant_limits
from app.tenancy.keys import Principal
from app.tenancy.schemas import TenantLimitsInput

pytestmark = pytest.mark.e2e

N_WAITS = 96
HOLD_SECONDS = 5.0


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


@pytest.mark.parametrize("worker_class", [
    "gevent",
    pytest.param("gthread", marks=pytest.mark.xfail(strict=True, reason="each wait holds one of 2 x 16 threads: "
                                                                        "the issue's stall")),
])
def test_long_polls_do_not_stall_another_tenant(worker_class, test_env, tmp_path, make_model):
    api = ApiProcess(test_env, tmp_path, worker_class=worker_class, workers=2, threads=16).start()
    try:
        make_model("a-model", queue_limit=10)
        make_model("b-model", queue_limit=10_000)
        key_a, key_b = make_key("tenant-a"), make_key("tenant-b")
        job = submit(api.base, key_a, "a-model", {}).json()["job_id"]
        run_by_hand(job)

        def b_round() -> list[float]:
            out = []
            t0 = time.monotonic()
            r = submit(api.base, key_b, "b-model", {"x": 1})
            out.append(time.monotonic() - t0)
            assert r.status_code == 202, r.text
            t0 = time.monotonic()
            p = requests.get(f"{api.base}/v1/models/b-model/jobs/{r.json()['job_id']}", headers=auth(key_b), timeout=60)
            out.append(time.monotonic() - t0)
            assert p.status_code == 200
            return out

        baseline = [x for _ in range(20) for x in b_round()]

        returned: list[tuple[float, str]] = []
        lock = threading.Lock()

        def wait_once() -> None:
            r = requests.get(f"{api.base}/v1/models/a-model/jobs/{job}/wait?timeout=20000", headers=auth(key_a),
                             timeout=60)
            with lock:
                returned.append((time.monotonic(), r.json().get("state", r.status_code) if r.ok else r.status_code))

        waits = [threading.Thread(target=wait_once) for _ in range(N_WAITS)]
        for t in waits:
            t.start()
        time.sleep(1.0)  # let them all park
        finished_at: list[float] = []

        def finish() -> None:
            # Stamped before the finish: its commit wakes the waits, and its after-commit effects
            # (dispatch, deliveries) may take longer than a woken wait takes to answer.
            finished_at.append(time.monotonic())
            finish_by_hand(job)

        timer = threading.Timer(HOLD_SECONDS, finish)
        t_start = time.monotonic()
        timer.start()
        during = []
        while time.monotonic() - t_start < HOLD_SECONDS - 0.5:
            during += b_round()
        for t in waits:
            t.join(60)
        timer.join()

        assert not returned or all(t >= finished_at[0] for t, _ in returned), "a wait ended early"
        assert len(returned) == N_WAITS and all(s == "done" for _, s in returned), returned
        after = [t - finished_at[0] for t, _ in returned]
        b_p99, base_p99 = _p(during, 99), _p(baseline, 99)
        print(f"{worker_class}: B p99 {b_p99 * 1000:.1f} ms (baseline {base_p99 * 1000:.1f} ms, n={len(during)}); "
              f"A's waits answered {min(after) * 1000:.0f}..{max(after) * 1000:.0f} ms after the finish")
        # B keeps its latency: a slow, shared CI machine gets a generous
        # absolute bound; the stall it guards against is seconds long.
        assert b_p99 < max(0.5, 5 * base_p99), f"tenant B stalled: p99 {b_p99:.3f}s vs {base_p99:.3f}s before"
        assert len(during) >= 20, f"tenant B completed only {len(during)} requests in {HOLD_SECONDS - 0.5}s"
        # A's waits answer together, as soon as the job ends (not 32 at a time).
        assert max(after) < 1.0, f"waits answered up to {max(after):.2f}s after the job ended"
    finally:
        api.stop()


def _raw_wait(base: str, key: str, model: str, job: str, timeout_ms: int) -> socket.socket:
    """A wait sent on a bare socket, its answer not read: the test decides
    when the client hangs up."""
    host, port = base.rsplit("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"GET /v1/models/{model}/jobs/{job}/wait?timeout={timeout_ms} HTTP/1.1\r\nHost: {host}\r\n"
              f"Authorization: Bearer {key}\r\n\r\n".encode())
    return s


def _read_answer(s: socket.socket) -> tuple[int, dict]:
    """Status and JSON body of the response on a _raw_wait socket."""
    s.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536) or b"?"
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split()[1]), json.loads(body)


def _probe(base: str, key: str, model: str, job: str) -> requests.Response:
    # timeout=1: a 1 ms budget, so an admitted probe answers at once and holds nothing.
    return requests.get(f"{base}/v1/models/{model}/jobs/{job}/wait?timeout=1", headers=auth(key), timeout=30)


def _parked(base: str) -> int:
    """The server's parked long-polls (its asynch_waiters gauge)."""
    text = requests.get(f"{base}/metrics", timeout=10).text
    return int(float(next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("asynch_waiters ")), "0")))


def _hold(base: str, key: str, model: str, job: str, n: int, already: int) -> list[socket.socket]:
    """n waits that stay parked, opened one at a time and each seen parked
    (the server's gauge) before the next: under gthread a probe sent right
    after them could otherwise be served first and take the place one of
    them was meant to have."""
    socks = []
    for i in range(n):
        socks.append(_raw_wait(base, key, model, job, 60000))
        wait_until(lambda: _parked(base) >= already + i + 1, timeout=10, what=f"wait {i + 1} of {n} parked")
    return socks


def _until_refused(base: str, key: str, model: str, job: str, what: str) -> requests.Response:
    # A Response is falsy when it is not ok: wrap it for wait_until.
    return wait_until(lambda: [p] if (p := _probe(base, key, model, job)).status_code == 429 else None,
                      timeout=10, what=what)[0]


@pytest.mark.parametrize("worker_class", ["gevent", "gthread"])
def test_waiter_caps(worker_class, test_env, tmp_path, make_model):
    api = ApiProcess(test_env, tmp_path, worker_class=worker_class, workers=1, threads=16,
                     extra_env={"ASYNCH_WAITERS_PER_TENANT": "3", "ASYNCH_WAITERS_MAX": "5"}).start()
    held: list[socket.socket] = []
    try:
        make_model("m", queue_limit=100)
        # tenant-c's own cap (its limits row) is 1, below the setting's 3.
        tenant_limits.update("tenant-c", TenantLimitsInput(max_waiters=1))
        keys = {t: make_key(t) for t in ("tenant-a", "tenant-b", "tenant-c")}
        jobs = {t: submit(api.base, k, "m", {}).json()["job_id"] for t, k in keys.items()}
        for t in ("tenant-a", "tenant-b"):
            run_by_hand(jobs[t])

        a_socks = _hold(api.base, keys["tenant-a"], "m", jobs["tenant-a"], 3, already=0)
        held += a_socks
        r = _until_refused(api.base, keys["tenant-a"], "m", jobs["tenant-a"], "A at its cap")
        assert "per-tenant cap 3" in r.json()["error"], r.text
        assert int(r.headers["Retry-After"]) >= 1
        # Another tenant is unaffected by A's cap.
        assert _probe(api.base, keys["tenant-b"], "m", jobs["tenant-b"]).status_code == 200

        b_socks = _hold(api.base, keys["tenant-b"], "m", jobs["tenant-b"], 2, already=3)
        held += b_socks
        r = _until_refused(api.base, keys["tenant-c"], "m", jobs["tenant-c"], "the process at its cap")
        assert "per-process cap 5" in r.json()["error"], r.text
        assert _parked(api.base) == 5
        refused = requests.get(f"{api.base}/metrics", timeout=10).text
        assert 'asynch_waits_refused_total{cap="process"}' in refused and 'asynch_waits_refused_total{cap="tenant"}' in refused
        assert "Retry-After" in r.headers
        # Only waits are capped: C's submits and polls go on.
        assert submit(api.base, keys["tenant-c"], "m", {}).status_code == 202
        assert requests.get(f"{api.base}/v1/models/m/jobs/{jobs['tenant-c']}", headers=auth(keys["tenant-c"]),
                            timeout=10).status_code == 200

        # A hangs up mid-wait: its places come back long before the 60 s budget.
        t0 = time.monotonic()
        for s in a_socks:
            s.close()
        wait_until(lambda: _probe(api.base, keys["tenant-a"], "m", jobs["tenant-a"]).status_code == 200,
                   timeout=10, what="A's count back after hanging up")
        assert time.monotonic() - t0 < 5

        # B's waits end with the job: they answer, and the count comes back.
        finish_by_hand(jobs["tenant-b"])
        for s in b_socks:
            status, body = _read_answer(s)
            assert status == 200 and body["state"] == "done", (status, body)
        wait_until(lambda: _probe(api.base, keys["tenant-c"], "m", jobs["tenant-c"]).status_code == 200,
                   timeout=10, what="the process's count back")

        # A tenant's own cap (asynch_tenant_limits.max_waiters) overrides the setting.
        held += _hold(api.base, keys["tenant-c"], "m", jobs["tenant-c"], 1, already=0)
        r = _until_refused(api.base, keys["tenant-c"], "m", jobs["tenant-c"], "C at its own cap")
        assert "per-tenant cap 1" in r.json()["error"], r.text
    finally:
        for s in held:
            s.close()
        api.stop()


HUB_PROBE = r"""
from gevent import monkey
monkey.patch_all()
import sys, time, gevent
from app.infra.serving import make_green
if sys.argv[1] == "green":
    make_green()
from sqlalchemy import text
from app.infra.db import get_engine
from app.jobs import handoff
from app.infra.wakeups import hub

hub.ensure_started()            # the listener and the fetcher: waiting on Redis / an Event
assert hub.subscribed.is_set()
handoff.send_many([("probe-model", ("probe-tenant", "job_probe", 0.0, "0", ""))])  # the sender: then idle on its queue
handoff.flush(5)
gaps, last = [], [time.monotonic()]

def tick():
    while True:
        gevent.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now

ticker = gevent.spawn(tick)
def query():
    with get_engine().connect() as conn:
        conn.execute(text("SELECT pg_sleep(2)"))
g = gevent.spawn(query)
g.join()
assert g.successful(), g.exception  # the query really ran (a NameError would make the probe vacuous)
gevent.sleep(0.5)
ticker.kill()
print(f"MAXGAP {max(gaps):.3f} TICKS {len(gaps)}")
"""


def test_nothing_blocks_the_gevent_hub(test_env):
    """A two-second query, the outbox's idle sender and the wake-up listener
    must leave other greenlets running: a 10 ms ticker never waits long.  A
    blocked hub shows a gap of the whole query (2 s); the bound leaves room
    for a loaded machine's scheduler (a run under load 14 saw 0.34 s)."""
    out = subprocess.run([sys.executable, "-c", HUB_PROBE, "green"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    gap = float(out.stdout.split("MAXGAP ")[1].split()[0])
    assert gap < 1.0, f"the hub was blocked for {gap:.3f}s: {out.stdout}"


@pytest.mark.parametrize("message", ["snapshot", "bare id"])
def test_a_woken_job_is_read_at_most_once_for_all_its_waiters(make_model, message):
    """60 waiters of one job, one terminal commit.  The winner's wake-up
    carries the terminal row: nobody reads it again (0 reads).  A wake-up
    that carries only the id (an older publisher) is single-flight: the
    process reads that job's row once, not once per waiter."""
    make_model("flight")
    p = Principal("tenant-a", "user", None)
    job_id = jobs.submit(p, "flight", {}).row.id
    run_by_hand(job_id)
    waiters.hub.ensure_started()
    first: list[str] = []  # each waiter's one read right after registering
    reads: list[str] = []  # the reads after the terminal commit
    sink = [first]

    def count(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "asynch_task" in statement:
            sink[0].append(statement)

    # Every engine of this process (the request pools and the fetcher's own).
    engine = Engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        with ThreadPoolExecutor(60) as ex:
            futs = [ex.submit(jobs.wait_job, p, job_id, 10000) for _ in range(60)]
            wait_until(lambda: waiters.hub.total == 60 and len(first) == 60,
                       what="60 waiters registered, each read once")
            sink[0] = reads
            t0 = time.monotonic()
            if message == "snapshot":
                finish_by_hand(job_id)
            else:
                from app import transitions
                from app.infra.db import transaction

                with transaction() as conn:
                    assert transitions.complete(conn, job_id, 1, location="x", content_type="text/plain", size=0)
                publish_terminal(job_id)
            rows = [f.result(10) for f in futs]
            took = time.monotonic() - t0
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert all(r.state == 2 for r in rows)
    assert took < 2.0, took
    assert len(reads) == (0 if message == "snapshot" else 1), f"{len(reads)} reads of the job after its wake-up"


def test_a_wakeup_snapshot_is_the_poll_body_and_carries_no_secret(test_env, tmp_path, make_model, r):
    """A waiter woken by the snapshot answers exactly what a poll of the
    same job answers; the message itself holds no payload and no modelKey."""
    api = ApiProcess(test_env, tmp_path, workers=1).start()
    try:
        make_model("snap", model_key_headers="X-Token")
        key = make_key("tenant-a")
        job = requests.post(f"{api.base}/v1/models/snap/jobs", json={"secret_payload": "p-4e1f"},
                            headers={**auth(key), "X-Model-Key": "X-Token:mk-7c2a"}, timeout=30).json()["job_id"]
        run_by_hand(job)
        sub = r.pubsub()
        sub.subscribe(waiters.terminal_channel())
        wait_until(lambda: (m := sub.get_message(timeout=0.1)) and m["type"] == "subscribe", what="subscribed")
        sock = _raw_wait(api.base, key, "snap", job, 30000)
        wait_until(lambda: _parked(api.base) == 1, what="the wait parked")
        finish_by_hand(job)
        status, woken = _read_answer(sock)
        sock.close()
        polled = requests.get(f"{api.base}/v1/models/snap/jobs/{job}", headers=auth(key), timeout=10).json()
        assert status == 200 and woken == polled, (woken, polled)
        msg = wait_until(lambda: (m := sub.get_message(timeout=0.5)) and m["type"] == "message" and m, what="the wake-up")
        assert json.loads(msg["data"])["id"] == job
        assert "p-4e1f" not in msg["data"] and "mk-7c2a" not in msg["data"]
    finally:
        api.stop()


def test_no_wakeup_lost_while_the_listener_reconnects(test_env, tmp_path, make_model):
    """240 waits on 40 jobs on a real gevent server (2 workers); the jobs
    finish over 4 s while the servers' listener connections are cut every
    0.3 s.  Every wait answers done, within 2.5 s of its job's end (not at
    its 12 s budget)."""
    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=2).start()
    try:
        make_model("reconnect", queue_limit=100)
        key = make_key("tenant-a")
        ids = [submit(api.base, key, "reconnect", {}).json()["job_id"] for _ in range(40)]
        for j in ids:
            run_by_hand(j)
        answers: list[tuple[str, float, str]] = []

        async def all_waits() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                async def one(job: str) -> None:
                    url = f"{api.base}/v1/models/reconnect/jobs/{job}/wait?timeout=12000"
                    async with s.get(url, headers=auth(key)) as r:
                        body = await r.json()
                    answers.append((job, time.monotonic(), body.get("state", str(r.status))))

                await asyncio.gather(*(one(j) for j in ids for _ in range(6)))

        t = threading.Thread(target=asyncio.run, args=(all_waits(),))
        t.start()
        wait_until(lambda: _parked(api.base) == 240, timeout=60, what="all 240 waits parked")
        finished: dict[str, float] = {}
        stop = threading.Event()
        kills = []

        def cut() -> None:
            while not stop.wait(0.3):
                kills.append(api.kill_listeners(test_env["ASYNCH_REDIS_URL"]))

        killer = threading.Thread(target=cut)
        killer.start()
        for j in ids:
            finish_by_hand(j)
            finished[j] = time.monotonic()
            time.sleep(0.1)
        t.join(30)
        stop.set()
        killer.join()
    finally:
        api.stop()
    assert sum(kills) >= 10, kills
    assert len(answers) == 240
    not_done = [(j, state) for j, _, state in answers if state != "done"]
    assert not not_done, f"{len(not_done)} waits ended without their wake-up: {not_done[:5]}"
    late = sorted(round(at - finished[j], 2) for j, at, _ in answers)[-5:]
    assert late[-1] < 2.5, f"slowest answers after the job's end (s): {late}"


def test_sigterm_answers_open_waits_at_once(test_env, tmp_path, make_model):
    """A stopping worker drains its long-polls: a wait with a minute of
    budget left answers (state as it is) and the server exits promptly."""
    api = ApiProcess(test_env, tmp_path, worker_class="gevent", workers=1).start()
    try:
        make_model("m", queue_limit=10)
        key = make_key("tenant-a")
        job = submit(api.base, key, "m", {}).json()["job_id"]
        run_by_hand(job)
        s = _raw_wait(api.base, key, "m", job, 60000)
        wait_until(lambda: _parked(api.base) == 1, what="the wait parked")
        t0 = time.monotonic()
        api.proc.send_signal(15)
        status, body = _read_answer(s)
        assert status == 200 and body["state"] == "running", (status, body)
        assert api.proc.wait(20) == 0
        assert time.monotonic() - t0 < 10
        s.close()
    finally:
        api.stop()
