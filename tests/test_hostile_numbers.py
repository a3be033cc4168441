"""Any JSON value in any numeric field (issue 25): a named error from the validation layer, never a crash.

JSON integers have no size limit (``1`` and 400 zeros parses to a Python int that ``float()`` cannot take),
and the API carries NaN and infinity literals. Every strategy parameter, generation setting and top-level
number goes through ``run_request``; every light replay handler takes the raw values of the browser.
"""

from __future__ import annotations

import pytest

from web import playback
from web.app_object import PlaygroundApp
from web.requests import run_request
from web.validation import GENERATION_FIELDS, param_fields, parse_sweep_spec

BUNDLED = "smollm2-135m-instruct"
HOSTILE = [10**400, -10**400, 2**63, -(2**63), 1e308, -1e308, float("nan"), float("inf"), float("-inf"), -0.0,
           1.5, True, None, "12", "lots", [], {}, [1, 2]]
GENERATION = [None] * len(GENERATION_FIELDS)


def _request(**change):
    values = dict(model=BUNDLED, assistant="none", strategies=["greedy"], prompt="Hi.", chat=True, max_new_tokens=4,
                  seed=0, params={}, generation=GENERATION)
    values.update(change)
    return run_request(**values)


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:24])
def test_top_level_numbers_get_named_errors(value):
    for field in ("max_new_tokens", "seed"):
        try:
            _request(**{field: value})
        except ValueError as exc:
            assert field in str(exc)


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:24])
def test_every_strategy_parameter_and_setting_gets_a_named_error(value):
    for strategy, field in param_fields():
        try:
            _request(strategies=[strategy], params={(strategy, field): value})
        except ValueError as exc:
            assert field in str(exc) or "unknown" not in str(exc), (strategy, field, str(exc))
    for i, name in enumerate(GENERATION_FIELDS):
        generation = list(GENERATION)
        generation[i] = value
        try:
            _request(generation=generation)
        except ValueError as exc:
            assert name in str(exc)


def test_a_huge_integer_names_its_field_and_range():
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 512\], got an integer of about 401 digits"):
        _request(max_new_tokens=10**400)
    with pytest.raises(ValueError, match=r"repetition_penalty .*got an integer of about 401 digits"):
        _request(generation=[10**400] + GENERATION[1:])
    with pytest.raises(ValueError, match=r"top_k must be in \[0, inf\], got an integer of about 401 digits"):
        _request(strategies=["sample"], params={("sample", "top_k"): 10**400})


@pytest.mark.parametrize("prompt", ["\x00\x00\x00", "\x00 \t\x01\n", "\u200b\u200b", " \x7f "])
def test_a_prompt_without_visible_text_is_refused(prompt):
    with pytest.raises(ValueError, match="prompt"):
        _request(prompt=prompt)


def test_the_api_refuses_a_sweep_the_page_does_not_offer():
    with pytest.raises(ValueError, match="'beam' cannot be swept; choose one of lookahead"):
        parse_sweep_spec("beam", "num_beams=1,2")


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:24])
def test_the_replay_handlers_take_any_value(value):
    state = PlaygroundApp()
    key = state.store.put({"results": [{"strategy": "greedy", "label": "Greedy", "token_ids": [5, 6],
                                           "events": [], "times_ms": [], "wall_s": 0.5}]}, 3)
    for k in (key, value):
        playback.replay(state, k, value)
        playback.replay_figures(state, k, value, value)
        playback.race_at(state, k, value, value)
        playback.race_play(state, k, value, value)
        playback.race_tick(state, k, {"wall": value, "from": value}, value)
        playback.inspect_position(state, k, value, value)
        playback.advance(state, k, value)
        playback.play(state, k, value)
        playback.autoplay(state, k, value)
    anchor = playback.race_rebase({}, value)
    assert anchor["from"] == anchor["from"] and abs(anchor["from"]) <= playback.MAX_CLOCK_MS
