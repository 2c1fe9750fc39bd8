"""The web console end to end in headless Chromium (Debian's, driven by
Playwright through its executable path): log in with a key, submit from the
form the model's definition renders, watch the job reach done on a real
worker process, open the result; then every operator page (a job that
failed once and its attempts and deliveries, the tenants, the workers,
maintenance), followed live over the event streams, by keyboard, and at
200% zoom; then every page with a Latin and a Chinese data set.  Every page
fails the test on a JavaScript error, a failed resource load, two
contradictory states on one page ("Finished" and "Not finished yet") or
a page wider than its window; a screenshot of every page is saved under
test-artifacts/console/ (CONSOLE_SCREENSHOTS_DIR elsewhere), for a person to
look at.  The browser and those checks are tests/console_browser.py's; real
payloads, user keys and the wording are tests/test_console_payloads.py's."""
from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from console_browser import browser, login as _login, page, shot, zoomed  # noqa: F401 (fixtures)
from helpers import auth, make_key, wait_until
from sqlalchemy import func, insert, select

from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.redis import leader
from app.infra.tables import deliveries, delivery_attempts, tasks
from app.maintenance import passes, periodic

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails under CI)
    expect = None


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
    # The form is the declared shape (ModelInput in the document): every field a caller sends, none left out.
    shape = client.get("/openapi.json").get_json()["components"]["schemas"]["ModelInput"]["properties"]
    fields = page.locator("#model-fields .field").evaluate_all("els => els.map(e => e.dataset.pointer.slice(1))")
    assert fields == [k for k, v in shape.items() if not v.get("readOnly")]
    assert {"tenant_queue_limit", "max_completed", "head_msg"} <= set(fields)
    assert page.get_attribute("#m-head_msg", "type") == "password"  # writeOnly: a secret
    page.fill("#m-queue_limit", "-3")
    page.fill("#m-base_url", "ftp://nowhere")
    page.click("#model-form button[type=submit]")
    page.wait_for_selector('[data-pointer="/queue_limit"].invalid')
    assert "must be an integer from 0 to" in page.text_content('[data-pointer="/queue_limit"] .error')
    assert "http(s) URL" in page.text_content('[data-pointer="/base_url"] .error')
    assert "invalid model configuration" in page.text_content("#flash")

    page.fill("#m-queue_limit", "7")
    page.fill("#m-base_url", "http://127.0.0.1:9")
    page.fill("#m-tenant_queue_limit", "3")
    page.fill("#m-max_completed", "50")
    page.click("#model-form button[type=submit]")
    page.wait_for_selector("#flash.ok")
    shot(page, "model-edit")
    got = client.get("/v1/models/echo", headers={"Authorization": f"Bearer {key}"}).get_json()
    assert (got["queue_limit"], got["tenant_queue_limit"], got["max_completed"]) == (7, 3, 50)
    page.reload()  # a cleared nullable field goes back to null (the share rule)
    expect(page.locator("#m-tenant_queue_limit")).to_have_value("3")
    page.fill("#m-tenant_queue_limit", "")
    page.click("#model-form button[type=submit]")
    page.wait_for_selector("#flash.ok")
    assert client.get("/v1/models/echo", headers={"Authorization": f"Bearer {key}"}).get_json()["tenant_queue_limit"] is None


def _delivery_log(job_id: str, tenant: str) -> None:
    """A callback that failed once, then went through, as the delivery worker records it."""
    now = clock_now()
    with transaction() as conn:
        cid = conn.execute(insert(deliveries).values(
            kind="callback", event="done", job_id=job_id, tenant_id=tenant, url="http://hooks.example/done?task_id=" + job_id, status="delivered",
            attempts=2, next_attempt_at=now, delivered_at=now, created_at=now, updated_at=now)
            .returning(deliveries.c.id)).scalar_one()
        conn.execute(insert(delivery_attempts), [
            {"delivery_id": cid, "attempt": 1, "started_at": now - timedelta(seconds=5), "duration_ms": 31,
             "address": "203.0.113.7", "http_status": 503, "error": "HTTP 503 from the receiver"},
            {"delivery_id": cid, "attempt": 2, "started_at": now, "duration_ms": 12, "address": "203.0.113.7",
             "http_status": 200, "error": None}])
        wid = conn.execute(insert(deliveries).values(
            kind="webhook", job_id=job_id, tenant_id=tenant, subscription_id=0, event="done", url="http://hooks.example/wh",
            status="failed", attempts=1, next_attempt_at=now, last_error="HTTP 410 from the receiver",
            created_at=now, updated_at=now).returning(deliveries.c.id)).scalar_one()
        conn.execute(insert(delivery_attempts).values(delivery_id=wid, attempt=1, started_at=now, duration_ms=9,
                                                     address="203.0.113.8", http_status=410,
                                                     error="HTTP 410 from the receiver"))


@pytest.mark.e2e
def test_operator_pages_live_by_keyboard_and_at_200_percent(page, zoomed, api_url, workers, make_model, client,
                                                            model_server):
    make_model("flaky", retry_times=1, retry_queue_max_seconds=5)
    make_model("echo")
    key = make_key("ops", admin=True)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))

    # A job that fails once against the stub model (HTTP 500), then succeeds.
    sent = client.post("/v1/models/flaky/jobs", json={"tag": "console-once", "fail_first": 1, "n": [1, {"deep": True}]},
                       headers=auth(key))
    job_id = sent.get_json()["job_id"]
    _login(page, api_url, key, f"/console/jobs/{job_id}")
    wait_until(lambda: client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()["internal_state"] == "retry_wait",
               what="the first attempt to fail")
    # The page shows the failed attempt as it happens: over the job's event stream, not a reload.
    page.wait_for_selector('#attempts li[data-attempt="1"] .attempt-error')
    assert "500" in page.text_content('#attempts li[data-attempt="1"] .attempt-error')
    assert page.text_content('#attempts li[data-attempt="1"] .state') == "failed, retried"
    # No beat runs in the test: the retry pass is run by hand once the retry is due.
    wait_until(lambda: passes.run_work() and client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()[
        "internal_state"] != "retry_wait", timeout=30, interval=0.5, what="the retry to be re-admitted")
    expect(page.locator('[data-field="state"]')).to_have_text("done", timeout=30000)
    expect(page.locator("#live-status")).to_have_text("Finished: done.")
    assert any(u.endswith(f"/v1/models/flaky/jobs/{job_id}/events") for u in requests)
    second = page.locator('#attempts li[data-attempt="2"]')
    assert second.get_attribute("data-outcome") == "done"
    assert "500" in page.text_content('#attempts li[data-attempt="1"] .attempt-error')  # still there after success
    assert page.locator('#attempts li[data-attempt="1"] details summary').count() == 1  # admins: the detail
    page.wait_for_selector("#result-tree")
    page.wait_for_selector("#no-deliveries")  # read once the job has ended

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
    assert page.text_content("#workers-summary").startswith("1 node, 1 alive;")
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
    assert client.patch("/v1/tenants/ops/limits", json={"rate_per_second": 50, "burst": 100, "weight": 3,
                                                        "min_concurrency": {"echo": 1}, "burst_concurrency": {"echo": 2}},
                        headers=auth(key)).status_code == 200
    page.goto(f"{api_url}/console/tenants?tenant=ops")
    page.wait_for_selector('#usage-chart svg[aria-label^="Model calls per day for ops"]')
    today = clock_now().date().isoformat()
    bar = page.locator(f'#usage-chart g[data-day="{today}"] rect[data-model="flaky"]')
    assert bar.get_attribute("data-count") == "2"  # two calls: the 500 and the success
    assert "4 calls in 30 days" in page.text_content("#usage-chart svg text.caption")
    page.click("#usage-table summary")  # the numbers behind the bars, as a table
    assert page.locator(f'#usage-table tr[data-day="{today}"] td').all_text_contents() == [today, "2", "2", "4"]
    page.wait_for_selector('#share-table tr[data-model="echo"]')
    assert "0 / " in page.text_content('#share-table tr[data-model="echo"] td.share')
    assert page.text_content("#rate-policy") == "Each key: 50 requests/s, bursts of 100."
    assert page.text_content("#dispatch-share") == ("Weight 3: its share of model time when tenants compete. "
                                                    "echo: 1 job guaranteed, at most 2.")
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
    expect(page.locator("#reconcile-result")).to_contain_text("Reconciled 2 models: ")
    shot(page, "maintenance")

    # 200% zoom: every page reads in 640 CSS pixels without scrolling sideways.
    _login(zoomed, api_url, key, "/console/models")
    for path, ready in [("/console/models", "#models-table tbody tr"), (f"/console/jobs/{job_id}", "#attempts li"),
                        ("/console/jobs", "#jobs-table tbody tr"), ("/console/tenants", "#usage-chart svg"),
                        ("/console/workers", "#workers-table tbody tr"), ("/console/maintenance", "#gates-table tbody tr"),
                        ("/console/submit?model=echo", "#submit-job")]:
        zoomed.goto(api_url + path)
        zoomed.wait_for_selector(ready)
        shot(zoomed, "zoom200-" + (path.strip("/").split("?")[0].replace("/", "-") or "index").replace(job_id, "job"))


# --- every page in a Latin and a Chinese data set ------------------------------------------------

DATASETS = {
    "latin": {"remark": "Text generation service", "label": "Prompt", "text": "hello world"},
    "chinese": {"remark": "模型服务：中文文本生成", "label": "提示词", "text": "你好，世界：模型服务"},
}


def _fonts(page, selector: str) -> set[str]:
    """The platform fonts Chromium drew the element's text with (DevTools' CSS.getPlatformFontsForNode)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return {f["familyName"] for f in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]}


def _glyphs_drawn(page, selector: str, chinese: bool) -> None:
    fonts = _fonts(page, selector)
    if chinese:  # no box: a face with CJK coverage drew it (scripts/browser.sh installs fonts-noto-cjk)
        assert any("CJK" in f or f.endswith(" SC") for f in fonts), f"{selector}: drawn with {fonts}"


@pytest.mark.e2e
@pytest.mark.parametrize("lang", list(DATASETS))
def test_every_page_reads_right_in_latin_and_chinese(page, api_url, workers, make_model, client, model_server, lang):
    data, zh = DATASETS[lang], lang == "chinese"
    make_model("echo", timeout_seconds=60, remark=data["remark"], form=[{"field": "prompt", "label": data["label"], "required": True}])
    make_model("bad", retry_times=0, remark=data["remark"])
    key = make_key("ops", admin=True)
    make_key("acme")  # a tenant that sorts before the caller's own
    done = client.post("/v1/models/echo/jobs", json={"prompt": data["text"]}, headers=auth(key)).get_json()["job_id"]
    failed = client.post("/v1/models/bad/jobs", json={"status": 500, "note": data["text"]},
                         headers=auth(key)).get_json()["job_id"]
    for j in (done, failed):
        wait_until(lambda j=j: client.get(f"/v1/jobs/{j}", headers=auth(key)).get_json()["state"] in ("done", "failed"),
                   what="the job to end")
    model_server.state.hold(f"console-{lang}")
    held = client.post("/v1/models/echo/jobs", json={"prompt": data["text"], "hold": f"console-{lang}"},
                       headers=auth(key)).get_json()["job_id"]
    try:
        page.goto(f"{api_url}/console/login")
        assert page.evaluate("getComputedStyle(document.querySelector('form.login')).borderTopStyle") == "solid"
        shot(page, f"{lang}/login")
        _login(page, api_url, key, "/console/models")
        expect(page.locator("#whoami")).to_have_text("admin · ops")

        # Models: the chart has values on both axes and shows a bucket's values under the pointer.
        chart = page.locator('#charts svg[aria-label="echo throughput and P90"]')
        chart.wait_for()
        assert len(chart.locator("text.axis").all_text_contents()) >= 9 and "1" in chart.locator("text.axis").all_text_contents()
        chart.locator("g.bucket").last.hover()
        expect(chart.locator("text.readout")).to_contain_text("1 done, P90 ")
        shot(page, f"{lang}/models")

        page.goto(f"{api_url}/console/models/edit?name=echo")
        expect(page.locator("#m-remark")).to_have_value(data["remark"])
        shot(page, f"{lang}/model-edit")

        page.goto(f"{api_url}/console/submit?model=echo")
        expect(page.locator("#model-remark")).to_have_text(data["remark"])
        assert page.text_content("#job-fields label") == data["label"] + " *"
        _glyphs_drawn(page, "#model-remark", zh)
        shot(page, f"{lang}/submit")

        # Jobs: each row's tenant; a running job's elapsed time runs on.
        page.goto(f"{api_url}/console/jobs")
        row = page.locator(f'#jobs-table tr[data-job="{held}"]')
        expect(row.locator("td.state")).to_have_text("running")
        assert page.locator("#jobs-table td.tenant").all_text_contents() == ["ops"] * 3
        first = float(row.locator("td.elapsed").text_content().split()[0])
        wait_until(lambda: float(row.locator("td.elapsed").text_content().split()[0]) >= first + 1, timeout=10,
                   interval=0.2, what="the running row's elapsed time to move on")
        shot(page, f"{lang}/jobs")

        page.goto(f"{api_url}/console/jobs/{held}")
        expect(page.locator("#not-yet")).to_have_text("Not finished yet.")
        expect(page.locator('#attempts li[data-outcome="running"]')).to_have_count(1)
        shot(page, f"{lang}/job-running")

        page.goto(f"{api_url}/console/jobs/{done}")
        page.wait_for_selector("#result-tree")
        expect(page.locator("#live-status")).to_have_text("Finished: done.")
        assert data["text"] in page.text_content("#result-tree") and data["text"] in page.text_content('[data-field="payload"]')
        _glyphs_drawn(page, '[data-field="payload"]', zh)
        shot(page, f"{lang}/job-done")

        # A failed job: finished, and the result box says there is none and why; its attempt in the timeline.
        page.goto(f"{api_url}/console/jobs/{failed}")
        expect(page.locator("#live-status")).to_have_text("Finished: failed.")
        shot(page, f"{lang}/job-failed")  # (never also "Not finished yet")
        expect(page.locator("#no-result")).to_contain_text("No result: the job ended failed (model_http_error")
        events = page.locator("#timeline li").evaluate_all("els => els.map(e => e.dataset.event)")
        assert events == ["created", "started", "finished"]

        # Tenants: opens on the caller's own tenant, not the first one; the chart reads out a day.
        page.goto(f"{api_url}/console/tenants")
        page.wait_for_selector("#usage-chart svg")
        assert page.input_value("#tenant-select") == "ops"
        page.locator(f'#usage-chart g[data-day="{clock_now().date().isoformat()}"]').hover()
        expect(page.locator("#usage-chart text.readout")).to_contain_text(re.compile(r": \d+ calls? — "))
        shot(page, f"{lang}/tenants")

        page.goto(f"{api_url}/console/workers")
        page.wait_for_selector(f'#workers-table td.running a[href="/console/jobs/{held}"]')
        shot(page, f"{lang}/workers")
        page.goto(f"{api_url}/console/maintenance")
        page.wait_for_selector('#gates-table tr[data-gate="echo"]')
        shot(page, f"{lang}/maintenance")
    finally:
        model_server.state.release(f"console-{lang}")


@pytest.mark.e2e
def test_the_job_page_shows_a_streaming_models_output_live(page, api_url, workers, make_model, model_server):
    """A streaming model's job: the job page's Output grows while the upstream holds the rest of its stream,
    and is complete (the chunks' text, not their SSE framing) when the job is done."""
    make_model("chat", streaming=True)
    key = make_key("ops", admin=True)
    job = __import__("requests").post(
        f"{api_url}/v1/models/chat/jobs", headers=auth(key), timeout=10,
        json={"stream": True, "chunks": 5, "chunk_ms": 5, "stream_hold": "page", "hold_at": 3,
              "messages": [{"role": "user", "content": "alpha beta gamma delta epsilon"}]}).json()["job_id"]
    try:
        _login(page, api_url, key, f"/console/jobs/{job}")
        expect(page.locator("#output")).to_have_text("alpha beta gamma ", timeout=20000)
        assert page.text_content('[data-field="state"]') == "running"  # live: the job has not ended
        model_server.state.release("page")
        expect(page.locator("#output-state")).to_have_text("Complete.", timeout=20000)
    finally:
        model_server.state.release("page")
    assert page.text_content("#output") == "alpha beta gamma delta epsilon "
    assert "data:" not in page.text_content("#output")
    shot(page, "job-output")


def test_the_job_page_says_what_holds_a_pending_job(page, api_url, workers, make_model, model_server):
    """Issue 34 item 2: a job behind its tenant's one call shows why it waits, and stops showing it once it runs."""
    make_model("held1", max_concurrency=1)
    key = make_key("ops", admin=True)
    first = requests_post(api_url, key, "held1", {"hold": "console-wait"})
    wait_until(lambda: model_server.state.in_flight == 1, timeout=30, what="the first call in flight")
    second = requests_post(api_url, key, "held1", {"n": 2})
    _login(page, api_url, key, f"/console/jobs/{second}")
    expect(page.locator('[data-field="waiting on"]')).to_contain_text("max_concurrency", timeout=15000)
    expect(page.locator('[data-field="waiting on"]')).to_contain_text("holds 1 of 1 calls")
    shot(page, "job-waiting")
    model_server.state.release("console-wait")
    expect(page.locator("#live-status")).to_have_text("Finished: done.", timeout=30000)
    expect(page.locator('[data-field="waiting on"]')).to_have_count(0)
    assert first != second


def requests_post(api_url: str, key: str, model: str, payload: dict) -> str:
    import requests

    resp = requests.post(f"{api_url}/v1/models/{model}/jobs", json=payload, headers=auth(key), timeout=10)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]
