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
    t0 = time.perf_counter()
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("document.querySelectorAll('#columns .dp-col').length >= 3", timeout=180_000)
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    drawn = time.perf_counter() - t0
    cols = page.locator("#columns .dp-col")
    assert cols.count() == 3
    titles = [cols.nth(i).locator(".dp-title").inner_text() for i in range(3)]
    assert titles[0].startswith("Greedy") and titles[1] == "Sampling" and titles[2] == "Beam search"
    for i in range(3):
        assert cols.nth(i).locator(".dp-tok").count() > 0
    assert page.locator("#columns .dp-legend .dp-chip").count() >= 2
    assert "identical to greedy" in cols.nth(0).inner_text()
    assert page.locator(".js-plotly-plot").count() >= 2
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
    page.locator("#columns").screenshot(path=str(SHOTS / "replay-step-3.png"))
    print(f"\n[browser timing] run of greedy+sample+beam (24 tokens) to fully drawn: {drawn:.2f} s; "
          f"slider redraw: {redraw * 1000:.0f} ms")
