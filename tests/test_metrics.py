"""/metrics: cluster-wide counters in Redis, gauges from the database and
the gates, worker liveness; checked against the database after a real run
under two gunicorn processes and two worker nodes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from app.infra import metrics
from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import model_stats, tasks
from conftest import ROOT, WorkerProcess, auth, free_port, wait_until


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(sm: dict, name: str, **labels) -> float:
    return sm.get((name, frozenset(labels.items())), 0.0)


def test_counters_gauges_and_overrides(client, make_model, user_key, r, settings):
    make_model("echo", queue_limit=1, form=[{"field": "prompt", "type": "string", "required": True}])
    make_model("idle", queue_limit=7, max_concurrency=3, enabled=False)
    h = auth(user_key)
    ok = client.post("/v1/models/echo/jobs", json={"prompt": "a"}, headers=h)
    assert ok.status_code == 202
    assert client.post("/v1/models/echo/jobs", json={"prompt": "b"}, headers=h).status_code == 429
    assert client.post("/v1/models/echo/jobs", json={}, headers=h).status_code == 422
    assert client.post("/v1/models/ghost/jobs", json={}, headers=h).status_code == 404
    assert client.post(ok.get_json()["poll_url"] + "/cancel", headers=h).status_code == 200
    r.set("asynch:runtime:queue_limit:idle", 5)
    r.set("asynch:runtime:max_concurrency:idle", 2)
    metrics.callback_delivered("echo", True)
    metrics.callback_delivered("echo", False)
    metrics.flush()  # this process buffers its increments (ASYNCH_METRICS_FLUSH_SECONDS)

    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    sm = samples(resp.get_data(as_text=True))
    assert value(sm, "asynch_admissions_total", model="echo") == 1
    assert value(sm, "asynch_rejections_total", model="echo", reason="queue_full") == 1
    assert value(sm, "asynch_rejections_total", model="echo", reason="invalid") == 1
    assert value(sm, "asynch_rejections_total", model="_unknown", reason="not_found") == 1
    assert not any("ghost" in str(k) for k in sm)
    assert value(sm, "asynch_jobs", model="echo", state="canceled") == 1
    assert value(sm, "asynch_jobs", model="echo", state="pending") == 0
    assert value(sm, "asynch_job_duration_seconds_count", model="echo", state="canceled") == 1
    assert value(sm, "asynch_job_duration_seconds_bucket", model="echo", state="canceled", le="+Inf") == 1
    assert value(sm, "asynch_queue_depth", model="echo") == 0
    assert value(sm, "asynch_queue_limit", model="echo") == 1
    assert value(sm, "asynch_queue_limit", model="idle") == 5
    assert value(sm, "asynch_queue_limit_configured", model="idle") == 7
    assert value(sm, "asynch_runtime_queue_limit", model="idle") == 5
    assert value(sm, "asynch_runtime_max_concurrency", model="idle") == 2
    assert value(sm, "asynch_max_concurrency", model="idle") == 2
    assert value(sm, "asynch_model_enabled", model="idle") == 0
    assert ("asynch_runtime_queue_limit", frozenset({("model", "echo")})) not in sm
    assert value(sm, "asynch_callback_deliveries_total", model="echo", outcome="delivered") == 1
    assert value(sm, "asynch_callback_deliveries_total", model="echo", outcome="failed") == 1
    assert value(sm, "asynch_metrics_source_up", source="database") == 1
    assert value(sm, "asynch_metrics_source_up", source="redis") == 1


def test_metrics_token_when_configured(client, settings):
    set_settings(settings.with_overrides(metrics_token="scrape-secret"))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"}).status_code == 200


def _gunicorn(test_env: dict, port: int, access_log, error_log) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4",
            "--worker-class", "gthread", "--access-logfile", str(access_log),
            "--access-logformat", "%(p)s %(m)s %(U)s %(s)s", "app.wsgi:app"]
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **test_env}, stdout=subprocess.DEVNULL,
                            stderr=open(error_log, "w"), start_new_session=True)


def _db_totals(model: str) -> tuple[dict[str, int], int]:
    with transaction() as conn:
        by_state = {s: n for s, n in conn.execute(select(tasks.c.state, func.count()).where(
            tasks.c.model_name == model).group_by(tasks.c.state))}
        calls = conn.execute(select(func.coalesce(func.sum(model_stats.c.request_count), 0)).where(
            model_stats.c.model_name == model)).scalar_one()
    return by_state, int(calls)


@pytest.mark.slow
@pytest.mark.e2e
def test_two_api_processes_and_two_workers_report_the_database_totals(test_env, make_model, user_key, tmp_path):
    make_model("echo", queue_limit=250, max_concurrency=8)
    port = free_port()
    api = _gunicorn(test_env, port, tmp_path / "access.log", tmp_path / "gunicorn.log")
    nodes = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(base), timeout=30, what="gunicorn")
        start = time.time()
        nodes = [WorkerProcess(test_env, concurrency=2, log_path=tmp_path / f"w{i}.log", name=f"w{i}").start()
                 for i in (1, 2)]

        def one(i: int) -> int:
            return requests.post(f"{base}/v1/models/echo/jobs", json={"i": i},
                                 headers={**auth(user_key), "Connection": "close"}, timeout=30).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(one, range(200)))
        assert codes == [202] * 200
        wait_until(lambda: _db_totals("echo")[0] == {2: 200}, timeout=150, interval=0.5, what="200 jobs done")
        # Every process flushes its buffered increments within one interval.
        def flushed() -> bool:
            sm = samples(requests.get(f"{base}/metrics", headers={"Connection": "close"}, timeout=30).text)
            return (value(sm, "asynch_admissions_total", model="echo") == 200
                    and value(sm, "asynch_model_call_duration_seconds_count", model="echo", outcome="ok") == 200
                    and value(sm, "asynch_job_duration_seconds_count", model="echo", state="done") == 200)

        wait_until(flushed, timeout=15, interval=0.3, what="metrics flushed")

        scrapes = [samples(requests.get(f"{base}/metrics", headers={"Connection": "close"}, timeout=30).text)
                   for _ in range(4)]
        by_state, calls = _db_totals("echo")
        for sm in scrapes:
            assert value(sm, "asynch_jobs", model="echo", state="done") == by_state[2] == 200
            assert sum(v for (n, lab), v in sm.items()
                       if n == "asynch_jobs" and ("model", "echo") in lab) == 200
            assert value(sm, "asynch_admissions_total", model="echo") == 200
            assert value(sm, "asynch_job_duration_seconds_count", model="echo", state="done") == 200
            assert value(sm, "asynch_job_duration_seconds_bucket", model="echo", state="done", le="+Inf") == 200
            assert value(sm, "asynch_model_call_duration_seconds_count", model="echo", outcome="ok") == calls == 200
            assert value(sm, "asynch_queue_depth", model="echo") == 0
            assert value(sm, "asynch_workers_consuming") == 2
            consumed = {dict(lab)["worker"]: v for (n, lab), v in sm.items()
                        if n == "asynch_worker_last_consumed_seconds"}
            assert len(consumed) == 2 and all(v >= start - 1 for v in consumed.values()), consumed

        # Both gunicorn processes answered: the totals above are not one process's memory.
        pids = {line.split()[0] for line in (tmp_path / "access.log").read_text().splitlines()
                if re.search(r" POST /v1/models/echo/jobs 202$", line)}
        assert len(pids) == 2, pids

        # Liveness means consuming: a stopped worker leaves the count.
        nodes[1].stop()
        wait_until(lambda: value(samples(requests.get(f"{base}/metrics", timeout=30).text),
                                 "asynch_workers_consuming") == 1, timeout=30, what="stopped worker dropped")
    finally:
        for n in nodes:
            n.stop()
        os.killpg(api.pid, 15)
        api.wait(15)


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False
