"""The console with real payloads and a user's key, in headless Chromium
(tests/console_browser.py): a job carrying a 6 KB unbroken string (payload
and result) keeps every page inside its window; a job page without a
callback asks for nothing that is not there (no 4xx, no console error);
invalid JSON in the submit form's "Other fields" is said next to the field
and sends nothing; a user key meets no admin control it cannot use (no "New
model", Workers and Maintenance say "admin key required" and follow nothing
live); the failed jobs list shows each job's error; and the wording says
what it means (a webhook's event beside its delivery status, a requeue
whose time is not recorded, plurals, the upstream limit beside running /
max concurrency)."""
from __future__ import annotations

import re

import pytest
from console_browser import browser, login, page, quiet, shot  # noqa: F401 (fixtures)
from helpers import auth, make_key, wait_until
from sqlalchemy import func, insert, select

from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.redis import upstream
from app.infra.tables import deliveries, delivery_attempts, tasks
from app.maintenance import passes

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails under CI)
    expect = None

BIG = "QmFzZTY0IGJsb2I" * 410  # 6,150 characters, no space or hyphen to break at: a base64 blob


def _jobs() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar_one()


def _job(client, key: str, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()


@pytest.mark.e2e
def test_a_6kb_value_wraps_and_a_job_page_without_deliveries_asks_for_nothing_missing(
        page, api_url, workers, make_model, client, model_server):
    make_model("echo", retry_times=2)
    key = make_key("ops", admin=True)
    # Two failed tries, then done: the first requeue's time is not kept by the row.
    job_id = client.post("/v1/models/echo/jobs", json={"tag": "six-kb", "fail_first": 2, "blob": BIG},
                         headers=auth(key)).get_json()["job_id"]
    wait_until(lambda: passes.run_work() is not None and _job(client, key, job_id)["state"] == "done",
               timeout=60, interval=0.3, what="the job to be done after two retries")
    noise = quiet(page)
    login(page, api_url, key, f"/console/jobs/{job_id}")
    page.wait_for_selector("#result-tree")
    page.wait_for_selector("#no-deliveries")  # the deliveries were read: no callback, no webhook
    assert BIG in page.text_content('[data-field="payload"]')  # folded or wrapped, never cut
    assert BIG in page.text_content("#result-tree")
    shot(page, "payloads/job-6kb")  # no wider than the window
    page.click("#result summary:text('Raw JSON')")
    shot(page, "payloads/job-6kb-raw")
    requeues = page.locator('#timeline li[data-event="requeued"]').all_text_contents()
    assert len(requeues) == 2 and "time not kept" not in " ".join(requeues)
    assert "re-admitted for retry 1" in requeues[0] and "time not recorded" in requeues[0]
    assert "only the latest requeue's time is kept" in requeues[0]
    assert "time not recorded" not in requeues[1]
    assert noise == [], f"the job page asked for something missing or logged an error: {noise}"

    page.goto(f"{api_url}/console/jobs")
    page.wait_for_selector(f'#jobs-table tr[data-job="{job_id}"]')
    shot(page, "payloads/jobs")


@pytest.mark.e2e
def test_invalid_other_fields_are_said_next_to_the_field_and_nothing_is_sent(page, api_url, make_model):
    make_model("echo")
    key = make_key("ops", admin=True)
    login(page, api_url, key, "/console/submit?model=echo")
    page.wait_for_selector("#extra-json")
    posts: list[str] = []
    page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    for text, said in [('{"prompt": "hi",', "is not valid JSON"), ("[1, 2]", "must be a JSON object"),
                       ('"hi"', "must be a JSON object")]:
        page.fill("#extra-json", text)
        page.click("#submit-job")
        expect(page.locator("#extra-field .error")).to_contain_text(said)
        expect(page.locator("#extra-field")).to_have_class(re.compile(r"\binvalid\b"))
        expect(page.locator("#extra-json")).to_be_focused()
        shot(page, "payloads/submit-invalid-json")
        assert posts == [] and _jobs() == 0, "invalid JSON was sent"
    page.fill("#extra-json", '{"prompt": "hi"}')
    page.click("#submit-job")
    page.wait_for_selector("#submitted:not([hidden])")
    assert page.text_content("#extra-field .error") == "" and _jobs() == 1


def _webhook_delivered(job_id: str, tenant: str) -> None:
    """The job's own webhook on its failed state, delivered at the first try (as the delivery worker records it)."""
    now = clock_now()
    with transaction() as conn:
        wid = conn.execute(insert(deliveries).values(
            kind="webhook", job_id=job_id, tenant_id=tenant, subscription_id=0, event="failed",
            url="http://hooks.example/failed", status="delivered", attempts=1, next_attempt_at=now, delivered_at=now,
            created_at=now, updated_at=now).returning(deliveries.c.id)).scalar_one()
        conn.execute(insert(delivery_attempts).values(delivery_id=wid, attempt=1, started_at=now, duration_ms=7,
                                                     address="203.0.113.9", http_status=204, error=None))


@pytest.mark.e2e
def test_a_user_key_meets_no_admin_control_and_reads_the_failed_jobs(page, api_url, workers, make_model, client):
    make_model("echo")
    make_model("bad", retry_times=0)
    make_model("pushback", max_concurrency=4)
    user = make_key("acme")
    failed = client.post("/v1/models/bad/jobs", json={"status": 500}, headers=auth(user)).get_json()["job_id"]
    # The upstream answers two tenants busy three times in a row each (overload, not one tenant's quota: three
    # busy rounds make a scope congested, app/infra/redis/upstream_lib.lua): the controller holds the model
    # below its max_concurrency.
    other = make_key("other-co")
    busy = {k: client.post("/v1/models/pushback/jobs", json={"status_first": 429, "tag": f"pb-{i}", "fail_first": 3},
                           headers=auth(k)).get_json()["job_id"] for i, k in enumerate((user, other))}
    wait_until(lambda: _job(client, user, failed)["state"] == "failed", what="the failed job to end")
    for k, j in busy.items():
        wait_until(lambda j=j, k=k: _job(client, k, j)["state"] == "done", what="the busy jobs to end")
    _webhook_delivered(failed, "acme")

    login(page, api_url, user, "/console/models")
    expect(page.locator("#whoami")).to_have_text("user · acme")
    page.wait_for_selector('tr[data-model="echo"]')
    expect(page.locator("#new-model")).to_be_hidden()
    assert page.locator('a[href^="/console/models/edit"]:visible').count() == 0
    assert page.locator("header nav a:visible").all_text_contents() == ["Models", "Submit", "Jobs", "Batches", "Tenants"]
    # Running / max concurrency, and the upstream's lower limit said as one.
    limit, _ = upstream.snapshot(["pushback"])["pushback"]
    assert limit is not None and limit < 4, "the busy answer left no upstream limit to show"
    running = page.locator('tr[data-model="pushback"] td.running')
    expect(running).to_contain_text(f"upstream limit {limit}")
    assert running.text_content().startswith("0 / 4") and "(upstream " not in running.text_content()
    assert page.text_content("#models-table thead").count("Running / max concurrency") == 1
    shot(page, "user/models")

    # An admin page says so before anything is typed, and offers no form.
    page.goto(f"{api_url}/console/models/edit")
    expect(page.locator("#flash")).to_contain_text("admin key required")
    expect(page.locator("#model-form")).to_be_hidden()
    shot(page, "user/model-edit")
    for path in ("/console/workers", "/console/maintenance"):
        page.goto(api_url + path)
        expect(page.locator("#flash")).to_contain_text("admin key required")
        # Nothing to follow: no stream, no polling (a page that follows something never goes quiet).
        page.wait_for_load_state("networkidle", timeout=15000)
        assert "Live" not in page.evaluate("document.body.innerText")
        assert page.locator("main table:visible, #reconcile:visible").count() == 0
        shot(page, "user" + path.removeprefix("/console"))

    # The failed jobs, each with its error.
    page.goto(f"{api_url}/console/jobs?state=failed")
    row = page.locator(f'#jobs-table tr[data-job="{failed}"]')
    expect(row.locator("td.error")).to_contain_text("model_http_error")
    assert "Error" in page.locator("#jobs-table thead th").all_text_contents()
    shot(page, "user/jobs-failed")

    # Its webhook: the event it was sent for, then how the delivery went.
    page.goto(f"{api_url}/console/jobs/{failed}")
    hook = page.locator('#deliveries section.delivery[data-kind="webhook failed"]')
    expect(hook.locator("h3")).to_have_text("Webhook for job.failed — delivered after 1 try")
    shot(page, "user/job-webhook")
