"""The suite's own tools: the curve memo (tests/curve_memo.py), the forward clock (tests/forward_clock.py) and the
tiny preset (tests/tiny_preset.py)."""

from __future__ import annotations

import json

import torch

import forward_clock
from curve_memo import curve_memo
from decoding.runtime.forward_cost import REPEATS, ForwardCost
from tiny_models import tiny_causal


def _counting():
    calls = []

    def timed(lm, max_width, *, fast=False, **options):
        calls.append((max_width, fast, options))
        return ForwardCost({1: 1.0 + len(calls), max_width: 2.0}, source="measured")
    return timed, calls


def test_the_memo_times_a_real_sized_curve_once_and_hands_out_copies():
    timed, calls = _counting()
    lm = tiny_causal("llama")
    memo = curve_memo(timed, {}, min_hidden=0)            # the tiny model counts as real-sized here
    first, second = memo(lm, 9), memo(lm, 9)
    assert len(calls) == 1 and first == second and first is not second     # a copy: it dies with its model
    memo(lm, 9, fast=True)                                # another mode, another width: timed again
    memo(lm, 13)
    assert [c[:2] for c in calls] == [(9, False), (9, True), (13, False)]
    # the fixed passes only: the adaptive extra ones ran to their budget beside the other worker
    assert all(c[2] == {"max_repeats": REPEATS} for c in calls)


def test_the_memo_times_again_for_another_model_its_own_options_or_a_tiny_model():
    timed, calls = _counting()
    store: dict = {}
    memo = curve_memo(timed, store, min_hidden=0)
    a, b = tiny_causal("llama", seed=1), tiny_causal("llama", seed=2)
    b.name = a.name + "-other"
    memo(a, 9)
    memo(b, 9)
    memo(a, 9, repeats=2)                                 # a curve's own test: never memoised
    assert len(calls) == 3 and calls[-1][2] == {"repeats": 2} and len(store) == 2
    plain = curve_memo(timed, {})                         # the default threshold: the tiny model is timed each time
    plain(a, 9)
    plain(a, 9)
    assert len(calls) == 5


def test_the_workers_of_a_run_share_a_curve_through_their_folder(tmp_path):
    """Two workers' memos (their own stores, one folder): the first times the curve and leaves it there, the second
    reads it; another key is timed again, and a memo on another folder (another run) times its own."""
    timed, calls = _counting()
    lm = tiny_causal("llama")
    first, second = (curve_memo(timed, {}, min_hidden=0, shared=tmp_path / "run") for _ in range(2))
    a = first(lm, 9)
    b = second(lm, 9)
    assert len(calls) == 1 and a == b and a is not b
    second(lm, 13)
    assert len(calls) == 2
    curve_memo(timed, {}, min_hidden=0, shared=tmp_path / "other run")(lm, 9)
    assert len(calls) == 3


def test_the_clock_counts_big_layers_and_heads_only_once_per_outer_call(tmp_path, monkeypatch):
    Layer = type("FakeDecoderLayer", (torch.nn.Module,), {"forward": lambda self, x: self.inner(x)})
    layer = Layer()
    layer.input_layernorm = torch.nn.LayerNorm(576)
    layer.inner = torch.nn.Linear(4, 4)
    small = Layer()
    small.input_layernorm = torch.nn.LayerNorm(64)
    small.inner = torch.nn.Linear(4, 4)
    head = torch.nn.Linear(576, 20_000, bias=False)
    assert forward_clock._is_clocked(layer) and forward_clock._is_clocked(head)
    assert not forward_clock._is_clocked(small) and not forward_clock._is_clocked(layer.inner)
    monkeypatch.setattr(forward_clock, "_seconds", forward_clock.defaultdict(float))
    monkeypatch.setattr(forward_clock, "_calls", forward_clock.defaultdict(int))
    monkeypatch.setitem(forward_clock._state, "test", "tests/test_x.py::t")
    x = torch.zeros(1, 4)
    for module in (layer, small, head):
        forward_clock._pre(module, (x,))
        forward_clock._pre(module.inner if hasattr(module, "inner") else module, (x,))   # nested: not counted
        forward_clock._post(module.inner if hasattr(module, "inner") else module, (x,), x)
        forward_clock._post(module, (x,), x)
    assert forward_clock._calls["tests/test_x.py::t"] == 2          # the big layer and the head, not the small
    assert forward_clock._seconds["tests/test_x.py::t"] > 0
    (tmp_path / "gw0.json").write_text(json.dumps({"tests/test_x.py::t": {"seconds": 2.0, "calls": 3, "curve_s": 1.0},
                                                   "tests/test_y.py::u": {"seconds": 5.0, "calls": 1}}))
    (tmp_path / "gw1.json").write_text(json.dumps({"tests/test_x.py::v": {"seconds": 4.0, "calls": 2}}))
    assert forward_clock.by_file(tmp_path) == [("tests/test_x.py", 6.0, 5, 1.0), ("tests/test_y.py", 5.0, 1, 0.0)]


def test_the_tiny_preset_is_offered_to_the_test_that_asks_and_answers_by_prompt(tiny_model):
    """The web-floor tests that race it rely on three things: the app's presets name it (only while such a test
    runs), it loads by that name from its folder with the bundled tokenizer, and its greedy differs by prompt (a
    model that said the same for every prompt would hide a mixed-up answer). By the prompt's own last tokens: two
    random layers barely see a digit inside the chat template's long system prompt, so a test that checks whose
    answer came back sends raw text (tests/test_load.py)."""
    from decoding.harness.runner import encode_prompt
    from decoding.params import GreedyParams
    from decoding.runtime.models import load_model, load_presets
    from decoding.runtime.pair import ModelPair
    from decoding.strategies.baselines import greedy
    from tiny_preset import BUNDLED
    assert load_presets()[tiny_model].network is False
    lm, bundled = load_model(tiny_model), load_model(BUNDLED)
    assert lm.model.config.num_hidden_layers == 2 and lm.vocab_size == bundled.vocab_size and lm.chat
    assert lm.tokenizer("Hi there")["input_ids"] == bundled.tokenizer("Hi there")["input_ids"]
    answers = {tuple(greedy(encode_prompt(lm.tokenizer, f"Name fruit number {i}.", chat=False), ModelPair(lm),
                            GreedyParams(), max_new_tokens=4).token_ids) for i in range(6)}
    assert len(answers) >= 4


def test_no_test_sees_the_tiny_preset_unless_it_asks():
    from decoding.runtime.models import load_presets
    from tiny_preset import TINY
    assert TINY not in load_presets()
