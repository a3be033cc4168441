"""The app in a real browser: Debian's chromium, headless, driven by Playwright.

Loads the app, runs greedy / sample / beam on the bundled model, checks the
side-by-side columns, coloured tokens and charts, moves the replay slider, and
saves screenshots for the README. Timings are printed, never asserted.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(app_url):
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("Debian chromium is required for the browser tests (make test installs it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(app_url)
        pg.wait_for_selector("text=Decoding Playground", timeout=60_000)
        yield pg
        browser.close()


def test_run_compare_and_replay(page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.get_by_label("max_new_tokens (1–512)").fill("24")
    page.get_by_label("Speculative").check()   # no assistant chosen: the target drafts for itself
    t0 = time.perf_counter()
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#columns .dp-col').length >= 5", timeout=180_000)
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    drawn = time.perf_counter() - t0
    cols = page.locator("#columns .dp-col")
    assert cols.count() == 5
    titles = [cols.nth(i).locator(".dp-title").inner_text() for i in range(5)]
    assert titles[0].startswith("Greedy") and titles[1:] == ["Sampling", "Beam search", "Prompt lookup",
                                                             "Speculative"]
    for i in range(5):
        assert cols.nth(i).locator(".dp-tok").count() > 0
    assert page.locator("#columns .dp-legend .dp-chip").count() >= 3
    for i in (0, 3, 4):
        assert "identical to greedy" in cols.nth(i).inner_text()
    # speculative tokens are coloured by fate (self-assistant: every draft accepted)
    assert cols.nth(4).locator(".dp-tok[data-source='accepted']").count() > 0
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000)
    assert "Accepted draft tokens per target forward" in page.content()
    page.get_by_label("Output position").fill("5")
    page.get_by_label("Output position").press("Enter")
    page.wait_for_function("document.body.innerText.includes('Position 5 (step')", timeout=30_000)
    page.screenshot(path=str(SHOTS / "app-overview.png"), full_page=True)
    full = cols.nth(0).locator(".dp-tok").count()

    # move the replay slider back to step 3: every column redraws at that step
    slider = page.locator("input[type=number][aria-label='number input for Replay step (target forward passes)']")
    if slider.count() == 0:
        slider = page.get_by_label("Replay step (target forward passes)").first
    t1 = time.perf_counter()
    slider.fill("3")
    slider.press("Enter")
    page.wait_for_function("document.querySelector('#columns .dp-col .dp-step').innerText.startsWith('step 3 /')",
                           timeout=30_000)
    redraw = time.perf_counter() - t1
    assert cols.nth(0).locator(".dp-tok").count() == 3 < full
    assert cols.nth(4).locator(".dp-step").inner_text().startswith("step 3 /")
    page.locator("#columns").screenshot(path=str(SHOTS / "replay-step-3.png"))
    print(f"\n[browser timing] run of greedy+sample+beam+speculative+prompt lookup (24 tokens) to fully drawn: {drawn:.2f} s; "
          f"slider redraw: {redraw * 1000:.0f} ms")
