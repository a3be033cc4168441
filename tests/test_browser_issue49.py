"""Issue 49's strategies in the real app in headless chromium (as tests/test_browser.py): a self-speculative column
beside greedy, identical to it; a prompt-lookup column on typical acceptance, marked lossy; and the batch race
panel, whose grid shows each row's accepted lengths and waits."""

from __future__ import annotations

import pytest

from conftest import chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.bundled]


def _tokens(page, strategy: str) -> list[str]:
    sel = f"#columns .dp-col[data-strategy='{strategy}'] .dp-tok:not(.dp-struck)"
    return page.evaluate(f"""[...document.querySelectorAll("{sel}")].map(t => t.innerText)""")


def test_self_speculative_a_lossy_column_and_the_batch_panel(app_url):
    with chromium_page(app_url) as page:
        page.get_by_label("max_new_tokens (1–512)").fill("12")
        for name in ("Prophet head", "Prompt lookup", "Lookahead"):
            box = page.get_by_label(name, exact=True)
            if box.is_checked():
                box.uncheck()
        page.get_by_label("Self-speculative", exact=True).check()
        page.get_by_label("Prompt lookup", exact=True).check()
        # prompt lookup with Medusa's typical acceptance: a lossy column, marked so
        page.get_by_text("Strategy parameters", exact=True).click()
        params = page.locator("div.column:has(> div :text-is('Prompt lookup'))").last
        acceptance = params.get_by_label("acceptance", exact=True)
        acceptance.click()
        page.get_by_role("option", name="typical", exact=True).click()
        page.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function("/Ran 3 strategies/.test(document.querySelector('#status').innerText)",
                               timeout=600_000)
        page.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 3 && "
                               "!document.querySelector('#columns .dp-running')", timeout=60_000)
        lookup = page.locator("#columns .dp-col[data-strategy='prompt_lookup']").inner_text()
        assert "lossy" in lookup and "identical to greedy" not in lookup
        greedy, selfspec = _tokens(page, "greedy"), _tokens(page, "self_speculative")
        assert len(greedy) >= 8 and selfspec == greedy
        column = page.locator("#columns .dp-col[data-strategy='self_speculative']").inner_text()
        assert "Self-speculative" in column and "identical to greedy" in column

        page.get_by_text("Batch race: several prompts in one batch").click()
        slider = page.locator("#batch input[type=number]")
        slider.fill("2")
        slider.press("Enter")
        # the click must not overtake the field's new value (CI once sent the old one and got a refusal)
        page.wait_for_function("document.querySelector('#batch input[type=range]').value === '2'", timeout=30_000)
        page.locator("#batch-run").click()
        # whatever the press ends in (the race, a refusal, a failure) is drawn in the view: wait for it, then read
        page.wait_for_function("(v => v && !v.querySelector('.batch-hint') && v.innerText.trim().length > 0)"
                               "(document.querySelector('#batch-view'))", timeout=600_000)
        grid = page.locator("#batch-view").inner_text()
        assert page.locator("#batch-view .batch-race").count() >= 1, grid
        assert "greedy" in grid and "waited" in grid
        assert page.locator("#batch-view tr th.bl").count() >= 2          # one row a prompt
