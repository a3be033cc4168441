"""The compiled CPU path (decoding/runtime/compiled.py): the same tokens as eager, really used, and eager with a
reason where it cannot run.

Compiling costs seconds per graph (inductor runs a C++ compiler), so the tiny model's engine is built once per
module and its graphs are shared by the tests; inductor's disk cache makes a second run of the suite cheaper.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_prophet import random_prophet

from decoding.harness.runner import encode_prompt
from decoding.params import (
    GreedyParams,
    JacobiParams,
    LookaheadParams,
    PromptLookupParams,
    ProphetParams,
    SpeculativeParams,
)
from decoding.runtime import compiled, fastpath
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prompt_lookup, prophet, speculative

from tiny_models import prompt, tiny_causal

pytestmark = pytest.mark.skipif(compiled.compiler_missing() is not None,
                                reason=f"no compiler here: {compiled.compiler_missing()}")


@pytest.fixture(scope="module")
def lm():
    model = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float32)
    assert compiled.enable(model) is None
    yield model
    compiled.disable(model)


def _repetitive(lm, n=20):
    seed = prompt(6, 2)
    return seed + greedy(seed, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids + seed


def _runs(ids, lm, fast):
    return {
        "greedy": lambda: greedy(ids, ModelPair(lm), GreedyParams(fast=fast), max_new_tokens=36),
        "speculative (self)": lambda: speculative(ids, ModelPair(lm, lm), SpeculativeParams(
            draft_tokens=3, fast=fast), max_new_tokens=36),
        "prompt_lookup": lambda: prompt_lookup(ids, ModelPair(lm), PromptLookupParams(ngram_size=2, fast=fast),
                                               max_new_tokens=36),
        "lookahead": lambda: lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=2,
                                                                            fast=fast), max_new_tokens=36),
        "jacobi": lambda: jacobi(ids, ModelPair(lm), JacobiParams(block_size=5, fast=fast), max_new_tokens=36,
                                 rng=make_generator(0)),
        "prophet (tree)": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                          ProphetParams(draft_tokens=3, tree=True, fast=fast), max_new_tokens=36),
        "prophet (chain)": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                           ProphetParams(draft_tokens=3, tree=False, fast=fast), max_new_tokens=36),
    }


def test_every_lossless_strategy_gives_eagers_tokens_compiled(lm):
    engine = compiled.engine(lm)
    for ids in (prompt(7, 1), _repetitive(lm)):
        eager = {name: run().token_ids for name, run in _runs(ids, lm, fast=False).items()}
        assert all(tokens == eager["greedy"] for tokens in eager.values()), "the eager reference itself differs"
        for name, run in _runs(ids, lm, fast=True).items():
            before = engine.calls
            result = run()
            assert result.token_ids == eager["greedy"], name
            # every forward after the prefill went through a compiled graph
            assert engine.calls - before == result.target_forwards - 1 + (
                result.draft_forwards - 1 if name == "speculative (self)" else 0), name


def test_a_counter_shows_the_compiled_forwards_are_the_ones_that_ran(lm):
    ids = prompt(5, 3)
    session = Session(lm, fast=True, max_len=len(ids) + 20)
    session.prefill(ids)
    runner, engine = session.runner, compiled.engine(lm)
    assert runner.engine is engine
    calls, ran = engine.calls, runner.compiled_forwards
    for width in (1, 3, 9):                       # three widths, one graph
        session.forward(session.tensor([[4] * width]))
    assert runner.compiled_forwards == ran + 3 and engine.calls == calls + 3
    # and the logits are eager's for the same cache (the compiled graph is not a stand-in)
    plain = Session(lm)
    plain.prefill(ids)
    for width in (1, 3, 9):
        plain.forward(plain.tensor([[4] * width]))
    session.crop(len(ids) + 4)
    plain.crop(len(ids) + 4)
    fast_logits, eager_logits = session.forward(session.tensor([[5, 6]])), plain.forward(plain.tensor([[5, 6]]))
    assert torch.allclose(fast_logits, eager_logits, atol=1e-4)


def test_wide_forwards_run_in_chunks_and_trees_read_a_gathered_layout(lm):
    engine = compiled.engine(lm)
    ids = prompt(6, 2)
    plain, fast = Session(lm), Session(lm, fast=True, max_len=len(ids) + 90)
    for session in (plain, fast):
        session.prefill(ids)
    calls = engine.calls
    wide = [[(7 * i) % 90 + 3 for i in range(compiled.ROWS + 8)]]           # 40 rows: two graph calls
    assert torch.allclose(plain.forward(plain.tensor(wide)), fast.forward(fast.tensor(wide)), atol=1e-4)
    assert engine.calls == calls + 2
    # a tree (root, two children that do not see each other): the gathered graph, eager's logits
    from decoding.runtime.attention import tree_forward
    from decoding.tree import TokenTree
    tree = TokenTree((11, 12, 13), (-1, 0, 0))
    assert torch.allclose(tree_forward(plain, [9], tree), tree_forward(fast, [9], tree), atol=1e-4)
    assert engine.ready(hidden=False, gathered=True)


def test_one_set_of_graphs_serves_every_cache_capacity(lm):
    engine = compiled.engine(lm)
    greedy(prompt(6, 0), ModelPair(lm), GreedyParams(fast=True), max_new_tokens=8)
    graphs = engine.stats()["graphs"]
    long = prompt(fastpath.BUCKET + 40, 5)            # a second capacity (two buckets) and a runner that grows
    ref = greedy(long, ModelPair(lm), GreedyParams(), max_new_tokens=12).token_ids
    assert greedy(long, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=12).token_ids == ref
    assert engine.stats()["graphs"] == graphs


def test_the_hidden_states_are_the_ones_transformers_reports(lm):
    ids = prompt(6, 4)
    plain, fast = Session(lm), Session(lm, fast=True, max_len=len(ids) + 8)
    plain.prefill(ids)
    fast.prefill(ids)
    ran = fast.runner.compiled_forwards
    for session in (plain, fast):
        session.forward(session.tensor([[7, 8, 9]]), hidden=True)
    assert fast.runner.compiled_forwards == ran + 1
    assert torch.allclose(plain.last_hidden, fast.last_hidden, atol=1e-5)
    plain.hidden_layers = fast.hidden_layers = (1,)   # a layer-fusion head's input: the last layer's, then layer 1's
    for session in (plain, fast):
        session.forward(session.tensor([[10]]), hidden=True)
    assert plain.last_hidden.shape == fast.last_hidden.shape
    assert torch.allclose(plain.last_hidden, fast.last_hidden, atol=1e-5)


def test_models_the_compiler_does_not_take_stay_eager_and_say_why():
    gpt2 = tiny_causal("gpt2", seed=0)
    assert "gpt2" in compiled.enable(gpt2) and compiled.engine(gpt2) is None
    session = Session(gpt2, fast=True, max_len=20)
    session.prefill(prompt(5, 0))
    ran = session.runner.compiled_forwards
    session.forward(session.tensor([[3]]))
    assert session.runner.engine is None and session.runner.compiled_forwards == ran == 0
    from decoding.runtime.kernels import HalfLinear, half_available
    if half_available():
        llama = tiny_causal("llama", seed=0)
        llama.model.lm_head = HalfLinear(llama.model.lm_head)
        assert "float16" in compiled.why_not(llama)


def test_without_a_compiler_the_app_serves_eagerly_and_says_so(monkeypatch):
    from web.service import Settings, chosen_compiled, ui_default
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    assert "C++ compiler" in compiled.compiler_missing()
    model = tiny_causal("llama", seed=3)
    settings = dataclasses.replace(Settings(), target="tiny")
    monkeypatch.setattr(Settings, "load", lambda self, name: model)
    chosen = chosen_compiled(settings)
    assert not chosen.compiled and "off" in chosen.compiled_note and "C++ compiler" in chosen.compiled_note
    assert compiled.engine(model) is None
    if not torch.cuda.is_available():
        assert ui_default("greedy", "fast", chosen) is False
    # the run itself still works, eagerly
    ids = prompt(6, 1)
    assert greedy(ids, ModelPair(model), GreedyParams(fast=True), max_new_tokens=6).token_ids == \
        greedy(ids, ModelPair(model), GreedyParams(), max_new_tokens=6).token_ids
    monkeypatch.undo()
    monkeypatch.setenv(compiled.ENV_SWITCH, "0")
    assert "DECODING_COMPILE=0" in compiled.why_not(model)


def test_the_page_ticks_fast_where_the_forward_was_compiled():
    from web.service import Settings, ui_default
    assert ui_default("prophet", "fast", Settings(compiled=True)) is True
    assert ui_default("greedy", "fast", Settings(compiled=True)) is True
    assert ui_default("greedy", "fast", Settings(compiled=False)) is torch.cuda.is_available()


@pytest.fixture(scope="module")
def bundled():
    from decoding.runtime.models import load_model
    model = load_model("smollm2-135m-instruct")
    assert compiled.enable(model) is None
    yield model
    compiled.disable(model)


def test_the_bundled_model_gives_the_same_tokens_compiled_and_eager(bundled):
    from decoding.runtime.head import load_prophet, shipped_head
    text = "Repeat this list exactly, twice: apples, pears, plums, figs, dates."
    ids = encode_prompt(bundled.tokenizer, text, chat=True)
    eager = greedy(ids, ModelPair(bundled), GreedyParams(), max_new_tokens=24).token_ids
    engine = compiled.engine(bundled)
    before = engine.calls
    runs = [greedy(ids, ModelPair(bundled), GreedyParams(fast=True), max_new_tokens=24)]
    pair = ModelPair(bundled, None, prophet=load_prophet(shipped_head(bundled), bundled))
    runs.append(prophet(ids, pair, ProphetParams(fast=True), max_new_tokens=24))
    runs.append(prompt_lookup(ids, ModelPair(bundled), PromptLookupParams(fast=True), max_new_tokens=24))
    assert [run.token_ids for run in runs] == [eager] * 3
    assert runs[1].target_forwards < runs[0].target_forwards and runs[2].target_forwards < runs[0].target_forwards
    # every forward after each prefill ran compiled
    assert engine.calls - before == sum(run.target_forwards - 1 for run in runs)


def test_where_the_compiler_runs_the_start_serves_a_version_that_compiles(tmp_path, monkeypatch):
    from decoding.runtime import routes
    from web import service
    names = routes.candidates("smollm2-135m-instruct", service.load_presets())
    half = [n for n in names if service.load_presets()[n].weights == "fp16"]
    if not half or len(names) < 2:
        pytest.skip("no float16-weight version runs on this machine")
    table = {name: {1: 40.0, routes.WIDTH: 70.0} for name in names}
    table[half[0]] = {1: 30.0, routes.WIDTH: 40.0}                       # cheapest eager, but cannot compile
    monkeypatch.setattr(service, "clear_model_cache", lambda: None)
    chosen = service.chosen_target(service.Settings(), measure=table.__getitem__, file=tmp_path / "a.json")
    assert chosen.target != half[0] and service.load_presets()[chosen.target].weights != "fp16"
    assert chosen.target_note.startswith(chosen.target) and "cannot be compiled" in chosen.target_note
    monkeypatch.setattr(compiled, "compiler_missing", lambda: "no C++ compiler on this machine")
    eager = service.chosen_target(service.Settings(), measure=table.__getitem__, file=tmp_path / "b.json")
    assert eager.target == half[0]
