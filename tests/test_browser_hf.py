"""transformers' own generate as a race column, in the real app in headless chromium (as tests/test_browser.py).

The visitor ticks "transformers generate: greedy" next to Greedy on the bundled model and runs: the library's
column is labelled as transformers', streams its tokens while it runs (the live race advances inside
``generate``), and ends with greedy's text, token for token, marked identical to greedy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import chromium_page

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / os.environ.get("SCREENSHOTS_DIR", "build/screenshots")   # as test_browser.py
pytestmark = pytest.mark.browser
HF_LABEL = "transformers generate: greedy"

# Installed before the Run click: whether the transformers column was seen running with tokens in it.
WATCH_HF = """() => {
  window.dpHf = {liveTokens: 0};
  const obs = new MutationObserver(() => {
    const col = document.querySelector("#columns .dp-col.dp-running[data-strategy='hf_greedy']");
    if (col) window.dpHf.liveTokens = Math.max(window.dpHf.liveTokens, col.querySelectorAll('.dp-tok').length);
  });
  obs.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def page(app_url):
    with chromium_page(app_url) as pg:
        yield pg


def _tokens(page, strategy: str) -> list[str]:
    return page.evaluate(f"""[...document.querySelectorAll("#columns .dp-col[data-strategy='{strategy}'] .dp-tok")]
                             .map(t => t.innerText)""")


def test_transformers_greedy_column_next_to_greedy(page):
    for name in ("transformers generate: prompt lookup", "transformers generate: assisted (needs an assistant model)"):
        assert page.get_by_label(name, exact=True).count() == 1, name          # offered, not ticked
        assert not page.get_by_label(name, exact=True).is_checked(), name
    page.get_by_label("max_new_tokens (1–512)").fill("48")
    for name in ("Prophet head", "Prompt lookup", "Lookahead"):
        page.get_by_label(name, exact=True).uncheck()
    page.get_by_label(HF_LABEL, exact=True).check()
    assert page.get_by_label("Greedy", exact=True).is_checked()

    page.evaluate(WATCH_HF)
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("/Ran 2 strategies/.test(document.querySelector('#status').innerText)", timeout=600_000)
    page.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 2 && "
                           "!document.querySelector('#columns .dp-running')", timeout=60_000)

    cols = page.locator("#columns .dp-col")
    assert cols.nth(0).get_attribute("data-strategy") == "greedy"
    hf = page.locator("#columns .dp-col[data-strategy='hf_greedy']")
    assert hf.locator(".dp-title").inner_text() == HF_LABEL                  # labelled as the library's
    greedy_tokens, hf_tokens = _tokens(page, "greedy"), _tokens(page, "hf_greedy")
    assert len(hf_tokens) > 8 and hf_tokens == greedy_tokens                   # generate's tokens are greedy's
    assert "".join(hf_tokens) == "".join(greedy_tokens)
    assert "identical to greedy" in hf.inner_text()
    assert hf.locator(".dp-tok[data-source='greedy']").count() == len(hf_tokens)
    assert int(hf.locator(".dp-stats div", has_text="target fwd").locator("b").inner_text()) == len(hf_tokens)
    live = page.evaluate("window.dpHf")
    print(f"\n[browser hf] {len(hf_tokens)} tokens; {live['liveTokens']} shown while the column ran")
    assert live["liveTokens"] > 0, "the transformers column showed no token while it ran"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#columns").screenshot(path=str(SHOTS / "race-transformers.png"))
