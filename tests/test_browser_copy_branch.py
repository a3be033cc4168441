"""The prophet's copy-branch parameters in the real app in headless chromium (as tests/test_browser.py).

A visitor finds ``lookup_source`` and ``lookup_tokens`` among the prophet's parameters with their defaults,
gets a message naming the parameter and its range for a copy longer than 32 tokens (and the app keeps
serving), then races the prophet with the prompt-lookup branch against greedy: identical tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import chromium_page

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / os.environ.get("SCREENSHOTS_DIR", "build/screenshots")


def _tokens(page, strategy: str) -> list[str]:
    sel = f"#columns .dp-col[data-strategy='{strategy}'] .dp-tok:not(.dp-struck)"
    return page.evaluate(f"""[...document.querySelectorAll("{sel}")].map(t => t.innerText)""")


def _run(page, expect: str) -> str:
    """Press Run and wait until the status matches ``expect`` (a JavaScript regular expression)."""
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function(f"/{expect}/.test(document.querySelector('#status').innerText)", timeout=600_000)
    return page.locator("#status").inner_text()


def test_the_copy_branch_parameters_are_offered_checked_and_used(app_url):
    with chromium_page(app_url) as page:
        page.get_by_label("max_new_tokens (1–512)").fill("24")
        for name in ("Prompt lookup", "Lookahead"):
            page.get_by_label(name, exact=True).uncheck()
        assert page.get_by_label("Prophet head", exact=True).is_checked()
        page.get_by_text("Strategy parameters").click()
        source, depth = page.get_by_label("lookup_source"), page.get_by_label("lookup_tokens")
        assert source.input_value() == "suffix" and depth.input_value() == "16"
        SHOTS.mkdir(parents=True, exist_ok=True)
        source.locator("xpath=ancestor::div[contains(@class, 'column')][1]").screenshot(
            path=str(SHOTS / "prophet-params.png"))
        depth.fill("40")
        _run(page, "Error")
        # the message names the strategy, the parameter and its range (a toast), and the app keeps serving
        page.get_by_text("Prophet head: lookup_tokens must be in [1, 32], got 40").wait_for(timeout=30_000)
        depth.fill("16")
        source.click()
        page.get_by_role("option", name="prompt", exact=True).click()
        _run(page, "Ran 2 strategies")
        page.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 2 && "
                               "!document.querySelector('#columns .dp-running')", timeout=60_000)
        greedy, prophet = _tokens(page, "greedy"), _tokens(page, "prophet")
        assert len(greedy) > 8 and prophet == greedy
