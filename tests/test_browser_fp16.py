"""The float16-weight preset in the real app in headless chromium (as tests/test_browser.py).

A visitor picks the preset in the target picker, where it is labelled as its own reference, and races greedy
against the prophet on it: the prophet's column is marked identical to greedy (this model's greedy), and the
run is reported on that model.
"""

from __future__ import annotations

import pytest

from conftest import chromium_page
from decoding.runtime import kernels

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not kernels.half_available(), reason="no FBGEMM fp16 GEMM in this build")]
PRESET = "smollm2-135m-instruct-fp16w"


def _tokens(page, strategy: str) -> list[str]:
    """The committed tokens of a column (rejected drafts are struck out)."""
    sel = f"#columns .dp-col[data-strategy='{strategy}'] .dp-tok:not(.dp-struck)"
    return page.evaluate(f"""[...document.querySelectorAll("{sel}")].map(t => t.innerText)""")


def test_the_fp16_preset_races_against_its_own_greedy(app_url):
    with chromium_page(app_url) as page:
        picker = page.get_by_label("Target model")
        picker.click()
        option = page.get_by_role("option", name=f"{PRESET} (float16 weights: checked against its own greedy)")
        assert option.count() == 1                                      # offered, and labelled
        option.click()
        page.get_by_label("max_new_tokens (1–512)").fill("32")
        for name in ("Prompt lookup", "Lookahead"):
            page.get_by_label(name, exact=True).uncheck()
        assert page.get_by_label("Prophet head", exact=True).is_checked()
        page.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function("/Ran 2 strategies/.test(document.querySelector('#status').innerText)",
                               timeout=600_000)
        page.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 2 && "
                               "!document.querySelector('#columns .dp-running')", timeout=60_000)
        assert PRESET in page.locator("#status").inner_text()
        greedy, prophet = _tokens(page, "greedy"), _tokens(page, "prophet")
        assert len(greedy) > 8 and prophet == greedy
        assert "identical to greedy" in page.locator("#columns .dp-col[data-strategy='prophet']").inner_text()
