"""In-process metrics: /metrics (this process's counters and histograms)
and /metrics/cluster (gauges from the database and the gates).  Real
process groups (gunicorn servers, worker nodes) scraped and summed:
tests/test_metrics_processes.py."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from helpers import auth, samples, value

from app.config import set_settings
from app.infra import metrics
from app.infra.db import transaction
from app.infra.tables import tasks


def test_counters_gauges_and_overrides(client, make_model, user_key, r, settings):
    make_model("echo", queue_limit=1, form=[{"field": "prompt", "type": "string", "required": True}])
    make_model("idle", queue_limit=7, max_concurrency=3, enabled=False)
    # Counters live in this process for the whole session: compare with before.
    before = samples(client.get("/metrics").get_data(as_text=True))
    h = auth(user_key)
    ok = client.post("/v1/models/echo/jobs", json={"prompt": "a"}, headers=h)
    assert ok.status_code == 202
    assert client.post("/v1/models/echo/jobs", json={"prompt": "b"}, headers=h).status_code == 429
    assert client.post("/v1/models/echo/jobs", json={}, headers=h).status_code == 422
    assert client.post("/v1/models/ghost/jobs", json={}, headers=h).status_code == 404
    assert client.post(ok.get_json()["poll_url"] + "/cancel", headers=h).status_code == 200
    r.set("asynch:runtime:queue_limit:{idle}", 5)
    r.set("asynch:runtime:max_concurrency:{idle}", 2)
    metrics.delivery_settled("callback", "echo", True)
    metrics.delivery_settled("webhook", "echo", False)

    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    sm = samples(resp.get_data(as_text=True))

    def delta(name: str, **labels) -> float:
        return value(sm, name, **labels) - value(before, name, **labels)

    assert delta("asynch_admissions_total", model="echo") == 1
    assert delta("asynch_rejections_total", model="echo", reason="queue_full") == 1
    assert delta("asynch_rejections_total", model="echo", reason="invalid") == 1
    assert delta("asynch_rejections_total", model="_unknown", reason="not_found") == 1
    assert not any("ghost" in str(k) for k in sm)
    assert delta("asynch_job_duration_seconds_count", model="echo", state="canceled") == 1
    assert delta("asynch_job_duration_seconds_bucket", model="echo", state="canceled", le="+Inf") == 1
    assert delta("asynch_deliveries_total", kind="callback", model="echo", outcome="delivered") == 1
    assert delta("asynch_deliveries_total", kind="webhook", model="echo", outcome="failed") == 1
    # A process's /metrics carries no cluster gauge: summing pods must not multiply one.
    assert not any(n.startswith(("asynch_jobs", "asynch_queue_", "asynch_worker", "asynch_metrics_source"))
                   for n, _ in sm)

    resp = client.get("/metrics/cluster")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    sm = samples(resp.get_data(as_text=True))
    assert value(sm, "asynch_jobs", model="echo", state="canceled") == 1
    assert value(sm, "asynch_jobs", model="echo", state="pending") == 0
    assert value(sm, "asynch_jobs", model="idle", state="pending") == 0
    assert value(sm, "asynch_oldest_pending_age_seconds", model="echo") == 0
    assert ("asynch_oldest_pending_age_seconds", frozenset({("model", "idle")})) in sm
    assert value(sm, "asynch_queue_depth", model="echo") == 0
    assert value(sm, "asynch_queue_limit", model="echo") == 1
    assert value(sm, "asynch_queue_limit", model="idle") == 5
    assert value(sm, "asynch_queue_limit_configured", model="idle") == 7
    assert value(sm, "asynch_runtime_queue_limit", model="idle") == 5
    assert value(sm, "asynch_runtime_max_concurrency", model="idle") == 2
    assert value(sm, "asynch_max_concurrency", model="idle") == 2
    assert value(sm, "asynch_model_enabled", model="idle") == 0
    assert ("asynch_runtime_queue_limit", frozenset({("model", "echo")})) not in sm
    assert value(sm, "asynch_metrics_source_up", source="database") == 1
    assert value(sm, "asynch_metrics_source_up", source="redis") == 1
    assert not any(n.endswith(("_total", "_bucket")) for n, _ in sm), "counters belong to /metrics"


def test_oldest_pending_age_is_the_head_of_each_queue(client, make_model, user_key):
    from app.clock import now as clock_now

    make_model("echo", queue_limit=5)
    make_model("other", queue_limit=5)
    h = auth(user_key)
    ids = [client.post("/v1/models/echo/jobs", json={"i": i}, headers=h).get_json()["job_id"] for i in range(3)]
    assert client.post("/v1/models/other/jobs", json={}, headers=h).status_code == 202
    t0 = clock_now()
    with transaction() as conn:  # the head waited 120 s, the next 60 s; other's job is running
        for jid, age in zip(ids, (120, 60, 0)):
            conn.execute(tasks.update().where(tasks.c.id == jid).values(enqueue_at=t0 - timedelta(seconds=age)))
        conn.execute(tasks.update().where(tasks.c.model_name == "other").values(state=1))
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    assert 120 <= value(sm, "asynch_oldest_pending_age_seconds", model="echo") < 125
    assert value(sm, "asynch_oldest_pending_age_seconds", model="other") == 0
    with transaction() as conn:  # the head leaves the queue: the next one is the head
        conn.execute(tasks.update().where(tasks.c.id == ids[0]).values(state=1))
    sm = samples(client.get("/metrics/cluster").get_data(as_text=True))
    assert 60 <= value(sm, "asynch_oldest_pending_age_seconds", model="echo") < 65


def test_recording_never_raises(caplog):
    class Row:  # a terminal row with a state no label exists for
        model_name, state = "echo", 99
        created_at = finished_at = datetime(2024, 1, 1, tzinfo=timezone.utc)

    metrics.job_finished(Row())
    metrics.model_call("echo", "not a number", True)
    assert "metric not recorded" in caplog.text


def test_metrics_token_when_configured(client, settings):
    set_settings(settings.with_overrides(metrics_token="scrape-secret"))
    for path in ("/metrics", "/metrics/cluster"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer scrape-secret"}).status_code == 200


