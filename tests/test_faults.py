"""Fault injection with real worker processes: SIGKILL mid-call (repeatedly),
SIGSTOP past the lease, and a model service that fails in every way.  After
each: one terminal record per job, gates empty, no stale write accepted."""
from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from collections import Counter

import pytest
from helpers import WorkerProcess, job_row, P, wait_until
from stress_util import assert_ledger_invariants, maintenance_loop, rows_for

from app.jobs import service as jobs
from app.states import JobState

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def fault_worker(test_env, tmp_path_factory):
    """A worker whose leases are short (model timeout + 1 s) so that recovery
    of a dead attempt happens within the test."""
    env = {**test_env, "ASYNCH_LEASE_GRACE_SECONDS": "1", "ASYNCH_MAX_RESULT_BYTES": "10000"}
    w = WorkerProcess(env, concurrency=2, log_path=tmp_path_factory.mktemp("fw") / "worker.log", name="fault")
    w.start()
    yield w
    w.stop()


def _submit_many(model: str, n: int, payload_fn) -> tuple[list[str], dict[str, str]]:
    ids, tokens = [], {}
    for i in range(n):
        body = payload_fn(i)
        jid = jobs.submit(P, model, body).row.id
        ids.append(jid)
        tokens[jid] = body["token"]
    return ids, tokens


def _all_terminal(ids) -> bool:
    from app.states import is_terminal

    rows = rows_for(ids)
    return len(rows) == len(ids) and all(is_terminal(x.state) for x in rows.values())


def test_sigkill_a_worker_process_every_two_seconds(fault_worker, make_model, model_server, r):
    make_model("kill", queue_limit=400, timeout_seconds=2, retry_times=8)
    # Calls of 0.1-0.4 s: 300 jobs over 16 call slots keep the pool busy for several kill intervals (with
    # 20-120 ms calls the slots drained them in ~4 s and the killer could land only twice).
    ids, tokens = _submit_many("kill", 300, lambda i: {"token": f"k{i}", "sleep_ms": random.randint(100, 400)})
    kills, stop = [], threading.Event()

    def killer():
        while not stop.wait(2.0):
            busy = [c for c in model_server.state.calls if time.time() - c["t"] < 0.1]
            pids = fault_worker.pool_pids()
            if pids and busy:
                pid = random.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer, daemon=True)
    with maintenance_loop(republish_after=5):
        t.start()
        try:
            wait_until(lambda: _all_terminal(ids), timeout=150, interval=0.5, what="300 jobs to end")
        finally:
            stop.set()
            t.join()
    # A kill between a job's terminal commit and its slot release leaves the
    # slot behind (the order that never over-admits); beat's reconcile pass
    # returns it.  At most one such slot per kill, and none after reconcile.
    leaked = r.zrange("asynch:gate:{kill}", 0, -1)
    assert len(leaked) <= len(kills), (leaked, kills)
    from app.config import get_settings, set_settings
    from app.maintenance.passes import reconcile_gates

    set_settings(get_settings().with_overrides(reconcile_grace_seconds=0))  # the slots are young
    reconcile_gates()
    rows = assert_ledger_invariants(ids, r, ["kill"])
    states = Counter(JobState(x.state).label for x in rows.values())
    assert states == {"done": 300}, states
    assert len(kills) >= 3
    # Killed attempts were recovered and retried: some job needed more than one attempt,
    # and no attempt ever called the model twice.
    # A process killed while sending its request leaves the stub a truncated
    # body (recorded as _raw); every complete call carries its token.
    strays = [c for c in model_server.state.calls if "token" not in c["payload"]]
    assert all("_raw" in c["payload"] for c in strays), strays
    calls = Counter(c["payload"]["token"] for c in model_server.state.calls if "token" in c["payload"])
    assert any(x.attempt > 1 for x in rows.values())
    for jid, row in rows.items():
        assert calls[tokens[jid]] <= row.attempt
    print(f"\nsigkill: {len(kills)} kills, {sum(x.attempt for x in rows.values()) - 300} extra attempts")


def test_sigstop_past_the_lease_then_sigcont(fault_worker, make_model, model_server, r, settings):
    make_model("frozen", timeout_seconds=1, retry_times=2)
    jid = jobs.submit(P, "frozen", {"token": "f", "sleep_ms": 300}).row.id
    wait_until(lambda: model_server.state.in_flight == 1, what="the model call to start")
    running = job_row(jid)
    assert running.state == JobState.RUNNING and running.attempt == 1
    # Freeze the whole worker node mid-call (master and pool), past its lease.
    os.killpg(fault_worker.proc.pid, signal.SIGSTOP)
    try:
        with maintenance_loop():
            wait_until(lambda: job_row(jid).state != JobState.RUNNING or job_row(jid).attempt > 1, timeout=20,
                       what="lease recovery")
        assert job_row(jid).state == JobState.RETRY_WAIT
        assert job_row(jid).error == "worker_lost: worker lost (lease expired)"
        # A second worker takes the retry while the first is still frozen.
        env = {**fault_worker.env, "ASYNCH_LEASE_GRACE_SECONDS": "30"}
        second = WorkerProcess(env, concurrency=1, log_path=fault_worker.log_path.with_name("second.log"),
                               name="second").start()
        try:
            with maintenance_loop():
                wait_until(lambda: job_row(jid).state == JobState.DONE, timeout=30, what="retry on another worker")
        finally:
            second.stop()
    finally:
        os.killpg(fault_worker.proc.pid, signal.SIGCONT)
    done = job_row(jid)
    assert done.attempt == 2 and done.result_location.endswith(f"/{jid}/2")
    # The thawed worker finishes its stale attempt: its write is refused and its
    # upload removed, so exactly one result object exists.
    wait_until(lambda: model_server.state.in_flight == 0, timeout=10, what="the stale call to end")
    time.sleep(1.0)  # let the stale attempt reach its (refused) completion
    after = job_row(jid)
    assert (after.state, after.attempt, after.result_location, after.finished_at) == \
        (done.state, done.attempt, done.result_location, done.finished_at)
    from app.infra.storage import get_storage

    files = [p for p in get_storage().root.rglob("*") if p.is_file() and jid in str(p)]
    assert [p.name for p in files] == ["2"]
    assert r.zcard("asynch:gate:{frozen}") == 0


class GarbageServer:
    """Accepts a connection, sends bytes that are not HTTP, closes."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.recv(65536)
            c.sendall(b"\x00\x01garbage, not HTTP at all\r\n\r\n")
            c.close()


def test_model_service_failing_in_every_way(fault_worker, make_model, model_server, r):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    garbage = GarbageServer()
    cases = {
        # model name: (config, payload, expected error fragment)
        "f500": ({}, {"status": 500}, "HTTP 500"),
        "fhang": ({"timeout_seconds": 1}, {"sleep_ms": 4000}, "timed out"),
        "frefused": ({"base_url": f"http://127.0.0.1:{dead_port}"}, {}, "unreachable"),
        "fgarbage": ({"base_url": f"http://127.0.0.1:{garbage.port}"}, {}, "model"),
        "fhuge": ({}, {"size": 50000}, "exceeds 10000 bytes"),
    }
    ids = {}
    for name, (cfg, payload, _) in cases.items():
        make_model(name, retry_times=1, **cfg)
        ids[name] = [jobs.submit(P, name, {**payload, "token": f"{name}{i}"}).row.id for i in range(3)]
    all_ids = [j for v in ids.values() for j in v]
    with maintenance_loop():
        wait_until(lambda: _all_terminal(all_ids), timeout=90, interval=0.3, what="faulty jobs to end")
    rows = assert_ledger_invariants(all_ids, r, list(cases))
    for name, (_, _, fragment) in cases.items():
        for jid in ids[name]:
            row = rows[jid]
            assert row.state == JobState.FAILED, (name, row.state)
            assert fragment in row.error, (name, row.error)
            # Permanent errors (oversize) are not retried; transient ones are, once.
            assert row.attempt == (1 if name == "fhuge" else 2), (name, row.attempt)
    garbage.sock.close()
