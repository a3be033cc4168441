"""The one-click race of two models in a real browser (Debian's chromium, headless, driven by Playwright).

A preset trained for a strategy (``trained_for: jacobi``, a consistency-trained adapter on its ``base``) gets a
button that races that strategy on the base model against the same on the trained one, each against its own
greedy. No consistency-trained adapter is shipped yet (no GPU has trained one, issue 37), so this app reads a
test adapter (random LoRA factors on the bundled model, ``tests/adapters.py``) from an operator presets
file, the way an operator adds their own (``DECODING_PLAYGROUND_PRESETS``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import chromium_page, launch_local
from adapters import BASE, PRESET, write_presets

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / os.environ.get("SCREENSHOTS_DIR", "build/screenshots")
pytestmark = pytest.mark.browser
EXAMPLE = f"Example: Jacobi on {BASE} vs Jacobi on {PRESET} (consistency-trained)"


@pytest.fixture(scope="module")
def race_url(tmp_path_factory):
    from decoding.runtime.models import EXTRA_PRESETS, load_model
    folder = tmp_path_factory.mktemp("presets")
    before = os.environ.get(EXTRA_PRESETS)
    os.environ[EXTRA_PRESETS] = str(write_presets(folder, load_model(BASE).model.config))
    import app
    demo = app.build_demo()
    try:
        yield launch_local(demo)
    finally:
        demo.close()
        if before is None:
            os.environ.pop(EXTRA_PRESETS, None)
        else:
            os.environ[EXTRA_PRESETS] = before


def test_the_example_races_jacobi_on_the_base_model_against_the_trained_one(race_url):
    with chromium_page(race_url) as page:
        page.get_by_label("max_new_tokens (1–512)").fill("16")         # two blocks of 8
        page.get_by_role("button", name=EXAMPLE, exact=True).click()
        page.wait_for_function("/Ran 4 strategies/.test(document.querySelector('#status').innerText)",
                               timeout=600_000)
        page.wait_for_function("document.querySelectorAll('#columns .dp-col').length === 4 && "
                               "!document.querySelector('#columns .dp-running')", timeout=60_000)
        status = page.locator("#status").inner_text()
        assert BASE in status and PRESET in status
        # the form says what ran: the two models, Jacobi alone (greedy is each model's reference)
        assert page.locator("#versus input").input_value() == PRESET
        assert page.get_by_label("Jacobi", exact=True).is_checked()
        assert not page.get_by_label("Prophet head", exact=True).is_checked()
        # the block the test preset says it was trained for (trained_params), not this machine's auto block
        page.get_by_text("Strategy parameters", exact=True).click()
        assert page.get_by_label("block_size", exact=True).input_value() == "8"

        cols = page.locator("#columns .dp-col")
        titles = [cols.nth(i).locator(".dp-title").first.inner_text() for i in range(4)]
        assert [t.split(" · ")[0].strip() for t in titles][1::2] == ["Jacobi", "Jacobi"], titles
        assert [BASE in t and PRESET not in t for t in titles[:2]] == [True, True], titles
        assert all(PRESET in t for t in titles[2:]), titles
        jacobi = page.locator("#columns .dp-col[data-strategy='jacobi']")
        assert jacobi.count() == 2
        for i in range(2):      # each model's Jacobi is checked against that model's own greedy
            assert "identical to greedy" in jacobi.nth(i).inner_text()
        texts = [cols.nth(i).locator(".dp-tok").all_inner_texts() for i in (0, 2)]
        assert texts[0] != texts[1]        # two models: the trained one's greedy answer is its own

        # the Jacobi view: the two runs side by side, each under its label, fast-forwarded and stationary
        # tokens marked (and the marks explained) in each
        page.get_by_role("tab", name="Jacobi & lookahead", exact=True).click()
        view = page.locator("#jacobi-view")
        panels = view.locator(".dp-jc-panel")
        panels.first.wait_for(timeout=30_000)
        assert panels.count() == 2
        heads = [panels.nth(i).locator("h4").inner_text() for i in range(2)]
        assert BASE in heads[0] and PRESET not in heads[0] and PRESET in heads[1], heads
        boxes = [panels.nth(i).bounding_box() for i in range(2)]
        assert boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"] + 1          # side by side, not stacked
        assert abs(boxes[0]["y"] - boxes[1]["y"]) < 2
        for i in range(2):
            panel = panels.nth(i)
            assert panel.locator("tr.dp-jc-row").count() >= 2
            assert panel.locator("tr.dp-jc-row").first.locator("td[data-state]").count() == 8   # blocks of 8
            assert panel.locator(".dp-jc-chip[data-mark='ff']").count() == 1
            assert panel.locator(".dp-jc-chip[data-mark='stay']").count() == 1
            assert panel.locator("td[data-state='committed']").count() > 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        view.screenshot(path=str(SHOTS / "jacobi-versus.png"))

