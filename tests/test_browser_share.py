"""Share links in a real browser (issue 40, item 1): Debian's chromium, headless, driven by Playwright.

A race run on the page shows a Share link; opened in a fresh browser (a new session), the link shows the same
tokens in every column at once, labelled as a recording (when, where), with nothing computed: the compute
line's count of started computations stays where it was; its export button then makes the race's GIF. An
unknown or malformed id gets a message and the normal page, which still runs.

What would break it: a link that recomputes the race (the count moves), a link read from the session instead
of the recording (the new session sees nothing), a status that does not say it is a recording, an id shown
unescaped, or a bad id that breaks the page.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import chromium_page

SHOTS = Path(__file__).resolve().parent.parent / os.environ.get("SCREENSHOTS_DIR", "build/screenshots")
pytestmark = pytest.mark.browser
TOKENS = """() => [...document.querySelectorAll('#columns .dp-col')].map(c =>
    [...c.querySelectorAll('.dp-tok')].map(t => t.textContent))"""


def _run_small(page, prompt: str, n: int, strategies: tuple) -> None:
    page.get_by_label("Prompt", exact=True).fill(prompt)
    page.get_by_label("max_new_tokens (1–512)").fill(str(n))
    for name in ("Greedy", "Prophet head", "Prompt lookup", "Lookahead"):
        box = page.get_by_label(name, exact=True)
        if box.is_checked() != (name in strategies):
            box.click()
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function(f"/Ran {len(strategies)} strategies/.test(document.querySelector('#status').innerText)",
                           timeout=300_000)


@pytest.mark.alone          # the shared race must show within 3 s: no other worker mid-test
def test_a_share_link_opens_the_race_in_a_new_session_computing_nothing(app_url, app_state):
    with chromium_page(app_url) as page:
        _run_small(page, "Share test: name three fruits.", 12, ("Greedy", "Prompt lookup"))
        page.wait_for_selector("#share-link", timeout=30_000)
        href = page.locator("#share-link").get_attribute("href")
        ran = page.evaluate(TOKENS)
    assert href.startswith("?race=") and len(href) == len("?race=") + 16
    assert len(ran) == 2 and all(ran), ran
    started = app_state.line.counts()["started"]
    with chromium_page(app_url + href) as shared:                 # a new browser: a new session
        shared.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 2 && "
                                 "/Shared race/.test(document.querySelector('#status').innerText)", timeout=3_000)
        assert shared.evaluate(TOKENS) == ran                     # the same tokens in every column
        status = shared.locator("#status").inner_text()
        assert "computed at" in status and " UTC on " in status and "nothing is computed now" in status
        assert shared.locator("#share-link").get_attribute("href") == href
        assert shared.get_by_role("button", name="▶ Play in real time").is_visible()   # its replay controls
        assert app_state.line.counts()["started"] == started      # no run, no forward pass
        SHOTS.mkdir(parents=True, exist_ok=True)                 # the README's "Share a race" picture
        shared.locator("#status").scroll_into_view_if_needed()
        shared.screenshot(path=str(SHOTS / "shared-race.png"), full_page=False)
        shared.locator("#export-btn").click()                    # the page's download: this race as a GIF
        shared.wait_for_selector("#export-file a[href*='.gif']", timeout=120_000)
        assert app_state.line.counts()["started"] == started + 1  # drawn in the compute line


@pytest.mark.parametrize("race_id,message", [
    ("AAAAAAAAAAAAAAAA", "no race with this id is held here"),
    ("%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E", "race_id must be 16 characters"),
])
def test_an_unknown_or_malformed_id_gets_a_message_and_the_page_still_runs(app_url, race_id, message):
    with chromium_page(f"{app_url}?race={race_id}") as page:
        page.wait_for_function("/does not open a race/.test(document.querySelector('#status').innerText)",
                               timeout=10_000)
        assert message in page.locator("#status").inner_text()
        assert page.locator("#status img").count() == 0           # the id is never drawn as markup
        # a prompt of its own per case: the same request again would be joined to the first case's recording,
        # whose replay redraws the columns from the first step while this test reads them
        _run_small(page, f"Share test: say hello ({len(race_id)}).", 3, ("Greedy",))
        # the status and the columns are separate outputs: wait for the tokens rather than read them at once
        page.wait_for_function("document.querySelectorAll('#columns .dp-col .dp-tok').length > 0", timeout=30_000)
