"""The web console end to end in headless Chromium (Debian's, driven by
Playwright through its executable path): log in with a key, submit from the
form the model's definition renders, watch the job reach done on a real
worker process, open the result; then every operator page (a job that
failed once and its attempts and deliveries, the tenants, the workers,
maintenance), followed live over the event streams, by keyboard, and at
200% zoom.  Assertions are on the page; a screenshot of every page is saved
under build/console-screenshots/ (CONSOLE_SCREENSHOTS_DIR elsewhere), for
a person to look at.  Without a browser the test skips locally and fails
under CI (CI=true), where scripts/browser.sh installs it."""
from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import auth, make_key, wait_until
from sqlalchemy import func, insert, select

from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.redis import leader
from app.infra.tables import callback_attempts, callbacks, tasks, webhook_attempts, webhook_deliveries
from app.maintenance import passes, periodic

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # handled by the browser fixture: skip locally, fail in CI
    expect = sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


SHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS_DIR")
             or Path(__file__).resolve().parent.parent / "build" / "console-screenshots")


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser test cannot run under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        _unavailable("python playwright is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing (scripts/browser.sh installs it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _watch(pg, errors: list[str]) -> None:
    pg.set_default_timeout(30000)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
          and errors.append(m.text))


@pytest.fixture
def zoomed(browser):
    """A 1280x800 window at 200% zoom: 640x400 CSS pixels, two device pixels each."""
    ctx = browser.new_context(viewport={"width": 640, "height": 400}, device_scale_factor=2)
    pg = ctx.new_page()
    errors: list[str] = []
    _watch(pg, errors)
    yield pg
    ctx.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def page(browser):
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.set_default_timeout(30000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # CSP violations and other script errors land on the console; HTTP error
    # statuses the pages handle (401 at login, the missing favicon) do too.
    pg.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
          and errors.append(m.text))
    yield pg
    ctx.close()
    assert errors == [], f"JavaScript errors: {errors}"


FORM = [
    {"field": "prompt", "label": "Prompt", "type": "string", "required": True, "minLength": 2},
    {"field": "n", "label": "Count", "type": "integer", "min": 1, "max": 5},
    {"field": "mode", "label": "Mode", "type": "select", "options": ["fast", "slow"], "required": True},
    {"field": "flag", "label": "Flag", "type": "boolean"},
]


def _jobs() -> int:
    with transaction() as conn:
        return conn.execute(select(func.count()).select_from(tasks)).scalar_one()


@pytest.mark.e2e
def test_login_submit_watch_done_and_open_the_result(page, api_url, workers, make_model):
    make_model("echo", form=FORM)
    make_model("pic")
    key = make_key("ops", admin=True)

    # Not logged in: the console sends us to its login page and back.
    page.goto(f"{api_url}/console/submit?model=echo")
    page.wait_for_url("**/console/login**")
    page.fill("#api-key", "ak_000000000000_not-a-real-key-at-all")
    page.click("#login-form button")
    page.wait_for_selector("#flash:not([hidden])")
    assert "invalid API key" in page.text_content("#flash")
    page.fill("#api-key", key)
    page.click("#login-form button")
    page.wait_for_url("**/console/submit?model=echo")

    # The form is the model's definition.  The console judges nothing itself:
    # an invalid payload goes to the server, and the page shows the server's
    # 422 messages next to the fields its pointers name.
    page.wait_for_selector('[data-pointer="/prompt"] input')
    labels = page.locator("#job-fields label").all_text_contents()
    assert labels == ["Prompt *", "Count", "Mode *", "Flag"]
    page.fill('[data-pointer="/prompt"] input', "h")
    page.fill('[data-pointer="/n"] input', "9")
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/v1/models/echo/jobs")) as sent:
        page.click("#submit-job")
    refused = sent.value.json()
    assert sent.value.status == 422
    page.wait_for_selector('[data-pointer="/n"].invalid')
    for e in refused["errors"]:  # exactly the server's words, where its pointers say
        assert page.text_content(f'[data-pointer="{e["pointer"]}"] .error') == e["message"]
    assert {e["pointer"] for e in refused["errors"]} == {"/prompt", "/n"}
    assert "at least 2" in page.text_content('[data-pointer="/prompt"] .error')
    assert "must be <= 5" in page.text_content('[data-pointer="/n"] .error')
    assert _jobs() == 0  # refused by the server, nothing admitted

    page.fill('[data-pointer="/prompt"] input', "hello")
    page.fill('[data-pointer="/n"] input', "3")
    page.select_option('[data-pointer="/mode"] select', label="slow")
    page.check('[data-pointer="/flag"] input')
    page.click("#submit-job")
    page.wait_for_selector("#submitted:not([hidden])")
    job_id = page.text_content("#submitted-link")
    assert job_id.startswith("job_") and _jobs() == 1

    # The job page follows the job to done and previews the stored result.
    page.click("#submitted-link")
    page.wait_for_url(f"**/console/jobs/{job_id}")
    expect(page.locator('[data-field="state"]')).to_have_text("done", timeout=30000)
    page.wait_for_selector("#result-tree")
    result = page.text_content("#result-json")
    assert '"prompt": "hello"' in result and '"n": 3' in result and '"mode": "slow"' in result
    assert '"flag": true' in result
    assert page.get_attribute("#download", "download") == f"{job_id}.json"
    events = page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.event)")
    assert events[0] == "created" and "started" in events and events[-1] == "finished"
    # The JSON tree: keys and values as nodes, keyboard-foldable (<details>/<summary>).
    assert page.locator('#result-tree .json-key', has_text="prompt").count() == 1
    assert page.locator('#result-tree .json-string', has_text='"hello"').count() == 1
    shot(page, "job-done")

    # Jobs list with a filter; the row links to the job.
    page.goto(f"{api_url}/console/jobs?state=done&model=echo")
    page.wait_for_selector(f'tr[data-job="{job_id}"]')
    assert page.locator("#jobs-table tbody tr").count() == 1
    page.goto(f"{api_url}/console/jobs?state=failed")
    expect(page.locator("#jobs-table tbody tr")).to_have_count(0)

    # An image result is shown as an image.
    page.goto(f"{api_url}/console/submit?model=pic")
    page.wait_for_selector("#extra-json")
    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'
    page.fill("#extra-json", '{"content_type": "image/svg+xml", "body": %s}' % __import__("json").dumps(svg))
    page.click("#submit-job")
    page.wait_for_selector("#submitted:not([hidden])")
    page.click("#submitted-link")
    page.wait_for_selector("#result-image")
    assert page.get_attribute("#result-image", "src").startswith("blob:")
    expect(page.locator("#result-image")).to_have_js_property("naturalWidth", 8)

    # Models page: live numbers and the last hour's chart.
    page.goto(f"{api_url}/console/models")
    page.wait_for_selector('tr[data-model="echo"] td.depth')
    assert "0 / 16" in page.text_content('tr[data-model="echo"] td.depth')
    assert "0 / 4" in page.text_content('tr[data-model="echo"] td.running')
    page.wait_for_selector('#charts svg[aria-label="echo throughput and P90"]')
    shot(page, "models")


@pytest.mark.e2e
def test_admin_edits_a_model_and_sees_the_api_validation_messages(page, api_url, make_model, client):
    make_model("echo", queue_limit=16)
    key = make_key("ops", admin=True)
    page.goto(f"{api_url}/console/login?next=/console/models/edit%3Fname%3Decho")
    page.fill("#api-key", key)
    page.click("#login-form button")
    page.wait_for_url("**/console/models/edit?name=echo")
    expect(page.locator("#m-queue_limit")).to_have_value("16")
    page.fill("#m-queue_limit", "-3")
    page.fill("#m-base_url", "ftp://nowhere")
    page.click("#model-form button[type=submit]")
    page.wait_for_selector('[data-pointer="/queue_limit"].invalid')
    assert "must be an integer from 0 to" in page.text_content('[data-pointer="/queue_limit"] .error')
    assert "http(s) URL" in page.text_content('[data-pointer="/base_url"] .error')
    assert "invalid model configuration" in page.text_content("#flash")

    page.fill("#m-queue_limit", "7")
    page.fill("#m-base_url", "http://127.0.0.1:9")
    page.click("#model-form button[type=submit]")
    page.wait_for_selector("#flash.ok")
    shot(page, "model-edit")
    assert client.get("/v1/models/echo", headers={"Authorization": f"Bearer {key}"}).get_json()["queue_limit"] == 7


def _login(page, api_url: str, key: str, next_path: str) -> None:
    page.goto(f"{api_url}/console/login?next={next_path}")
    page.fill("#api-key", key)
    page.click("#login-form button")
    page.wait_for_url(lambda url: "/console/login" not in url and url.endswith(next_path))


def _delivery_log(job_id: str, tenant: str) -> None:
    """A callback that failed once, then went through, as the delivery worker records it."""
    now = clock_now()
    with transaction() as conn:
        cid = conn.execute(insert(callbacks).values(
            job_id=job_id, tenant_id=tenant, url="http://hooks.example/done?task_id=" + job_id, status="delivered",
            attempts=2, next_attempt_at=now, delivered_at=now, created_at=now, updated_at=now)
            .returning(callbacks.c.id)).scalar_one()
        conn.execute(insert(callback_attempts), [
            {"callback_id": cid, "attempt": 1, "started_at": now - timedelta(seconds=5), "duration_ms": 31,
             "address": "203.0.113.7", "http_status": 503, "error": "HTTP 503 from the receiver"},
            {"callback_id": cid, "attempt": 2, "started_at": now, "duration_ms": 12, "address": "203.0.113.7",
             "http_status": 200, "error": None}])
        wid = conn.execute(insert(webhook_deliveries).values(
            job_id=job_id, tenant_id=tenant, subscription_id=0, event="done", url="http://hooks.example/wh",
            status="failed", attempts=1, next_attempt_at=now, last_error="HTTP 410 from the receiver",
            created_at=now, updated_at=now).returning(webhook_deliveries.c.id)).scalar_one()
        conn.execute(insert(webhook_attempts).values(delivery_id=wid, attempt=1, started_at=now, duration_ms=9,
                                                     address="203.0.113.8", http_status=410,
                                                     error="HTTP 410 from the receiver"))


def _no_sideways_scroll(page) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "the page scrolls sideways"


@pytest.mark.e2e
def test_operator_pages_live_by_keyboard_and_at_200_percent(page, zoomed, api_url, workers, make_model, client,
                                                            model_server):
    make_model("flaky", retry_times=1, retry_queue_max_seconds=5)
    make_model("echo")
    key = make_key("ops", admin=True)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))

    # A job that fails once against the stub model (HTTP 503), then succeeds.
    sent = client.post("/v1/models/flaky/jobs", json={"tag": "console-once", "fail_first": 1, "n": [1, {"deep": True}]},
                       headers=auth(key))
    job_id = sent.get_json()["job_id"]
    _login(page, api_url, key, f"/console/jobs/{job_id}")
    wait_until(lambda: client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()["internal_state"] == "retry_wait",
               what="the first attempt to fail")
    # The page shows the failed attempt as it happens: over the job's event stream, not a reload.
    page.wait_for_selector('#attempts li[data-attempt="1"] .attempt-error')
    assert "503" in page.text_content('#attempts li[data-attempt="1"] .attempt-error')
    assert page.text_content('#attempts li[data-attempt="1"] .state') == "failed, retried"
    # No beat runs in the test: the retry pass is run by hand once the retry is due.
    wait_until(lambda: passes.run_work() and client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()[
        "internal_state"] != "retry_wait", timeout=30, interval=0.5, what="the retry to be re-admitted")
    expect(page.locator('[data-field="state"]')).to_have_text("done", timeout=30000)
    expect(page.locator("#live-status")).to_have_text("Finished.")
    assert any(u.endswith(f"/v1/models/flaky/jobs/{job_id}/events") for u in requests)
    second = page.locator('#attempts li[data-attempt="2"]')
    assert second.get_attribute("data-outcome") == "done"
    assert "503" in page.text_content('#attempts li[data-attempt="1"] .attempt-error')  # still there after success
    assert page.locator('#attempts li[data-attempt="1"] details summary').count() == 1  # admins: the detail
    page.wait_for_selector("#result-tree")
    assert page.locator("#no-deliveries").count() == 1

    # The deliveries log: each try of the job's callback with its status and error.
    _delivery_log(job_id, "ops")
    page.reload()
    page.wait_for_selector('#deliveries section.delivery[data-kind="callback"]')
    assert page.text_content('#deliveries .delivery-status') == "delivered"
    assert "after 2 tries" in page.text_content("#deliveries h3")
    assert "HTTP 503 from the receiver" in page.text_content('#deliveries tr[data-try="1"]')
    assert page.text_content('#deliveries tr[data-try="2"] td:nth-child(5)') == "200"
    # Beside it, the job's webhook POST (its own X-Webhook-Url) that failed for good.
    hook = page.locator('#deliveries section.delivery[data-kind="webhook done"]')
    expect(hook.locator(".delivery-status")).to_have_text("failed")
    assert "POST http://hooks.example/wh" in hook.text_content()
    assert "HTTP 410 from the receiver" in hook.locator('tr[data-try="1"]').text_content()
    shot(page, "job-attempts-deliveries")

    # Keyboard: the skip link comes first, focus is visible, the nav is real links.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == "Workers":
            break
    else:
        pytest.fail("the Workers link is not reachable by Tab")
    model_server.state.hold("console-w")
    held = client.post("/v1/models/echo/jobs", json={"hold": "console-w"}, headers=auth(key)).get_json()["job_id"]
    page.keyboard.press("Enter")

    # Workers: the live node, its heartbeat age, and what it runs.
    page.wait_for_url("**/console/workers")
    page.wait_for_selector("#workers-table tbody tr")
    (node,) = [w["node"] for w in client.get("/v1/workers", headers=auth(key)).get_json()["workers"]]
    row = f'#workers-table tr[data-node="{node}"]'
    assert page.text_content(f"{row} td.alive") == "alive"
    # (each test starts with an empty Redis: the node's next heartbeat is at most an interval away)
    expect(page.locator(f"{row} td.heartbeat")).to_have_text(re.compile(r"^\d+\.\d s ago$"), timeout=20000)
    # What it runs: the held job, linked, until the stub lets it go.
    page.wait_for_selector(f'{row} td.running a[href="/console/jobs/{held}"]')
    assert "echo, attempt 1" in page.text_content(f"{row} td.running")
    expect(page.locator("#live-status")).to_have_text("Live: following job events.")
    shot(page, "workers")
    model_server.state.release("console-w")
    expect(page.locator(f"{row} td.running")).to_have_text("idle")

    # Jobs: a job submitted elsewhere appears at once, over the tenant's event stream.
    page.goto(f"{api_url}/console/jobs?model=echo")
    expect(page.locator("#live-status")).to_have_text("Live: following job events.")
    fresh = client.post("/v1/models/echo/jobs", json={"a": 1}, headers=auth(key)).get_json()["job_id"]
    page.wait_for_selector(f'#jobs-table tr[data-job="{fresh}"]')
    assert page.locator(f'#jobs-table tr[data-job="{job_id}"]').count() == 0  # the flaky job: not this filter
    expect(page.locator(f'#jobs-table tr[data-job="{fresh}"] td.state')).to_have_text("done", timeout=30000)
    shot(page, "jobs-live")

    # Tenants: usage per day from the stats table, queue share, rate limit.
    assert client.patch("/v1/tenants/ops/limits", json={"rate_per_second": 50, "burst": 100},
                        headers=auth(key)).status_code == 200
    page.goto(f"{api_url}/console/tenants?tenant=ops")
    page.wait_for_selector('#usage-chart svg[aria-label^="Model calls per day for ops"]')
    today = clock_now().date().isoformat()
    bar = page.locator(f'#usage-chart g[data-day="{today}"] rect[data-model="flaky"]')
    assert bar.get_attribute("data-count") == "2"  # two calls: the 503 and the success
    assert "4 calls in 30 days" in page.text_content("#usage-chart svg text.caption")
    page.click("#usage-table summary")  # the numbers behind the bars, as a table
    assert page.locator(f'#usage-table tr[data-day="{today}"] td').all_text_contents() == [today, "2", "2", "4"]
    page.wait_for_selector('#share-table tr[data-model="echo"]')
    assert "0 / " in page.text_content('#share-table tr[data-model="echo"] td.share')
    assert page.text_content("#rate-policy") == "Each key: 50 requests/s, bursts of 100."
    assert "/ 100" in page.text_content("#rate-table tbody tr td.tokens")
    shot(page, "tenants")

    # Maintenance: the beat leader, its runs with their counts, the gates against the rows.
    token = leader.leader_acquire("beat-console:1", 30)
    periodic.run_periodic("asynch.recover", {"owner": "beat-console:1", "token": token, "sent_at": time.time()},
                          lambda: {"processed": 3})
    page.goto(f"{api_url}/console/maintenance")
    expect(page.locator("#leader-owner")).to_have_text("beat-console:1")
    assert f"fencing token {token}" in page.text_content("#leader")
    assert page.text_content('#latest-table tr[data-task="asynch.recover"] td.processed') == "3"
    assert page.locator('#runs-table tr[data-task="asynch.recover"]').count() >= 1
    assert page.text_content('#gates-table tr[data-gate="echo"] td.drift-cell') == "in step"
    page.focus("#reconcile")
    page.keyboard.press("Enter")
    expect(page.locator("#reconcile-result")).to_contain_text("Reconciled 2 model(s)")
    shot(page, "maintenance")

    # 200% zoom: every page reads in 640 CSS pixels without scrolling sideways.
    _login(zoomed, api_url, key, "/console/models")
    for path, ready in [("/console/models", "#models-table tbody tr"), (f"/console/jobs/{job_id}", "#attempts li"),
                        ("/console/jobs", "#jobs-table tbody tr"), ("/console/tenants", "#usage-chart svg"),
                        ("/console/workers", "#workers-table tbody tr"), ("/console/maintenance", "#gates-table tbody tr"),
                        ("/console/submit?model=echo", "#submit-job")]:
        zoomed.goto(api_url + path)
        zoomed.wait_for_selector(ready)
        _no_sideways_scroll(zoomed)
        shot(zoomed, "zoom200-" + (path.strip("/").split("?")[0].replace("/", "-") or "index").replace(job_id, "job"))
