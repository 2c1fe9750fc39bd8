"""Issue 21, items 1 and 6: what a caller without a key can make the API do,
and what a model's result may do in a browser.

- /openapi.json is built once per process (30 requests together build it
  once) and served with a strong ETag (304 on If-None-Match); another
  tenant's request answers meanwhile.
- Anonymous requests are limited per client address (429 + Retry-After);
  health probes have their own, larger bucket; keyed requests are not charged.
- Every answer says nosniff; a result answers with a sandbox CSP, and as an
  attachment unless it is JSON, text/plain or an image.
"""
from __future__ import annotations

import threading
import uuid

import pytest
from helpers import auth, make_key
from sqlalchemy import insert

from app import create_app
from app.clock import now
from app.config import set_settings
from app.infra.db import transaction
from app.infra.tables import tasks
from app.states import JobState
from app.web import openapi


def _app(settings, **kw):
    set_settings(settings.with_overrides(**kw))
    return create_app()


def _get_all(app, requests: list[tuple[str, dict]]) -> list:
    """Each (path, headers) from its own thread, all released at once."""
    out: list = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def one(i, path, headers):
        c = app.test_client()
        start.wait(timeout=30)
        out[i] = c.get(path, headers=headers)

    threads = [threading.Thread(target=one, args=(i, p, h)) for i, (p, h) in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r is not None for r in out)
    return out


def test_30_parallel_requests_build_the_document_once_and_a_tenant_still_answers(settings):
    app = _app(settings, anon_rate_limit_per_second=1000.0, anon_rate_limit_burst=1000)
    key = make_key("tenant-a")
    before = openapi.BUILDS
    answers = _get_all(app, [("/openapi.json", {})] * 30 + [("/v1/jobs", auth(key))])
    docs, tenant = answers[:30], answers[30]
    assert [r.status_code for r in docs] == [200] * 30
    assert openapi.BUILDS - before == 1
    assert len({r.headers["ETag"] for r in docs}) == 1 and len({r.data for r in docs}) == 1
    assert tenant.status_code == 200
    # Later requests reuse it too.
    assert app.test_client().get("/openapi.json").status_code == 200
    assert openapi.BUILDS - before == 1


def test_document_etag_and_if_none_match(settings):
    c = _app(settings).test_client()
    first = c.get("/openapi.json")
    etag = first.headers["ETag"]
    assert first.status_code == 200 and etag.startswith('"') and not etag.startswith('W/')
    again = c.get("/openapi.json", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.data == b"" and again.headers["ETag"] == etag
    assert c.get("/openapi.json", headers={"If-None-Match": '"other"'}).status_code == 200


def test_anonymous_flood_gets_429_per_address_and_spares_keys_probes_and_others(settings):
    c = _app(settings, anon_rate_limit_per_second=0.01, anon_rate_limit_burst=5).test_client()
    key = make_key("tenant-a")
    codes = [c.get(p).status_code for p in ["/openapi.json", "/console/login", "/console/static/console.css",
                                            "/no/such/path", "/metrics"]]
    assert codes == [200, 200, 200, 404, 200]
    for path in ("/openapi.json", "/console/static/console.js", "/console/jobs", "/metrics", "/nope"):
        resp = c.get(path)
        assert resp.status_code == 429, path
        assert int(resp.headers["Retry-After"]) >= 1 and "anonymous" in resp.get_json()["error"]
    # A key that fails is anonymous too; a working key has its own bucket.
    assert c.get("/v1/jobs", headers=auth("ak_nope_" + "x" * 40)).status_code == 429
    assert c.get("/v1/jobs", headers=auth(key)).status_code == 200
    # Probes from the flooded address take from their own bucket.
    assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
    # Another address is not affected.
    other = {"REMOTE_ADDR": "10.1.2.3"}
    assert c.get("/openapi.json", environ_base=other).status_code == 200


def test_default_limit_lets_a_probe_through_after_a_flood(settings):
    """The defaults: a flood of /openapi.json from an address is refused
    after its burst, while that address's every-second probe keeps working."""
    c = _app(settings).test_client()
    codes = [c.get("/openapi.json").status_code for _ in range(80)]
    assert codes.count(429) > 0 and codes[:50] == [200] * 50
    assert [c.get("/healthz").status_code for _ in range(100)] == [200] * 100


def test_off_means_no_limit(settings, r):
    c = _app(settings, anon_rate_limit_per_second=0.0).test_client()
    assert all(c.get("/healthz").status_code == 200 for _ in range(30))
    assert "RateLimit" not in c.get("/openapi.json").headers
    assert not r.keys("*ratelimit*")


# --- item 6: results are not pages of this origin ---------------------------------------

def _done_job(tenant: str, ctype: str, body: bytes) -> str:
    job_id = str(uuid.uuid4())
    t = now()
    with transaction() as conn:
        conn.execute(insert(tasks).values(
            id=job_id, tenant_id=tenant, model_name="m", request_payload="{}", request_hash="h", state=int(JobState.DONE),
            attempt=1, created_at=t, enqueue_at=t, updated_at=t, finished_at=t, result_location="inline:",
            result_content_type=ctype, result_size=len(body), result_inline=body))
    return job_id


@pytest.mark.parametrize("ctype, attachment", [
    ("text/html; charset=utf-8", True), ("image/svg+xml", True), ("application/xml", True),
    ("application/octet-stream", True), ("application/json", False), ("application/problem+json", False),
    ("text/plain", False), ("image/png", False)])
def test_result_headers(settings, ctype, attachment):
    c = _app(settings).test_client()
    key = make_key("tenant-a")
    job_id = _done_job("tenant-a", ctype, b"<script>alert(1)</script>")
    resp = c.get(f"/v1/models/m/jobs/{job_id}/result", headers=auth(key))
    assert resp.status_code == 200 and resp.headers["Content-Type"] == ctype
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"
    assert (resp.headers.get("Content-Disposition") == "attachment") is attachment


def test_every_answer_says_nosniff_and_console_keeps_its_own_csp(settings):
    c = _app(settings).test_client()
    key = make_key("tenant-a")
    for resp in (c.get("/healthz"), c.get("/v1/jobs", headers=auth(key)), c.get("/v1/jobs"),
                 c.get("/no/such"), c.post("/v1/models/m/jobs", headers=auth(key), data="x"),
                 c.get("/task/getTaskResult?taskId=nope", headers=auth(key)), c.get("/openapi.json")):
        assert resp.headers["X-Content-Type-Options"] == "nosniff", resp.request.path
        assert "sandbox" not in resp.headers.get("Content-Security-Policy", "")
    page = c.get("/console/login")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "sandbox" not in page.headers["Content-Security-Policy"]
