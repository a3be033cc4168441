"""The app in a real browser: Debian's chromium, headless, driven by Playwright.

Runs speculative decoding with the target drafting for itself, prompt lookup
and Jacobi (coloured tokens, histogram, inspector, Jacobi heatmap, slider), then
the default comparison (greedy, speculative with the bundled prophet head,
prompt lookup, lookahead) on the bundled model with 64 new tokens: every
column's coloured tokens, the charts, the lookahead window view; moves and plays
the replay slider, exports the trace and re-imports it. Saves the README's screenshots. Timings are printed (and kept in
``docs/screenshots/timings.json``), never asserted.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
pytestmark = pytest.mark.browser
SLIDER = "input[type=number][aria-label='number input for Replay step (target forward passes)']"


@pytest.fixture(scope="module")
def page(app_url):
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("Debian chromium is required for the browser tests (make test installs it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg.goto(app_url)
        pg.wait_for_selector("text=Decoding Playground", timeout=60_000)
        yield pg
        browser.close()


def _step_text(page) -> str:
    return page.locator("#columns .dp-col .dp-step").first.inner_text()


def _set_step(page, value: int) -> None:
    slider = page.locator(SLIDER)
    if slider.count() == 0:
        slider = page.get_by_label("Replay step (target forward passes)").first
    slider.fill(str(value))
    slider.press("Enter")


def _run_and_wait(page, columns: int) -> float:
    t0 = time.perf_counter()
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function(f"document.querySelectorAll('#columns .dp-col').length >= {columns}", timeout=300_000)
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 8", timeout=60_000)
    page.wait_for_selector("text=/Position \\d+ \\(step/", timeout=60_000)     # the inspector is drawn
    return round(time.perf_counter() - t0, 2)


def _check_drafting_views(page) -> None:
    content = page.content()
    for title in ("Accepted draft tokens per target forward", "Why (no) speedup", "Forward passes along wall-clock",
                  "Tokens per second"):
        assert title in content, title
    assert page.locator("text=/Position \\d+ \\(step/").count() >= 1          # p_target vs q_draft inspector


def test_self_assistant_prompt_lookup_and_jacobi(page):
    # no assistant: speculative lets the target draft for itself (every draft accepted); plus prompt lookup
    page.get_by_label("Assistant (draft) model").fill("none")
    page.get_by_label("Assistant (draft) model").press("Enter")
    page.get_by_label("max_new_tokens (1–512)").fill("24")
    page.get_by_label("Lookahead", exact=True).uncheck()
    page.get_by_label("Jacobi", exact=True).check()
    _run_and_wait(page, 4)
    status = page.locator("text=/Ran \\d strategies/").first.inner_text()
    assert "the target drafts for itself" in status
    cols = page.locator("#columns .dp-col")
    titles = [cols.nth(i).locator(".dp-title").inner_text() for i in range(cols.count())]
    assert titles[1:] == ["Speculative", "Prompt lookup", "Jacobi"]
    for i in range(4):
        assert cols.nth(i).locator(".dp-tok").count() > 0 and "identical to greedy" in cols.nth(i).inner_text()
    assert cols.nth(1).locator(".dp-tok[data-source='accepted']").count() > 0
    assert cols.nth(3).locator(".dp-tok[data-source='jacobi']").count() > 0
    _check_drafting_views(page)
    assert "Jacobi: guesses per iteration" in page.content()
    _set_step(page, 2)
    page.wait_for_function("document.querySelector('#columns .dp-col .dp-step').innerText.startsWith('step 2 /')",
                           timeout=30_000)
    assert all(cols.nth(i).locator(".dp-step").inner_text().startswith("step 2 /") for i in range(4))
    # back to the default comparison for the next test
    page.reload()
    page.wait_for_selector("text=Decoding Playground", timeout=60_000)


def test_default_comparison_replay_export_and_import(page, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    timings = {}
    assert page.get_by_label("max_new_tokens (1–512)").input_value() == "64"
    for name in ("Greedy", "Speculative", "Prompt lookup", "Lookahead"):   # the default comparison
        assert page.get_by_label(name, exact=True).is_checked(), name
    assert not page.get_by_label("Jacobi", exact=True).is_checked()
    # a newcomer's run: the default comparison, 64 new tokens, model already cached
    timings["default_comparison_64_tokens_to_fully_drawn_s"] = _run_and_wait(page, 4)
    status = page.locator("text=/Ran \\d strategies/").first.inner_text()
    assert "prophet head" in status

    cols = page.locator("#columns .dp-col")
    titles = [cols.nth(i).locator(".dp-title").inner_text() for i in range(cols.count())]
    assert titles[0].startswith("Greedy") and titles[1:] == ["Speculative", "Prompt lookup", "Lookahead"]
    for i in range(4):
        assert cols.nth(i).locator(".dp-tok").count() > 0
        assert "identical to greedy" in cols.nth(i).inner_text(), titles[i]
    assert page.locator("#columns .dp-legend .dp-chip").count() >= 3
    # tokens coloured by how they were produced
    assert cols.nth(1).locator(".dp-tok[data-source='accepted']").count() > 0      # prophet drafts
    _check_drafting_views(page)
    content = page.content()
    for title in ("Lookahead: tokens committed per target forward", "Leviathan-predicted vs measured speedup"):
        assert title in content, title
    window = page.locator("#lookahead-window")
    assert window.locator("table.dp-window").count() == 1 and window.locator("table.dp-cands").count() == 1
    full_columns = page.locator("#columns").inner_text()
    full = cols.nth(0).locator(".dp-tok").count()
    page.screenshot(path=str(SHOTS / "app-overview.png"), full_page=True)

    # move the replay slider back to step 3: every column and the lookahead view redraw at that step
    t1 = time.perf_counter()
    _set_step(page, 3)
    page.wait_for_function("document.querySelector('#columns .dp-col .dp-step').innerText.startsWith('step 3 /')",
                           timeout=30_000)
    timings["slider_redraw_ms"] = round((time.perf_counter() - t1) * 1000)
    assert cols.nth(0).locator(".dp-tok").count() == 3 < full
    assert all(cols.nth(i).locator(".dp-step").inner_text().startswith("step 3 /") for i in range(4))
    assert "step 3" in window.inner_text() or "step 2" in window.inner_text()
    page.locator("#columns").screenshot(path=str(SHOTS / "replay-step-3.png"))
    window.screenshot(path=str(SHOTS / "lookahead-window.png"))

    # the play button advances the replay by itself
    page.get_by_role("button", name="▶ Play").click()
    page.wait_for_function("parseInt(document.querySelector('#columns .dp-col .dp-step').innerText.slice(5)) >= 6",
                           timeout=30_000)

    # export the trace, re-import it: the same replay, with no model involved
    _set_step(page, 10_000)
    with page.expect_download() as info:
        page.locator("#trace-download a").first.click()
    exported = tmp_path / "trace.json"
    info.value.save_as(exported)
    doc = json.loads(exported.read_text(encoding="utf-8"))
    assert [r["strategy"] for r in doc["results"]] == ["greedy", "speculative", "prompt_lookup", "lookahead"]
    page.locator("#trace-upload input[type=file]").set_input_files(str(exported))
    page.wait_for_selector("text=Imported a trace with 4 strategies", timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#columns .dp-col').length >= 4", timeout=30_000)
    assert page.locator("#columns").inner_text() == full_columns
    (SHOTS / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"\n[browser timing] {timings}")
