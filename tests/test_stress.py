"""The distributed form of seed 000's stress test: 4 submitters, 2 worker
processes, 3 pollers and 2 waiters against one model with a small
queue_limit for ~10 s over HTTP; then every invariant of the ledger."""
from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter, defaultdict

import pytest
import requests
from helpers import auth, wait_until
from stress_util import assert_ledger_invariants, maintenance_loop

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TERMINAL = {"done", "failed", "timeout", "canceled"}
DURATION = 10.0


def run_stress(api_url: str, key: str, model: str, model_server, r) -> dict:
    stop = threading.Event()
    lock = threading.Lock()
    admitted: list[str] = []
    token_of: dict[str, str] = {}
    codes: Counter = Counter()
    problems: list[str] = []
    seen: dict[str, list[str]] = defaultdict(list)
    waits: list[tuple[str, float, float]] = []

    def submitter():
        s = requests.Session()
        while not stop.is_set():
            token = uuid.uuid4().hex
            body = {"token": token, "sleep_ms": random.randint(0, 40)}
            if random.random() < 0.1:
                body["status"] = 500  # fails, is retried once, then fails for good
            resp = s.post(f"{api_url}/v1/models/{model}/jobs", json=body, headers=auth(key), timeout=30)
            with lock:
                codes[resp.status_code] += 1
                if resp.status_code == 202:
                    jid = resp.json()["job_id"]
                    admitted.append(jid)
                    token_of[jid] = token
                elif resp.status_code != 429:
                    problems.append(f"submit {resp.status_code} {resp.text}")
            if resp.status_code == 429:
                time.sleep(0.01)

    def picks():
        """Admitted jobs at random until the run stops (none yet: a short pause)."""
        while not stop.is_set():
            with lock:
                jid = random.choice(admitted) if admitted else None
            if jid is None:
                time.sleep(0.01)
            else:
                yield jid

    def poller(me: int):
        s = requests.Session()
        for jid in picks():
            resp = s.get(f"{api_url}/v1/models/{model}/jobs/{jid}", headers=auth(key), timeout=30)
            if resp.status_code != 200:
                problems.append(f"poll {resp.status_code}")
                continue
            with lock:
                # Per poller: one thread's reads are in time order, the
                # interleaving of several threads' appends is not.
                seen[(me, jid)].append(resp.json()["state"])

    def waiter():
        s = requests.Session()
        for jid in picks():
            budget = random.choice([100, 300, 1000, 2000])
            t0 = time.monotonic()
            resp = s.get(f"{api_url}/v1/models/{model}/jobs/{jid}/wait?timeout={budget}", headers=auth(key),
                         timeout=30)
            took = time.monotonic() - t0
            with lock:
                waits.append((resp.json()["state"], took, budget / 1000))

    threads = ([threading.Thread(target=submitter) for _ in range(4)] + [threading.Thread(target=poller, args=(i,))
               for i in range(3)] + [threading.Thread(target=waiter) for _ in range(2)])
    with maintenance_loop():
        for t in threads:
            t.start()
        time.sleep(DURATION)
        stop.set()
        for t in threads:
            t.join(30)
        wait_until(lambda: r.zcard(f"asynch:gate:{{{model}}}") == 0 and _all_terminal(admitted), timeout=60,
                   what="every admitted job to end")
    assert problems == []
    rows = assert_ledger_invariants(admitted, r, [model])
    # Terminal states absorb: once a poller saw one, it never saw anything else.
    for (_, jid), states in seen.items():
        first = next((i for i, s in enumerate(states) if s in TERMINAL), None)
        if first is not None:
            assert set(states[first:]) == {states[first]}, (jid, states)
    # Waiters woke with a terminal state, or at their budget.
    for state, took, budget in waits:
        assert state in TERMINAL or took >= budget * 0.95, (state, took, budget)
    # Each attempt called the model once; done jobs in one attempt, failures in two.
    calls = Counter(c["payload"].get("token") for c in model_server.state.calls)
    for jid, row in rows.items():
        assert calls[token_of[jid]] == row.attempt, (jid, calls[token_of[jid]], row.attempt)
    return {"admitted": len(admitted), "codes": dict(codes), "waits": len(waits),
            "polls": sum(len(v) for v in seen.values()),
            "states": Counter(row.state for row in rows.values())}


def _all_terminal(ids) -> bool:
    from stress_util import rows_for

    from app.states import is_terminal

    rows = rows_for(ids)
    return len(rows) == len(ids) and all(is_terminal(x.state) for x in rows.values())


def test_stress_over_http_with_two_worker_processes(api_url, workers, make_model, user_key, model_server, r):
    make_model("stress", queue_limit=6, max_concurrency=4, retry_times=1)
    out = run_stress(api_url, user_key, "stress", model_server, r)
    print(f"\nstress: {out}")
    assert out["admitted"] > 50 and out["codes"].get(429, 0) > 0  # the gate really was contended
    assert out["waits"] > 0 and out["polls"] > 0
