"""The fast path (static KV cache, explicit positions and masks; CUDA graphs on a GPU) changes no token.

CI has no GPU, so these tests run the fast path's exact code on the CPU, where
only the graph capture itself is skipped: the static cache, the in-graph causal
mask built from the cache's write counter, the padded custom masks, rewinds,
growth and runner reuse are all exercised; the strategies run again with graph
replay emulated (``runtime/graphs.py``: every later call of a shape re-runs its
first call's closure over the static buffers), which the prophet head's draft
calls go through too (``tests/test_graph_emulation.py`` plants the bugs it catches). ``benchmarks/gpu.sh`` repeats the
equality check on CUDA with graphs on.
"""

from __future__ import annotations

import gc

import pytest
import torch
from test_prophet import random_prophet

from decoding.params import (
    GreedyParams,
    JacobiParams,
    LookaheadParams,
    PromptLookupParams,
    ProphetParams,
    SampleParams,
    SpeculativeParams,
)
from decoding.harness.runner import encode_prompt
from decoding.runtime import fastpath, graphs, headgraph
from decoding.runtime.models import default_target, load_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy, sample
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prompt_lookup, prophet, speculative

from tiny_models import prompt, tiny_causal

F64 = torch.float64


def _repetitive(lm, n=20):
    seed = prompt(6, 2)
    cont = greedy(seed, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids
    return seed + cont + seed


@pytest.mark.parametrize("emulate", [False, True], ids=["eager", "emulated-graphs"])
@pytest.mark.parametrize("arch", ["llama", "gptneox", "gpt2"])
def test_every_strategy_gives_the_same_tokens_on_the_fast_path(arch, emulate):
    lm = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    assert fastpath.supported(lm)
    for ids in (prompt(7, 1), _repetitive(lm)):
        ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=36).token_ids
        runs = {
            "greedy": lambda: greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=36),
            "speculative (self)": lambda: speculative(ids, ModelPair(lm, lm), SpeculativeParams(
                draft_tokens=3, fast=True), max_new_tokens=36),
            "prompt_lookup": lambda: prompt_lookup(ids, ModelPair(lm), PromptLookupParams(
                ngram_size=2, fast=True), max_new_tokens=36),
            "lookahead": lambda: lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=2,
                                                                                fast=True), max_new_tokens=36),
            "jacobi": lambda: jacobi(ids, ModelPair(lm), JacobiParams(block_size=5, fast=True),
                                     max_new_tokens=36, rng=make_generator(0)),
            "prophet": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                       ProphetParams(draft_tokens=3, fast=True), max_new_tokens=36),
        }
        with graphs.emulation(emulate):
            for name, run in runs.items():
                assert run().token_ids == ref, (arch, name)
    stats = fastpath.pool_stats(lm)
    assert (stats["replays"] > stats["captures"] > 0) == emulate, stats


def test_random_assistant_and_sampling_match_on_the_fast_path():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    assistant = tiny_causal("llama", seed=5, scale=8.0, dtype=F64)
    ids = prompt(9, 4)
    ref = greedy(ids, ModelPair(target), GreedyParams(), max_new_tokens=30).token_ids
    for adaptive in (False, True):
        res = speculative(ids, ModelPair(target, assistant), SpeculativeParams(draft_tokens=4, adaptive=adaptive,
                                                                              fast=True), max_new_tokens=30)
        assert res.token_ids == ref
        assert res.stats["alpha"] < 0.9, "a random assistant must get rejections, or cropping is untested"
    # seeded sampling draws the same tokens whether the forward is fast or not
    for params in (SampleParams(temperature=0.8, top_k=20), SpeculativeParams(temperature=0.8, draft_tokens=3)):
        fn = sample if isinstance(params, SampleParams) else speculative
        pair = ModelPair(target) if fn is sample else ModelPair(target, assistant)
        plain = fn(ids, pair, params, max_new_tokens=24, rng=make_generator(3)).token_ids
        fast = fn(ids, pair, type(params)(**{**params.__dict__, "fast": True}), max_new_tokens=24,
                  rng=make_generator(3)).token_ids
        assert fast == plain


def test_rewind_growth_and_runner_reuse():
    lm = tiny_causal("llama", seed=1, scale=8.0, dtype=F64)
    ids = prompt(8, 1)
    plain = Session(lm)
    fast = Session(lm, fast=True, max_len=12)          # capacity: one bucket
    a0, b0 = plain.prefill(ids), fast.prefill(ids)
    assert fast.runner is not None and fast.runner.capacity == fastpath.BUCKET
    assert torch.allclose(a0, b0)
    toks = [[3, 4, 5], [6], [7, 8]]
    for block in toks:
        assert torch.allclose(plain.forward(plain.tensor([block])), fast.forward(fast.tensor([block])))
    # rewind both by two positions and decode something else: the stale slots must be invisible
    plain.crop(plain.length - 2)
    fast.crop(fast.length - 2)
    assert fast.length == plain.length == len(ids) + 4
    assert torch.allclose(plain.forward(plain.tensor([[9, 10]])), fast.forward(fast.tensor([[9, 10]])))
    # overflow the capacity: the runner grows and keeps the cached prefix
    old = fast.runner
    long_block = [11] * (fastpath.BUCKET - fast.length + 3)
    assert torch.allclose(plain.forward(plain.tensor([long_block]))[:, -1],
                          fast.forward(fast.tensor([long_block]))[:, -1], atol=1e-9)
    assert fast.runner is not old and fast.runner.capacity > old.capacity
    assert fast.length == plain.length
    # a finished session's runner is reused by the next one (graphs stay captured on a GPU)
    runner = fast.runner
    del fast
    gc.collect()
    again = Session(lm, fast=True, max_len=runner.capacity)
    again.prefill(ids)
    assert again.runner is runner and again.length == len(ids)
    # two live sessions never share a runner
    other = Session(lm, fast=True, max_len=runner.capacity)
    other.prefill(ids)
    assert other.runner is not again.runner


def test_models_outside_the_fast_path_keep_the_plain_one():
    from tiny_models import tiny_marian
    lm = tiny_marian(seed=0)
    assert not fastpath.supported(lm)
    s = Session(lm, fast=True, max_len=20)
    s.prefill(prompt(5, 0))
    assert s.runner is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (benchmarks/gpu.sh runs this)")
def test_cuda_graphs_replay_and_equal_greedy():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float32, device="cuda")
    ids = prompt(7, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=40).token_ids
    for _ in range(2):
        assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=40).token_ids == ref
        res = lookahead(ids, ModelPair(lm), LookaheadParams(fast=True), max_new_tokens=40)
        assert res.token_ids == ref
    stats = fastpath.pool_stats(lm)
    assert stats["captures"] >= 1 and stats["replays"] > 40
    # the prophet's draft calls replayed as graphs too (runtime/headgraph.py), its tree verified on the target's
    head = random_prophet(lm, 1)
    for tree in (True, False):
        res = prophet(ids, ModelPair(lm, prophet=head), ProphetParams(draft_tokens=4, fast=True, tree=tree),
                      max_new_tokens=40)
        assert res.token_ids == ref and res.stats["head_graphs"]["replays"] > 0
    heads = headgraph.pool_stats(head)
    assert heads["captures"] == len(heads["keys"]) and heads["replays"] > heads["captures"]


@pytest.mark.parametrize("name", ["tiny", "bundled"])
def test_a_prefill_on_the_static_cache_gives_the_same_bits_whatever_its_capacity(name):
    """A race's greedy and a drafting strategy hold static caches of other sizes (a strategy leaves room for its
    trees), and both prefill eagerly over them. The attention once summed over every slot of the capacity, the
    blocked tail included, and PyTorch's CPU attention gives other bits at another key length: on the bundled int8
    model a HumanEval prompt's prophet and prompt lookup parted from greedy at a near-tie (under the AVX2 caps, and on
    the eager fast path). A prefill, and the first step after it, must not depend on the capacity."""
    if name == "bundled":
        lm = load_model(default_target())
        ids = encode_prompt(lm.tokenizer, "Write a Python function that merges two sorted lists into one sorted "
                            "list, and explain each step of it in a short comment. " * 5, chat=True)
        assert len(ids) > 160                # at 82 tokens the capacities happened to agree, at 166 they did not
    else:
        lm, ids = tiny_causal("llama", seed=0, scale=8.0), prompt(200, seed=4)
    got = []
    with torch.inference_mode():
        for max_len in (len(ids) + 8, len(ids) + 600):              # capacities of 1 and 3+ buckets
            session = Session(lm, "t", fast=True, max_len=max_len)
            first = session.prefill(ids)[0].clone()
            got.append((first, session.forward(session.tensor([[int(first.argmax())]]))[0, -1].clone()))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
