"""Lookahead decoding equals greedy, and its fused attention layout equals separate forwards."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from decoding.events import LookaheadStep, TokenCommitted, event_to_dict
from decoding.params import GreedyParams, LookaheadParams
from decoding.runtime.attention import attention_mask, check_mask_support
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.lookahead import NgramPool, lookahead, step_layout
from decoding.tracer import Tracer
from decoding.tree import TokenTree

from tiny_models import prompt, tiny_causal, tiny_marian

F64 = torch.float64
SETTINGS = [(1, 2, 1), (3, 3, 2), (5, 4, 5), (7, 5, 8)]      # (W, N, G)


def _greedy(lm, ids, n):
    return greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids


def _repetitive_prompt(lm, n=24):
    """A prompt that contains the model's own greedy continuation of it, so the pool has real hits."""
    seed = prompt(6, 2)
    cont = _greedy(lm, seed, n)
    return seed + cont + seed


@pytest.mark.parametrize("arch", ["llama", "gptneox", "gpt2"])
def test_equals_greedy_for_several_settings(arch):
    lm = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    accepted = 0
    for ids in (prompt(8, 1), _repetitive_prompt(lm)):
        ref = _greedy(lm, ids, 40)
        for (w, n, g), from_output in itertools.product(SETTINGS, (False, True)):
            params = LookaheadParams(window=w, ngram=n, guess_set=g, pool_from_output=from_output)
            res = lookahead(ids, ModelPair(lm), params, max_new_tokens=40, rng=make_generator(1))
            assert res.token_ids == ref, (arch, w, n, g, from_output)
            assert res.target_forwards <= len(ref)
            assert res.stats["mean_tokens_per_target_forward"] == pytest.approx(len(ref) / res.target_forwards, abs=1e-3)
            accepted += sum(res.stats["accepted_lengths"])
    assert accepted > 0, "the verification branch never accepted an n-gram; the test does not exercise it"


def test_eos_and_max_new_tokens_stop_like_greedy():
    lm = tiny_causal("gptneox", seed=1, scale=8.0, dtype=F64)
    ids = prompt(8, 1)
    ref = _greedy(lm, ids, 40)
    assert ref[-1] == 2 and len(ref) < 40         # this model reaches EOS
    for w, n, g in SETTINGS:
        res = lookahead(ids, ModelPair(lm), LookaheadParams(window=w, ngram=n, guess_set=g), max_new_tokens=40)
        assert res.token_ids == ref and res.stop_reason == "eos"
    for limit in (1, 2, 7):
        res = lookahead(_repetitive_prompt(lm), ModelPair(lm), LookaheadParams(), max_new_tokens=limit)
        assert res.token_ids == _greedy(lm, _repetitive_prompt(lm), limit)


def test_pool_is_lru_per_key_and_bounded_by_guess_set():
    pool = NgramPool(capacity=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([1, 2, 3])          # seen again: most recent
    pool.add([1, 6, 7])          # evicts (4, 5), the least recently seen
    assert pool.lookup(1) == [(6, 7), (2, 3)]
    assert len(pool) == 2
    pool.add_all([9, 8, 9, 8, 9], 3)
    assert set(pool.lookup(9)) == {(8, 9)} and pool.lookup(8) == [(9, 8)]
    assert pool.lookup(42) == []


def test_candidate_tree_merges_prefixes_and_keeps_first_candidate_contiguous():
    from decoding.verify import verify_tree_greedy
    tree = TokenTree.from_paths([(5, 6, 7), (5, 6, 8), (9, 1)])
    assert tree.tokens[:3] == (5, 6, 7)
    assert len(tree.tokens) == 6                   # 5-6 shared
    # greedy after the key is 5, after node 5 is 6, after 6 is 8, then 4
    logits = torch.zeros(1 + len(tree), 10)
    for row, tok in ((0, 5), (1 + 0, 6), (1 + 1, 8), (1 + tree.tokens.index(8), 4)):
        logits[row, tok] = 1.0
    verdict = verify_tree_greedy(logits, tree)
    assert [tree.tokens[k] for k in verdict.path] == [5, 6, 8] and verdict.next_token == 4


def _visible_chain(pending: int, parents: tuple[int, ...], levels: int, width: int, row: int) -> list[int]:
    """Rows a query may see, derived from the method's definition (not from ``step_layout``)."""
    if row < pending:
        return list(range(row + 1))
    k = row - pending
    if k < len(parents):
        chain, a = [], k
        while a >= 0:
            chain.append(pending + a)
            a = parents[a]
        return list(range(pending)) + chain[::-1]
    first = pending + len(parents)
    l, i = divmod(row - first, width)
    return (list(range(pending)) + [first + c for c in range(i + 1)]
            + [first + m * width + i for m in range(1, l + 1)])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fused_mask_matches_separate_forwards(arch):
    """Every row of one fused forward equals a plain causal forward over that row's own chain."""
    lm = tiny_causal(arch, seed=3, dtype=F64)
    context = prompt(9, 5)
    pending = [11, 12]
    tree = TokenTree.from_paths([(20, 21, 22), (20, 23), (24,)])
    levels, width = 2, 3
    window = [30, 31, 32, 33, 34, 35]
    allowed, rel, first = step_layout(len(pending), tree.parents, levels, width)
    fused = Session(lm)
    fused.prefill(context)
    cached = fused.length
    positions = rel + (cached + len(pending) - 1)
    flat = pending + list(tree.tokens) + window
    got = fused.forward(fused.tensor([flat]), position_ids=positions[None],
                        attention_mask=attention_mask(lm, allowed, positions, cached))[0]
    for row in range(len(flat)):
        chain = _visible_chain(len(pending), tree.parents, levels, width, row)
        assert chain[-1] == row
        # positions along a chain are consecutive, so a plain forward reproduces them
        assert [int(positions[c]) for c in chain] == list(range(cached, cached + len(chain)))
        plain = Session(lm)
        plain.prefill(context)
        ref = plain.forward(plain.tensor([[flat[c] for c in chain]]))[0, -1]
        torch.testing.assert_close(got[row], ref, rtol=1e-9, atol=1e-9)
    assert first == len(pending) + len(tree.tokens)


def test_trace_events_and_no_effect_on_tokens():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    ids = _repetitive_prompt(lm)
    params = LookaheadParams(window=4, ngram=3, guess_set=4)
    plain = lookahead(ids, ModelPair(lm), params, max_new_tokens=30)
    tracer = Tracer()
    traced = lookahead(ids, ModelPair(lm), params, max_new_tokens=30, tracer=tracer)
    assert plain.token_ids == traced.token_ids
    steps = [e for e in tracer.events if isinstance(e, LookaheadStep)]
    assert len(steps) == traced.stats["lookahead_steps"]
    assert all(len(e.window) <= params.ngram - 1 and all(len(lv) == params.window for lv in e.window)
               for e in steps)
    assert all(e.accepted_candidate < len(e.candidates) for e in steps)
    committed = [e for e in tracer.events if isinstance(e, TokenCommitted)]
    assert [e.token for e in sorted(committed, key=lambda e: e.position)] == traced.token_ids
    assert any(e.source == "ngram" for e in committed)
    assert sum(len(e.accepted) for e in steps) + 1 == len(traced.token_ids)
    json.dumps([event_to_dict(e) for e in tracer.events])


def test_models_without_4d_mask_support_get_a_clear_message():
    lm = tiny_marian(seed=0)
    with pytest.raises(ValueError, match="custom 4D attention mask"):
        check_mask_support(lm)
    with pytest.raises(ValueError, match="lookahead need a model"):
        lookahead(prompt(5, 1) + [2], ModelPair(lm), LookaheadParams(), max_new_tokens=5)


@pytest.mark.parametrize("bad,msg", [({"window": -1}, "window must be in [0, 32]"),
                                     ({"ngram": 1}, "ngram must be in [2, 8]"),
                                     ({"guess_set": 99}, "guess_set must be in [1, 32]"),
                                     ({"pool_from_prompt": "yes"}, "pool_from_prompt must be")])
def test_params_validation(bad, msg):
    with pytest.raises(ValueError) as err:
        LookaheadParams(**bad)
    assert msg in str(err.value)


def test_bundled_model_equals_greedy():
    from decoding.harness.runner import encode_prompt
    from decoding.runtime.models import load_model
    lm = load_model("smollm2-135m-instruct")
    text = "Write a Python function that returns the squares of a list of numbers, and call it on [1, 2, 3]."
    ids = encode_prompt(lm.tokenizer, text, chat=True)
    ref = _greedy(lm, ids, 40)
    check_mask_support(lm)      # the real model honours the fused 4D mask
    for w, n, g in ((2, 3, 2), (5, 4, 5)):
        res = lookahead(ids, ModelPair(lm), LookaheadParams(window=w, ngram=n, guess_set=g), max_new_tokens=40)
        assert res.token_ids == ref, (w, n, g)
        assert res.target_forwards < len(ref)      # some n-grams were accepted on this code prompt


def test_sampling_keeps_the_target_distribution_and_uses_the_candidates(monkeypatch, prefill_once):
    """temperature > 0: pooled n-grams are verified by speculative sampling with a one-hot q. The empirical
    distribution of 3-token outputs matches the exactly enumerated target distribution; trying a second
    candidate against the unchanged target (no residual) does not."""
    from test_speculative import (_chi_square, _draw_outputs, _exact_model_distribution, _negative_control_fails,
                                  _outputs, _passes)

    from decoding import verify as verify_mod
    lm = tiny_causal("llama", seed=0, vocab=6, eos=False, scale=2.0)
    ids = [0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 3, 5, 0, 3, 1, 4, 2, 5]     # every token is a key with several n-grams
    params = LookaheadParams(temperature=1.0, window=2, ngram=2, guess_set=3)
    n_out, n = 3, 3000
    exact = _exact_model_distribution(lm, ids, n_out, params)

    def run(gen):
        res = lookahead(ids, ModelPair(lm), params, max_new_tokens=n_out, rng=gen)
        return res.token_ids, sum(res.stats["accepted_lengths"])

    def draw(m):
        return _draw_outputs(run, m, 7)
    counts, accepted = draw(n)
    assert accepted > n // 4                       # candidates were really accepted, not only resampled
    stat, dof = _chi_square(counts, exact, n)
    assert _passes(stat, dof), (stat, dof)
    monkeypatch.setattr(verify_mod, "residual_distribution", lambda p_row, q_row, token: p_row)
    _negative_control_fails(_outputs(lambda gen: run(gen)[0], 7), exact, n)


def test_sampling_params_are_validated_and_zero_temperature_is_greedy():
    with pytest.raises(ValueError, match="temperature must be in"):
        LookaheadParams(temperature=-1)
    lm = tiny_causal("gpt2", seed=0, scale=8.0, dtype=F64)
    ids = _repetitive_prompt(lm)
    assert lookahead(ids, ModelPair(lm), LookaheadParams(temperature=0.0), max_new_tokens=20,
                     rng=make_generator(3)).token_ids == _greedy(lm, ids, 20)
