"""The console tests' browser: headless Chromium (Debian's, driven by
Playwright through its executable path), a page per test that fails it on a
JavaScript error or a failed resource load, and the checks every page gets
when ``shot`` saves its screenshot: nothing contradictory on it, and no
sideways scrolling (a long value wraps or folds, it never widens the page).
Without a browser a test skips locally and fails under CI (CI=true), where
scripts/browser.sh installs it.  tests/test_console*.py import the fixtures
from here."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # handled by the browser fixture: skip locally, fail in CI
    sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

SHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS_DIR")
             or Path(__file__).resolve().parent.parent / "test-artifacts" / "console")

# Two states one page must never show at once (visible text, case as written).
CONTRADICTIONS = [("Finished", "Not finished yet"), ("No result", "Download ("), ("No attempt has ended yet", "Attempt 1 ")]


def consistent(page) -> None:
    text = page.evaluate("document.body.innerText")
    for a, b in CONTRADICTIONS:
        assert not (a in text and b in text), f"{page.url} says both {a!r} and {b!r}:\n{text}"


def no_sideways_scroll(page) -> None:
    """The page fits its window's width: a long value (a 6 KB string, an error) wraps or folds."""
    width, viewport = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= viewport + 1, f"{page.url} is {width} px wide in a {viewport} px window"


def shot(page, name: str) -> None:
    """Check the page says nothing contradictory and is no wider than its window, then save its screenshot."""
    consistent(page)
    no_sideways_scroll(page)
    path = SHOTS / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


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


_API = ("fetch", "xhr", "eventsource")


def _watch(pg, errors: list[str]) -> None:
    """Every JavaScript error, CSP violation and failed resource load (a page, script, style, image,
    font) is an error; an API answer is the page's to handle unless it is a 5xx.  A stream the page
    aborts when it navigates away is not a failure."""
    pg.set_default_timeout(30000)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
          and errors.append(m.text))
    pg.on("requestfailed", lambda r: r.resource_type not in _API and errors.append(f"{r.url}: {r.failure}"))
    pg.on("response", lambda r: (r.status >= 500 or r.status >= 400 and r.request.resource_type not in _API)
          and errors.append(f"{r.url}: HTTP {r.status}"))


def quiet(pg) -> list[str]:
    """Stricter than the page fixture, for a page with nothing wrong on it: every console error or
    warning (Chromium logs each 4xx of a fetch as "Failed to load resource") and every answer >= 400,
    API calls included.  The list fills as the page runs."""
    noise: list[str] = []
    pg.on("console", lambda m: m.type in ("error", "warning") and noise.append(f"console {m.type}: {m.text}"))
    pg.on("response", lambda r: r.status >= 400 and noise.append(f"{r.request.method} {r.url}: HTTP {r.status}"))
    return noise


def _context_page(browser, **ctx):
    ctx = browser.new_context(**ctx)
    pg = ctx.new_page()
    errors: list[str] = []
    _watch(pg, errors)
    return ctx, pg, errors


@pytest.fixture
def zoomed(browser):
    """A 1280x800 window at 200% zoom: 640x400 CSS pixels, two device pixels each."""
    ctx, pg, errors = _context_page(browser, viewport={"width": 640, "height": 400}, device_scale_factor=2)
    yield pg
    ctx.close()
    assert errors == [], f"JavaScript errors or failed loads: {errors}"


@pytest.fixture
def page(browser):
    ctx, pg, errors = _context_page(browser)
    yield pg
    ctx.close()
    assert errors == [], f"JavaScript errors or failed loads: {errors}"


def login(page, api_url: str, key: str, next_path: str) -> None:
    page.goto(f"{api_url}/console/login?next={next_path}")
    page.fill("#api-key", key)
    page.click("#login-form button")
    page.wait_for_url(lambda url: "/console/login" not in url and url.endswith(next_path))
