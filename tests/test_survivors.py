"""Tests written against a mutation pass's survivors: small bugs that no other test caught.

* the C++ attention kernel gated on the wrong dtype (a float32 model's engine must use it: asserted, not skipped);
* the kernel built but never called by the compiled forward (its operators' calls counted by the profiler);
* the prophet head's cache buffers grown without copying the committed rows;
* the race's greedy reference not run in the race's fast mode;
* ``warmup.warm`` doing nothing for a model whose engine exists.

Compiling costs about a minute here (inductor runs a C++ compiler): one tiny float32 llama is enabled and warmed
once for the module, and its graph is shared by the tests.
"""

from __future__ import annotations

import os
import types

import pytest
import torch
from test_prophet import random_prophet

from decoding.harness.runner import run_comparison
from decoding.params import GreedyParams
from decoding.runtime import attention_kernels, compiled, warmup
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy

from tiny_models import VOCAB, prompt, tiny_causal

compiler_missing = compiled.compiler_missing()
needs_compiler = pytest.mark.skipif(compiler_missing is not None, reason=f"no compiler here: {compiler_missing}")

WARM_WIDTHS = (1, 3, compiled.ROWS + 8)       # the last one: two chunks of the graph


@pytest.fixture(scope="module")
def warmed():
    """A float32 tiny llama with its engine switched on, then warmed: what the engine held before and after
    ``warm`` (recorded here, first, so the test of ``warm`` does not depend on which test compiled first)."""
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float32)
    assert compiled.enable(lm) is None
    engine = compiled.engine(lm)
    before = dict(engine.stats(), ready=engine.ready(True), calls=engine.calls)
    took = warmup.warm(lm, widths=WARM_WIDTHS)
    after = dict(engine.stats(), ready=engine.ready(True), ready_plain=engine.ready(False), calls=engine.calls)
    yield types.SimpleNamespace(lm=lm, engine=engine, before=before, took=took, after=after)
    compiled.disable(lm)


# --------------------------------------------------------------------------- 1. the kernel's dtype gate

@needs_compiler
def test_a_float32_models_engine_uses_the_cpp_attention_kernel(warmed):
    if os.environ.get(attention_kernels.ENV_SWITCH, "1").strip().lower() in ("0", "false", "off", "no"):
        pytest.skip(f"the kernel is switched off here ({attention_kernels.ENV_SWITCH}=0)")
    assert warmed.lm.dtype == torch.float32
    # not "a model computing in ..." nor "could not be built": on a machine with a compiler the kernel is used
    assert warmed.engine.attention is None, warmed.engine.attention
    assert warmed.engine.stats()["attention"] == "C++ kernel"
    assert attention_kernels.ready()
    # and a model that does not compute in float32 is told why it goes without (built, not compiled: cheap)
    half = tiny_causal("llama", seed=0, dtype=torch.bfloat16)
    reason = compiled.Engine(half).attention
    assert reason is not None and "bfloat16" in reason


# --------------------------------------------------------------------------- 2. the kernel really called

def _kernel_calls(run) -> dict:
    """How many times each of the kernel's attention operators ran during ``run()`` (the profiler records every
    operator the compiled graph's wrapper calls through the dispatcher)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names = [event.name for event in prof.events()]
    return {op: names.count(f"decoding_attention::{op}") for op in ("scores", "values")}


@needs_compiler
def test_the_compiled_forward_calls_the_attention_kernel_in_every_layer(warmed):
    lm, engine = warmed.lm, warmed.engine
    assert engine.attention is None, engine.attention
    ids = prompt(6, 1)
    run = lambda: greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=5)   # noqa: E731
    run()                                          # compiled before the count (if warm did not)
    calls = engine.calls
    counted = _kernel_calls(run)
    forwards = engine.calls - calls
    assert forwards == 4                           # the prefill runs eagerly, each later forward compiled
    layers = lm.model.config.num_hidden_layers
    assert counted == {"scores": forwards * layers, "values": forwards * layers}


# --------------------------------------------------------------------------- 3. the prophet's buffers grow

def test_the_prophets_cache_keeps_its_committed_rows_when_it_grows_past_64_rows():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float64)
    head = random_prophet(target, seed=3).to(torch.float64)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(150, 64, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (150,), generator=g)

    grown = head.new_state()
    caps = []
    with torch.no_grad():
        for end in (50, 100, 150):                   # 64 rows, then 128, then 256: grown twice past 64
            feature = head.extend(grown, hidden[end - 50:end], tokens[end - 50:end])
            caps.append(grown.key_buf[0].shape[2])
            once = head.new_state()                  # a fresh state fed the same rows in one extend
            expected = head.extend(once, hidden[:end], tokens[:end])
            assert torch.allclose(feature, expected, atol=1e-9, rtol=1e-9), end
            for mine, theirs in zip(grown.keys + grown.values, once.keys + once.values):
                assert torch.allclose(mine, theirs, atol=1e-9, rtol=1e-9), end
        assert caps == [64, 128, 256]
        # and a draft step over the grown cache sees the committed rows the fresh one does
        drafted = [head.draft_step(state, head.new_scratch(), feature, tokens[-1:], 1) for state in (grown, once)]
    assert torch.allclose(drafted[0], drafted[1], atol=1e-9, rtol=1e-9)


# --------------------------------------------------------------------------- 4. the race's reference mode

class _Calls:
    """A live observer noting the engine's compiled forwards during each lane's timed run."""

    def __init__(self, engine) -> None:
        self.engine, self.during, self._at = engine, {}, None

    def plan(self, names, tokenizer) -> None:
        pass

    def begin(self, rr, hook, warming) -> None:
        if not warming:
            self._at = self.engine.calls

    def finish(self, rr) -> None:
        self.during[rr.strategy] = self.engine.calls - self._at


@needs_compiler
def test_a_fast_races_greedy_reference_runs_fast_and_compiled(warmed):
    lm, engine = warmed.lm, warmed.engine
    for fast in (True, False):
        seen = _Calls(engine)
        results = run_comparison(prompt(8, 2), ModelPair(lm), [("prompt_lookup", {"ngram_size": 2, "fast": fast})],
                                 max_new_tokens=6, warmup=False, trace=False, live=seen)
        ref = results[0]
        assert ref.strategy == "greedy" and ref.reference
        assert ref.params == {"fast": fast}, fast
        assert results[1].params["fast"] is fast
        if fast:      # the reference's forwards after its prefill went through the compiled graph
            assert seen.during["greedy"] == len(ref.token_ids) - 1 > 0
        else:
            assert seen.during["greedy"] == 0
        assert results[1].matches_greedy is True


# --------------------------------------------------------------------------- 5. warm() compiles

@needs_compiler
def test_warm_compiles_the_engines_graph_and_times_each_width(warmed):
    before, after, took = warmed.before, warmed.after, warmed.took
    assert before["graphs"] == 0 and not before["ready"]
    assert set(took) == {str(w) for w in WARM_WIDTHS} | {"tree"}
    assert all(isinstance(s, float) and s >= 0 for s in took.values())
    assert after["ready"] and after["ready_plain"] and after["graphs"] >= 1
    # each width's forward ran compiled (the widest in two chunks of ROWS), and the tree through the same graph
    assert after["calls"] - before["calls"] == sum(-(-w // compiled.ROWS) for w in WARM_WIDTHS) + 1
    assert after["compile_s"] > 0


def test_warm_does_nothing_for_a_model_without_an_engine():
    lm = tiny_causal("llama", seed=0)
    assert compiled.engine(lm) is None
    assert warmup.warm(lm, widths=(1,)) == {}
