"""Speculative decoding and prompt lookup: greedy exactness, sampling correctness, tracing."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from decoding import verify as verify_mod
from decoding.drafting.assistant import check_vocabularies
from decoding.events import event_to_dict
from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams, PromptLookupParams, SelfSpeculativeParams, SpeculativeParams
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.speculative import prompt_lookup, speculative
from decoding.tracer import Tracer
from decoding.verify import verify_greedy, verify_sampling

from tiny_models import prompt, tiny_causal

F64 = torch.float64


def _greedy(pair, ids, n):
    return greedy(ids, pair, GreedyParams(), max_new_tokens=n).token_ids


CHAINS = [dict(draft_tokens=k, adaptive=a) for k, a in itertools.product((1, 3, 6), (False, True))]
TREES = [dict(tree=True, draft_tokens=d, tree_topk=k, tree_nodes=n, adaptive=False, confidence_threshold=0.0)
         for d, k, n in ((2, 2, 3), (4, 3, 10), (6, 4, 20))]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
@pytest.mark.parametrize("assistant", ["random", "self"])
def test_speculative_greedy_is_exact_for_chains_and_trees(arch, assistant):
    target = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    helper = target if assistant == "self" else tiny_causal(arch, seed=7, scale=8.0, dtype=F64)
    for seed in (1, 2):
        ids = prompt(8, seed)
        ref = _greedy(ModelPair(target), ids, 40)
        for values in CHAINS + TREES:
            res = speculative(ids, ModelPair(target, helper), SpeculativeParams(**values), max_new_tokens=40)
            assert res.token_ids == ref, (arch, assistant, seed, values)
            tree = values.get("tree", False)
            if tree:
                assert res.stats["mean_nodes_per_step"] > res.stats["gamma"]      # the drafts branched
            if assistant == "self":    # the target drafting for itself: its argmax path is always in the draft
                # (a tree's alpha may stay below 1: the budget can cut that path above a deeper, likelier branch)
                assert res.stats["alpha"] > 0.8 if tree else res.stats["alpha"] == 1.0
                assert res.target_forwards < len(ref)
            elif arch != "gpt2":   # (sharpened tiny GPT-2s repeat one token, so any drafter is right there)
                assert res.stats["alpha"] < 0.5  # a random drafter is almost never right


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
def test_prompt_lookup_greedy_is_exact(arch):
    target = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    for seed in (1, 3):
        ids = prompt(6, seed) * 3  # repetitive prompt: lookups hit
        ref = _greedy(ModelPair(target), ids, 40)
        for k, n in ((2, 1), (5, 3), (10, 2)):
            res = prompt_lookup(ids, ModelPair(target), PromptLookupParams(draft_tokens=k, ngram_size=n),
                                max_new_tokens=40)
            assert res.token_ids == ref and res.draft_forwards == 0


def test_prompt_lookup_drafts_only_from_matches_of_min_ngram_tokens():
    """A shorter match drafts only down to ``min_ngram`` (default 2); ``ngram_size`` below it
    lowers the floor. Kills a floor ignored, off by one, or not clamped."""
    from decoding.drafting.lookup import PromptLookupDrafter
    one = [10, 11, 12, 13, 14, 50, 51, 12]        # only the last token occurred before
    two = [10, 11, 12, 13, 14, 50, 11, 12]        # the last 2 tokens did, not the last 3
    three = [10, 11, 12, 13, 14, 10, 11, 12]      # the last 3 did

    def drafted(context, **values):
        return PromptLookupDrafter(PromptLookupParams(**values)).propose(context, 4).tokens
    assert PromptLookupParams().min_ngram == 2
    assert [drafted(c) for c in (one, two, three)] == [[], [13, 14, 50, 11], [13, 14, 10, 11]]
    assert [drafted(c, min_ngram=3) for c in (one, two, three)] == [[], [], [13, 14, 10, 11]]
    assert [drafted(c, min_ngram=1) for c in (one, two, three)] == [[13, 14, 50, 51], [13, 14, 50, 11],
                                                                    [13, 14, 10, 11]]
    assert drafted(one, ngram_size=1) == [13, 14, 50, 51]           # min_ngram above ngram_size: ngram_size
    with pytest.raises(ValueError, match=r"min_ngram must be in \[1, 8\]"):
        PromptLookupParams(min_ngram=0)


def test_confidence_threshold_and_limits():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    ids = prompt(8, 1)
    ref = _greedy(ModelPair(target), ids, 17)
    res = speculative(ids, ModelPair(target, target), SpeculativeParams(draft_tokens=8, confidence_threshold=0.99),
                      max_new_tokens=17)
    assert res.token_ids == ref and len(res.token_ids) == 17
    eos_model = tiny_causal("gptneox", seed=1, scale=8.0, dtype=F64)
    ref = _greedy(ModelPair(eos_model), prompt(8, 1), 40)
    assert ref[-1] == 2 and len(ref) < 40
    res = speculative(prompt(8, 1), ModelPair(eos_model, eos_model), SpeculativeParams(draft_tokens=5),
                      max_new_tokens=40)
    assert res.token_ids == ref and res.stop_reason == "eos"


def test_vocabulary_mismatch_is_a_clear_error():
    a = tiny_causal("llama", vocab=96)
    b = tiny_causal("llama", vocab=64)
    with pytest.raises(ValueError, match="vocabularies differ"):
        check_vocabularies(a, b)
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculative(prompt(4), ModelPair(a, b), SpeculativeParams(), max_new_tokens=4)


@pytest.mark.parametrize("bad,msg", [({"draft_tokens": 0}, "draft_tokens must be in [1, 32]"),
                                     ({"confidence_threshold": 2}, "confidence_threshold must be in [0, 1]"),
                                     ({"temperature": -1}, "temperature must be in [0, 100]")])
def test_params_validation(bad, msg):
    with pytest.raises(ValueError) as err:
        SpeculativeParams(**bad)
    assert msg in str(err.value)
    with pytest.raises(ValueError, match="ngram_size must be in"):
        PromptLookupParams(ngram_size=0)


def test_tracing_does_not_change_tokens_and_is_json():
    target = tiny_causal("llama", seed=0, scale=8.0)
    helper = tiny_causal("llama", seed=3, scale=8.0)
    ids = prompt(8, 2)
    for params in (SpeculativeParams(draft_tokens=3), SpeculativeParams(temperature=0.8, top_k=20, draft_tokens=3)):
        plain = speculative(ids, ModelPair(target, helper), params, max_new_tokens=24, rng=make_generator(4))
        tracer = Tracer()
        traced = speculative(ids, ModelPair(target, helper), params, max_new_tokens=24, rng=make_generator(4),
                             tracer=tracer)
        assert plain.token_ids == traced.token_ids
        kinds = {type(e).__name__ for e in tracer.events}
        assert {"DraftProposed", "TokenVerified", "CorrectionToken", "Distribution", "StepTiming",
                "TokenCommitted", "ForwardPass"} <= kinds
        json.dumps([event_to_dict(e) for e in tracer.events])
        committed = [e.token for e in tracer.events if type(e).__name__ == "TokenCommitted"]
        assert committed == traced.token_ids
    s = traced.stats
    assert 0 <= s["alpha"] <= 1 and s["cost_ratio"] > 0 and s["predicted_speedup"] > 0
    assert sum(s["accepted_lengths"]) == s["accepted"]


# --------------------------------------------------------------------------- sampling correctness

def test_verify_greedy_unit():
    logits = torch.tensor([[0., 5, 1], [3, 0, 1], [0, 0, 9]])
    assert (verify_greedy(logits, [1, 0]).n_accepted, verify_greedy(logits, [1, 0]).next_token) == (2, 2)
    assert (verify_greedy(logits, [2, 0]).n_accepted, verify_greedy(logits, [2, 0]).next_token) == (0, 1)


def _simulated_outputs(p, q, k, n_out, seed):
    """Pure loop over verify_sampling with history-independent rows p[i], q[i]: endless n_out-token outputs."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        out: list[int] = []
        while len(out) < n_out:
            i0 = len(out)
            kk = min(k, n_out - i0)
            qs = q[i0:i0 + kk]
            draft = [int(torch.multinomial(row, 1, generator=gen)) for row in qs]
            v = verify_sampling(p[i0:i0 + kk + 1], qs, draft, gen)
            out += draft[:v.n_accepted] + [v.next_token]
        yield tuple(out[:n_out])


def _chi_square(counts, exact, n):
    """Chi-square statistic with cells of expected count < 5 pooled; returns (stat, degrees of freedom)."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, prob in exact.items():
        e, o = prob * n, counts.get(key, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return stat, cells - 1


def _passes(stat, dof):
    """~5 sigma above the chi-square mean: a correct sampler fails it with p < 4e-4 at 10 degrees of freedom,
    < 4e-5 at 50, < 7e-6 at 180 (and the tests' seeds are fixed, so a pass stays a pass)."""
    return stat < dof + 5 * (2 * dof) ** 0.5


# The statistical tests' negative control (a known bug patched in) draws as many outputs as the real check: on a
# third as many, 3 of the 7 controls tried (a tree draft, suffix decoding's chain, prompt lookup's) passed the bound.
# It checks the bound as it draws, at each quarter of n, and stops at the first checkpoint that fails: the first m
# outputs of its one seeded stream are a check of m <= n draws that catches the bug, and the real check's power
# against it only grows with n. A checkpoint before n counts only with 10 degrees of freedom or more (one pooled
# cell "fails" a bound of 0). Where it fails early it costs a quarter to a half of n runs, never more than n.
CONTROL_CHECKPOINTS = 4


def _outputs(run, seed):
    """Endless outputs of ``run(gen)`` (a token sequence, kept as a tuple) on one generator seeded ``seed``."""
    gen = make_generator(seed)
    while True:
        yield tuple(run(gen))


def _negative_control_fails(outputs, exact, n):
    """``outputs``: an iterator of run outputs with the bug patched in (``_outputs``); they must fail the bound
    within ``n`` draws. Returns (stat, dof, draws taken)."""
    counts: dict[tuple, int] = {}
    step = max(1, n // CONTROL_CHECKPOINTS)
    for m, key in enumerate(itertools.islice(outputs, n), 1):
        counts[key] = counts.get(key, 0) + 1
        if m % step == 0 or m == n:
            stat, dof = _chi_square(counts, exact, m)
            if not _passes(stat, dof) and (dof >= 10 or m == n):
                return stat, dof, m
    raise AssertionError(f"the negative control passed the bound on {n} draws: stat {stat:.1f}, dof {dof}")


def _count(outputs, n):
    """Counts of the next ``n`` of ``outputs``."""
    counts: dict[tuple, int] = {}
    for key in itertools.islice(outputs, n):
        counts[key] = counts.get(key, 0) + 1
    return counts


def _draw_outputs(run, n, seed):
    """``n`` runs of ``run(gen) -> (token ids, accepted tokens)`` on one seeded generator: output counts
    and the accepted tokens summed (to check that drafts really were accepted, not only resampled)."""
    from decoding.sampling import make_generator
    counts, gen, accepted = {}, make_generator(seed), 0
    for _ in range(n):
        tokens, acc = run(gen)
        accepted += acc
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts, accepted


def test_rejection_sampling_unit_matches_target_and_catches_naive_resampling(monkeypatch):
    torch.manual_seed(0)
    V, n_out, k = 4, 3, 3
    p = torch.softmax(torch.randn(n_out + 1, V) * 1.5, -1)
    q = torch.softmax(torch.randn(n_out, V) * 3.0, -1)  # a poor drafter
    exact = {seq: float(p[0, seq[0]] * p[1, seq[1]] * p[2, seq[2]])
             for seq in itertools.product(range(V), repeat=n_out)}
    n = 3000          # 42 degrees of freedom (false positives 4e-5); correct 28, naive 1,503 against the bound's 88
    stat, dof = _chi_square(_count(_simulated_outputs(p, q, k, n_out, 1), n), exact, n)
    assert _passes(stat, dof), (stat, dof)
    monkeypatch.setattr(verify_mod, "residual_distribution", lambda p_row, q_row, token: p_row)
    _negative_control_fails(_simulated_outputs(p, q, k, n_out, 1), exact, n)


def test_the_negative_control_stops_only_where_the_bound_fails():
    """The control's early stop: outputs drawn from the exact distribution never fail (it raises, as a patched
    bug that changed nothing must), outputs from a clearly different one fail at the first quarter, and a
    slightly different one is drawn on past it. A control that stopped at a checkpoint without failing the
    bound (one pooled cell, a degree-0 bound of 0) returns on the first stream."""
    torch.manual_seed(0)
    cells = list(itertools.product(range(6), repeat=2))
    p = torch.softmax(torch.randn(len(cells)), -1)
    exact = {c: float(p[i]) for i, c in enumerate(cells)}

    def stream(probs, seed):
        gen = torch.Generator().manual_seed(seed)
        while True:
            yield cells[int(torch.multinomial(probs, 1, generator=gen))]
    n = 4000
    with pytest.raises(AssertionError, match="passed the bound"):
        _negative_control_fails(stream(p, 1), exact, n)
    assert _negative_control_fails(stream(torch.full_like(p, 1 / len(cells)), 1), exact, n)[2] == n // 4
    slight = 0.9 * p + 0.1 / len(cells)
    stat, dof, taken = _negative_control_fails(stream(slight, 1), exact, n)
    assert taken > n // 4 and not _passes(stat, dof)
    # 20 draws of 36 cells: every cell is pooled, so no checkpoint before the last counts
    assert _negative_control_fails(stream(p, 1), exact, 20)[1:] == (0, 20)


def _exact_model_distribution(model, ids, n_out, params):
    """Enumerate p(x1..xn | prompt) under filtered sampling from the target."""
    from decoding.sampling import probs
    V = model.vocab_size
    seqs = list(itertools.product(range(V), repeat=n_out))
    exact = {}
    with torch.no_grad():
        for seq in seqs:
            full = torch.tensor([ids + list(seq)])
            logits = model.model(input_ids=full).logits[0, len(ids) - 1:-1].float()
            pr = probs(logits, params)
            exact[seq] = float(torch.prod(pr[torch.arange(n_out), torch.tensor(seq)]))
    return exact


@pytest.mark.parametrize("params", [SpeculativeParams(temperature=1.0, draft_tokens=2),
                                    SpeculativeParams(temperature=0.7, top_k=4, top_p=0.95, draft_tokens=2),
                                    SpeculativeParams(temperature=1.0, draft_tokens=2, tree=True, tree_topk=3,
                                                      tree_nodes=6, confidence_threshold=0.0)])
def test_speculative_sampling_matches_target_distribution_on_a_toy_model(params, monkeypatch, prefill_once):
    """Empirical distribution of 3-token outputs vs the exact target distribution (enumerated); without the
    residual distribution after a rejection the same check fails."""
    target = tiny_causal("llama", seed=0, vocab=6, eos=False, scale=2.0)
    helper = tiny_causal("llama", seed=9, vocab=6, eos=False, scale=4.0)
    ids, n_out, n = [1, 3, 4], 3, 3000
    exact = _exact_model_distribution(target, ids, n_out, params)
    assert abs(sum(exact.values()) - 1) < 1e-4

    def run(gen):
        return speculative(ids, ModelPair(target, helper), params, max_new_tokens=n_out, rng=gen).token_ids
    counts = _count(_outputs(run, 11), n)
    stat, dof = _chi_square(counts, exact, n)
    assert _passes(stat, dof), (stat, dof)
    monkeypatch.setattr(verify_mod, "residual_distribution", lambda p_row, q_row, token: p_row)
    _negative_control_fails(_outputs(run, 11), exact, n)


TREE_PARAMS = SpeculativeParams(temperature=1.0, draft_tokens=2, tree=True, tree_topk=3, tree_nodes=6,
                                confidence_threshold=0.0)


def test_the_forward_memo_keys_on_the_cache_contents():
    """A memo hit needs the same cache contents, not only the same inputs and positions: the same token fed after
    two prompts of one length gets each prompt's own logits and hidden states; after a crop back to the prompt's
    contents it is a hit; every forward is counted, and the cache holds what the real forward leaves."""
    from decoding.runtime.session import Session
    from tiny_models import memo_forwards
    lm = tiny_causal("llama", seed=0, vocab=6, eos=False, scale=2.0)

    def fed(prompt_ids, first=None):
        s = Session(lm)
        s.prefill(prompt_ids)
        if first is not None:            # a token fed, then cropped away: the cache holds the prompt's again
            s.forward(s.tensor([first]))
            s.crop(len(prompt_ids))
        logits = s.forward(s.tensor([5]), hidden=True)
        return logits, s.last_hidden, s.forwards, [(layer.keys, layer.values) for layer in s.cache.layers]
    cases = [([1, 3, 4], None), ([2, 3, 4], None), ([1, 3, 4], 0), ([1, 3, 4], None)]
    real = [fed(*case) for case in cases]
    assert not torch.equal(real[0][0], real[1][0])
    with memo_forwards() as counts:
        memo = [fed(*case) for case in cases]
    for want, got in zip(real, memo):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]) and want[2] == got[2]
        assert all(torch.equal(a, b) for pair in zip(want[3], got[3]) for a, b in zip(*pair))
    assert counts == {"hits": 4, "misses": 5}       # the prefills of [1, 3, 4] and 5 fed after them, but once


@pytest.mark.parametrize("kind,new", [("tree", 6), ("self", 3)])
def test_the_forward_memo_draws_what_the_model_draws_and_keeps_cache_bugs_visible(kind, new, monkeypatch):
    """``tiny_models.memo_forwards`` (the statistical tests' ``prefill_once``) answers a repeated forward from
    memory. The same seeded runs give the same tokens and forward counts with and without it, and forwards are
    answered from memory; a tree's compaction and a self-draft's layer view on the target's cache go through
    it. A planted cache bug (a tree's compaction that keeps the first rows fed, not the accepted path; a
    self-draft cut off by layer 0's count, which leaves the skipped layer's positions behind) changes the
    outcome, and with the memo the runs end exactly as the bug makes them end (its tokens, or its error)."""
    from decoding.drafting import selfdraft
    from decoding.runtime import session as session_mod
    from decoding.runtime.kvcache import crop_cache
    from decoding.strategies.speculative import self_speculative
    from tiny_models import memo_forwards
    target = tiny_causal("llama", seed=0, vocab=6, eos=False, scale=2.0, layers=3)
    helper = tiny_causal("llama", seed=9, vocab=6, eos=False, scale=4.0)
    self_params = SelfSpeculativeParams(temperature=0.8, top_k=4, skip_layers="1", draft_tokens=3)

    def outcome(n=20):
        gen = make_generator(11)
        try:
            done = [speculative([1, 3, 4], ModelPair(target, helper), TREE_PARAMS, max_new_tokens=new, rng=gen)
                    if kind == "tree" else
                    self_speculative([1, 3, 4], ModelPair(target), self_params, max_new_tokens=new, rng=gen)
                    for _ in range(n)]
        except RuntimeError as e:
            return f"error: {e}"
        return [(r.token_ids, r.target_forwards, r.draft_forwards) for r in done]
    plain = outcome()
    with memo_forwards() as counts:
        assert outcome() == plain
    assert counts["hits"] > 0 and counts["misses"] > 0, counts
    if kind == "tree":
        monkeypatch.setattr(session_mod, "compact_cache", lambda cache, base, rows: crop_cache(cache, base + len(rows)))
    else:
        monkeypatch.setattr(selfdraft, "crop_each_layer", crop_cache)
    buggy = outcome()
    with memo_forwards():
        assert outcome() == buggy
    assert buggy != plain


# --------------------------------------------------------------------------- bundled model

@pytest.fixture(scope="module")
def bundled():
    return load_model("smollm2-135m-instruct")


def test_bundled_model_self_assistant_and_prompt_lookup_equal_greedy(bundled):
    text = ("Repeat this sentence twice: The quick brown fox jumps over the lazy dog.")
    ids = encode_prompt(bundled.tokenizer, text, chat=True)
    ref = _greedy(ModelPair(bundled), ids, 32)
    spec = speculative(ids, ModelPair(bundled, bundled), SpeculativeParams(draft_tokens=4), max_new_tokens=32)
    assert spec.token_ids == ref and spec.stats["alpha"] == 1.0
    pl = prompt_lookup(ids, ModelPair(bundled), PromptLookupParams(), max_new_tokens=32)
    assert pl.token_ids == ref
    assert pl.target_forwards < len(ref)  # the copy task lets lookups hit
