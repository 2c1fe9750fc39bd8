"""The web console end to end in headless Chromium (Debian's, driven by
Playwright through its executable path): log in with a key, submit from the
form the model's definition renders, watch the job reach done on a real
worker process, open the result.  Assertions are on the page; no
screenshots are kept.  Without a browser the test skips locally and fails
under CI (CI=true), where scripts/browser.sh installs it."""
from __future__ import annotations

import os

import pytest
from conftest import make_key
from sqlalchemy import func, select

from app.infra.db import transaction
from app.infra.tables import tasks

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # handled by the browser fixture: skip locally, fail in CI
    expect = sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


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
    page.wait_for_selector("#result-json")
    result = page.text_content("#result-json")
    assert '"prompt": "hello"' in result and '"n": 3' in result and '"mode": "slow"' in result
    assert '"flag": true' in result
    assert page.get_attribute("#download", "download") == f"{job_id}.json"
    events = page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.event)")
    assert events[0] == "created" and "started" in events and events[-1] == "finished"

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
    assert client.get("/v1/models/echo", headers={"Authorization": f"Bearer {key}"}).get_json()["queue_limit"] == 7
