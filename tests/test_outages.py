"""Dependencies going away mid-run: Redis wiped and restarted, PostgreSQL
restarted.  While a dependency is down the API answers 503 (never a 202
without a row); afterwards recovery brings every admitted job to done and
the gates back to the database's truth.

These restart the suite's OWN Redis (Valkey) and PostgreSQL servers
(tests/conftest.py ``SERVERS``), never the machine's: safe to run anywhere.
When ASYNCH_TEST_PG_ADMIN / ASYNCH_TEST_REDIS point the suite at other
servers, the test that would restart one skips.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis as redis_lib
import requests
import helpers
from helpers import BROKER_DB, GATE_DB, WorkerProcess, auth, redis_db, wait_until
from stress_util import assert_ledger_invariants, maintenance_loop, rows_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.outage]



def _own(kind: str):
    """The suite's own server of ``kind`` (pg, redis), which the test may restart."""
    srv = getattr(helpers.SERVERS, kind)
    if srv is None:
        pytest.skip(f"the suite runs on another {kind} server (ASYNCH_TEST_*): not ours to restart")
    return srv


@pytest.fixture(scope="module")
def outage_worker(test_env, tmp_path_factory):
    env = {**test_env, "ASYNCH_LEASE_GRACE_SECONDS": "1"}
    w = WorkerProcess(env, concurrency=2, log_path=tmp_path_factory.mktemp("ow") / "worker.log", name="outage")
    w.start()
    yield w
    w.stop()


class Submitter:
    """Submits over HTTP until told to stop; remembers every answer."""

    def __init__(self, api_url: str, key: str, model: str, target: int):
        self.api_url, self.key, self.model, self.target = api_url, key, model, target
        self.admitted: list[str] = []
        self.codes: Counter = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        s = requests.Session()
        i = 0
        while not self.stop.is_set() and len(self.admitted) < self.target:
            i += 1
            try:
                resp = s.post(f"{self.api_url}/v1/models/{self.model}/jobs", json={"i": i, "sleep_ms": 10},
                              headers=auth(self.key), timeout=30)
            except requests.RequestException:
                self.codes["conn-error"] += 1
                time.sleep(0.05)
                continue
            self.codes[resp.status_code] += 1
            if resp.status_code == 202:
                self.admitted.append(resp.json()["job_id"])
            else:
                assert isinstance(resp.json().get("error"), str)
                time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def _all_done(ids) -> bool:
    from app.errors import Unavailable

    try:
        rows = rows_for(ids)
    except Unavailable:  # a pooled connection from before the restart
        return False
    return len(rows) == len(ids) and all(x.state == 2 for x in rows.values())


@pytest.fixture(autouse=True)
def _fresh_pool_afterwards():
    yield
    from app.infra.db import get_engine

    get_engine().dispose()  # no connection from before a restart survives into the next test


def test_redis_wiped_and_restarted_mid_run(api_url, outage_worker, make_model, user_key, r):
    server = _own("redis")
    make_model("rwipe", queue_limit=50, timeout_seconds=2, retry_times=5)
    with maintenance_loop(republish_after=2, reconcile=True) as errors:
        with Submitter(api_url, user_key, "rwipe", 200) as sub:
            wait_until(lambda: len(sub.admitted) >= 60, timeout=60, what="first jobs")
            for db in (GATE_DB, BROKER_DB):
                redis_db(db).flushdb()  # everything derived is gone
            wait_until(lambda: len(sub.admitted) >= 120, timeout=60, what="more jobs")
            server.stop()  # no snapshot configured: it comes back empty
            time.sleep(1.0)
            server.start()
            wait_until(lambda: _ping(), timeout=20, what="redis back")
            wait_until(lambda: len(sub.admitted) >= 200, timeout=90, what="200 admissions")
        wait_until(lambda: _all_done(sub.admitted), timeout=120, interval=0.5, what="every admitted job done")
        # One more reconcile after the last job: the gates equal the (empty) active set.
        from app.maintenance.passes import reconcile_gates

        reconcile_gates()
    assert_ledger_invariants(sub.admitted, r, ["rwipe"])
    assert set(sub.codes) <= {202, 429, 503, "conn-error"}, sub.codes
    print(f"\nredis outage: {dict(sub.codes)}, maintenance errors during the outage: {len(errors)}")


def _ping() -> bool:
    try:
        return redis_db(0).ping()
    except redis_lib.RedisError:
        return False


def test_postgres_restarted_mid_run(api_url, outage_worker, make_model, user_key, r):
    server = _own("pg")
    make_model("pgdown", queue_limit=50, timeout_seconds=2, retry_times=5)
    with maintenance_loop(republish_after=2, reconcile=True) as errors:
        with Submitter(api_url, user_key, "pgdown", 150) as sub:
            wait_until(lambda: len(sub.admitted) >= 50, timeout=60, what="first jobs")
            server.stop()  # fast shutdown, as pg_ctl stop -m fast
            time.sleep(2.0)  # the API keeps answering, 503, while the database is down
            down_codes = dict(sub.codes)
            server.start()
            wait_until(lambda: len(sub.admitted) >= 150, timeout=90, what="150 admissions")
        wait_until(lambda: _all_done(sub.admitted), timeout=120, interval=0.5, what="every admitted job done")
    assert_ledger_invariants(sub.admitted, r, ["pgdown"])
    assert sub.codes[503] > 0, sub.codes
    assert set(sub.codes) <= {202, 429, 503, "conn-error"}, sub.codes
    print(f"\npostgres outage: {dict(sub.codes)} (at restart: {down_codes}), maintenance errors: {len(errors)}")
