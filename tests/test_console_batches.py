"""The console's batches page in headless Chromium (tests/console_browser.py: every page fails on a JavaScript
error, a failed load, contradictory states or a page wider than its window): a tenant's batches with their
status, progress and counts, following a batch to completed, and downloading its output and error files
through the API with the tab's key."""
from __future__ import annotations

import io
import json

import openai
import pytest
from console_browser import browser, login, page, shot  # noqa: F401 (fixtures)
from helpers import make_key, wait_until

from app.batches import progress

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails under CI)
    expect = None

pytestmark = pytest.mark.e2e


def test_the_batches_page_shows_progress_counts_and_downloads(page, api_url, workers, make_model, tmp_path):
    make_model("echo")
    key = make_key("tenant-a")
    oa = openai.OpenAI(base_url=f"{api_url}/v1", api_key=key, max_retries=0)
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "echo", "prompt": f"p{i}", **({"status": 500} if i == 3 else {})}} for i in range(4)]
    src = "".join(json.dumps(x) + "\n" for x in lines).encode()
    fid = oa.files.create(file=("in.jsonl", io.BytesIO(src)), purpose="batch").id
    b = oa.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="2h",
                          metadata={"team": "docs"})
    bad = oa.batches.create(input_file_id=oa.files.create(file=("bad.jsonl", b"oops\n"), purpose="batch").id,
                            endpoint="/v1/completions", completion_window="24h")

    login(page, api_url, key, "/console/batches")
    row = page.locator(f'tr[data-batch="{b.id}"]')
    expect(row).to_be_visible()
    expect(page.locator(f'tr[data-batch="{bad.id}"] td.status')).to_contain_text("failed")
    expect(page.locator(f'tr[data-batch="{bad.id}"] td.status')).to_contain_text("line 1: invalid_json_line")
    assert "team=docs" in row.text_content()

    def finished():
        progress.advance_all()
        return oa.batches.retrieve(b.id).status == "completed"
    wait_until(finished, timeout=60, interval=0.2, what="batch completed")
    expect(row.locator("td.status")).to_have_text("completed", timeout=10000)  # the page refreshes by itself
    expect(row.locator("td.progress")).to_contain_text("4 / 4 (100%)")
    expect(row.locator("td.completed")).to_have_text("3")
    expect(row.locator("td.failed")).to_have_text("1")
    shot(page, "batches")
    with page.expect_download() as dl:
        row.locator("button.output").click()
    out = tmp_path / "out.jsonl"
    dl.value.save_as(out)
    assert sorted(json.loads(x)["custom_id"] for x in out.read_text().splitlines()) == ["c0", "c1", "c2"]
    with page.expect_download() as dl:
        row.locator("button.errors").click()
    dl.value.save_as(tmp_path / "err.jsonl")
    assert json.loads((tmp_path / "err.jsonl").read_text())["custom_id"] == "c3"

    # Another tenant's console shows none of them.
    page.evaluate("sessionStorage.clear()")
    login(page, api_url, make_key("tenant-b"), "/console/batches")
    page.wait_for_selector("#live-status:has-text('Live')")
    expect(page.locator("#batches-table tbody tr")).to_have_count(0)
