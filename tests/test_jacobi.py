"""Jacobi decoding: every variant equals greedy, and takes the forwards the paper's rule says.

Exactness runs on tiny random Llama, GPT-NeoX, GPT-2 and Marian models and on the
bundled model, comparing full outputs. Iteration counts run on a scripted model
whose greedy continuation and dependency structure the tests choose, so every
count below is worked out by hand in its comment.
"""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
import torch

from decoding.events import JacobiIteration, event_to_dict
from decoding.harness.runner import encode_prompt
from decoding.params import INITS, VARIANTS, GreedyParams, JacobiParams
from decoding.runtime.models import load_model, wrap_model
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi, unchanged, verified
from decoding.tracer import Tracer

from tiny_models import prompt, tiny_causal, tiny_marian

F64 = torch.float64
EOS, PAD, JUNK = 2, 0, 15


# --------------------------------------------------------------------------- a scripted model

class Scripted(torch.nn.Module):
    """A causal LM whose greedy continuation is ``greedy`` and whose dependencies the test picks.

    The token predicted at output position p is ``greedy[p]`` when the ``depth[p]``
    output tokens before it are greedy's (prompt tokens always are), else ``JUNK``.
    Depth 0 = the model knows position p without looking; depth 1 = a chain. The KV
    cache stores the token ids themselves, so crops and rewinds work as for a real model.
    """

    def __init__(self, prompt_len: int, greedy_tokens: list[int], depth: list[int], vocab: int = 16) -> None:
        super().__init__()
        from transformers import GenerationConfig, PretrainedConfig
        self.head = torch.nn.Linear(1, vocab, bias=False)
        self.config = PretrainedConfig(eos_token_id=EOS, pad_token_id=PAD)
        self.generation_config = GenerationConfig(eos_token_id=EOS, pad_token_id=PAD)
        self.prompt_len, self.greedy, self.depth, self.vocab = prompt_len, greedy_tokens, depth, vocab

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def next_token(self, context: list[int]) -> int:
        p = len(context) - self.prompt_len                     # output position being predicted
        lo = max(0, p - self.depth[p])
        return self.greedy[p] if context[self.prompt_len + lo:] == self.greedy[lo:p] else JUNK

    def forward(self, input_ids: torch.Tensor, past_key_values=None, **_: object) -> SimpleNamespace:
        ids = input_ids.to(F64)[:, None, :, None]                                 # [1, 1, T, 1]
        keys, _ = past_key_values.update(ids, ids, 0)                             # [1, 1, cache+T, 1]
        context = keys[0, 0, :, 0].long().tolist()
        t = input_ids.shape[1]
        logits = torch.full((1, t, self.vocab), -10.0)                            # [1, T, V]
        for i in range(t):
            logits[0, i, self.next_token(context[:len(context) - t + i + 1])] = 10.0
        return SimpleNamespace(logits=logits)


PROMPT = [9, 10, 11]
GREEDY_13 = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 3]             # 13 tokens, no EOS


def scripted(depth: list[int], tokens: list[int] = GREEDY_13):
    full = tokens + [3] * 40                                           # what it says past the limit
    return wrap_model(Scripted(len(PROMPT), full, depth + [0] * 40), name="scripted")


def run(lm, variant: str, n: int = 13, block: int = 4, **extra):
    tracer = Tracer()
    res = jacobi(PROMPT, ModelPair(lm), JacobiParams(block_size=block, variant=variant, **extra),
                 max_new_tokens=n, tracer=tracer)
    ref = greedy(PROMPT, ModelPair(lm), GreedyParams(), max_new_tokens=n)
    assert res.token_ids == ref.token_ids, variant
    its = [e for e in tracer.events if isinstance(e, JacobiIteration)]
    assert res.stats["iterations"] == len(its) == res.target_forwards - 1
    return res, its


def per_block(its: list[JacobiIteration]) -> list[int]:
    """Iterations each block took."""
    counts: dict[int, int] = {}
    for e in its:
        counts[e.block] = max(counts.get(e.block, 0), e.iteration)
    return [counts[b] for b in sorted(counts)]


def test_scripted_model_is_what_it_claims():
    lm = scripted([1] * 13)
    assert greedy(PROMPT, ModelPair(lm), GreedyParams(), max_new_tokens=13).token_ids == GREEDY_13


# --------------------------------------------------------------------------- iteration counts, by hand

def test_chain_takes_one_iteration_per_token():
    # Every token depends on the one before (depth 1). The first token comes from the prefill;
    # blocks of 4 cover positions 1-4, 5-8, 9-12. In a block, iteration k fixes position k only,
    # so no iteration repeats the one before until k = 4, the paper's loop bound: 4 per block.
    lm = scripted([1] * 13)
    for variant in ("gs_jacobi", "hybrid"):
        res, its = run(lm, variant)
        assert per_block(its) == [4, 4, 4] and res.target_forwards == 1 + 12
    # jacobi: one block of the 12 positions after the first token, 12 iterations (its bound).
    res, its = run(lm, "jacobi")
    assert per_block(its) == [12] and res.target_forwards == 13
    # sliding: the first forward over pad guesses changes position 1 (pad -> 4), so it commits
    # nothing; from then on each forward leaves exactly the first position unchanged: 1 + 1 + 12.
    res, its = run(lm, "sliding")
    assert res.target_forwards == 14
    assert [e.committed for e in its] == [0] + [1] * 12


def test_independent_tokens_converge_in_one_iteration_and_confirm_in_the_next():
    # Depth 0: the model knows every position. Iteration 1 gets a whole block right, iteration 2
    # repeats it (y^2 = y^1): 2 per block. A Jacobi that stopped after one iteration would take 1.
    lm = scripted([0] * 13)
    res, its = run(lm, "gs_jacobi")
    assert per_block(its) == [2, 2, 2] and res.target_forwards == 1 + 6
    assert [e.committed for e in its] == [0, 4] * 3
    res, its = run(lm, "jacobi")                    # one block of 12 positions: 2 iterations
    assert per_block(its) == [2] and res.target_forwards == 3
    assert its[0].guess == tuple(GREEDY_13[1:]) and its[0].committed == 0 and its[0].converged == 1
    res, its = run(lm, "sliding")                   # per window: change everything, then keep all 4
    assert [e.committed for e in its] == [0, 4] * 3 and res.target_forwards == 7


def test_paper_rule_takes_one_more_iteration_than_all_verified():
    # Depth 0 except the last position of each block (4, 8, 12), which depends on its
    # predecessor. Iteration 1 gets positions 1-3 right, iteration 2 position 4 too: all four
    # outputs are verified at iteration 2 (their inputs 1-3 did not change), which is where the
    # old loop stopped. But y^2 != y^1 at position 4, so the paper's rule runs iteration 3.
    depth = [0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    res, its = run(scripted(depth), "gs_jacobi")
    assert per_block(its) == [3, 3, 3] and res.target_forwards == 1 + 9
    second = [e for e in its if e.iteration == 2]
    assert all(e.converged == 4 and e.committed == 0 for e in second)      # verified, not yet stopped
    assert all(e.committed == 4 for e in its if e.iteration == 3)


def test_eos_hybrid_stops_the_paper_fixed_length_variants_go_on():
    # Depth 0 and EOS at position 6. hybrid (HGJ): blocks 1-4 and 5-8 (2 iterations each), the
    # second holds EOS: stop, 1 + 4 forwards. gs_jacobi (PGJ) decodes the fixed length: block
    # 9-12 too, 1 + 6. jacobi (PJ): one block of 12, 2 iterations. All output 7 tokens.
    tokens = [3, 4, 5, 6, 7, 8, EOS, 10, 11, 12, 13, 14, 3]
    lm = scripted([0] * 13, tokens)
    forwards = {v: run(lm, v)[0].target_forwards for v in VARIANTS}
    assert forwards == {"hybrid": 5, "gs_jacobi": 7, "jacobi": 3, "sliding": 5}
    res, its = run(lm, "jacobi")
    assert res.token_ids == tokens[:7] and res.stop_reason == "eos"
    assert its[-1].committed == 12 and its[-1].guess[5] == EOS          # decoded past EOS, not output


def test_max_iterations_cuts_a_block_to_its_verified_prefix():
    # Chain model, max_iterations 2: a block's 2nd iteration verifies 2 tokens and stops there;
    # the next block starts after them. 12 tokens in 6 blocks of 2 iterations: 1 + 12 forwards.
    lm = scripted([1] * 13)
    res, its = run(lm, "gs_jacobi", max_iterations=2)
    assert res.stats["blocks"] == 6 and per_block(its) == [2] * 6
    assert [e.committed for e in its] == [0, 2] * 6
    res, its = run(lm, "sliding", max_iterations=1)     # every forward: commit verified, new window
    assert all(e.iteration == 1 and e.committed == e.converged for e in its)


def test_rule_helpers():
    assert verified([7, 7, 7], [1, 2, 3]) == 1              # output 0 is always greedy's
    assert verified([1, 2, 9], [1, 2, 3]) == 3              # last input is prev[1]: all verified
    assert unchanged([1, 2, 9], [1, 2, 3]) == 2             # ... but the last position changed
    assert unchanged([1, 2, 3], [1, 2, 3]) == 3


# --------------------------------------------------------------------------- exactness on real models

def _check(lm, ids, n, blocks=(1, 5), inits=INITS, **extra):
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids
    for variant, init, block in itertools.product(VARIANTS, inits, blocks):
        params = JacobiParams(block_size=block, variant=variant, init=init, **extra)
        res = jacobi(ids, ModelPair(lm), params, max_new_tokens=n, rng=make_generator(3))
        assert res.token_ids == ref, (variant, init, block)
        if variant in ("gs_jacobi", "hybrid"):      # the paper's bound: n iterations for n tokens
            assert res.target_forwards <= n
    return ref


@pytest.mark.parametrize("arch", ["llama", "gptneox", "gpt2"])
def test_decoder_only_variants_equal_greedy(arch):
    lm = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    _check(lm, prompt(8, 1), 20)


def test_eos_length_edges_and_max_iterations_fallback():
    lm = tiny_causal("gptneox", seed=1, scale=8.0, dtype=F64)
    ref = _check(lm, prompt(8, 1), 40, blocks=(3, 16))
    assert ref[-1] == EOS and len(ref) < 40                     # this model stops early
    for n in (1, 2, len(ref), len(ref) - 1):                    # limit before, at and after EOS
        _check(lm, prompt(8, 1), n, blocks=(4,), inits=("pad",))
    _check(tiny_causal("llama", seed=0, scale=8.0, dtype=F64), prompt(8, 1), 20, inits=("pad",),
           max_iterations=1)


def test_encoder_decoder_marian_equals_generate_in_full():
    lm = tiny_marian(seed=3, dtype=F64)          # this seed says 6 different tokens, then EOS
    ids = prompt(7, 4) + [2]
    ref = _check(lm, ids, 20)
    t = torch.tensor([ids])
    gen = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=20)[0]
    assert gen[0].item() == lm.decoder_start_token_id
    assert ref == gen[1:].tolist()                      # the whole output, EOS included
    assert ref[-1] == EOS and len(ref) < 20 and len(set(ref)) > 4
    ref_short = _check(lm, ids, 6, blocks=(4,), inits=("pad",))   # the limit before EOS
    assert ref_short == ref[:6]


def test_trace_records_iterations_and_does_not_change_tokens():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    ids = prompt(8, 1)
    for variant in VARIANTS:
        plain = jacobi(ids, ModelPair(lm), JacobiParams(variant=variant), max_new_tokens=20)
        tracer = Tracer()
        traced = jacobi(ids, ModelPair(lm), JacobiParams(variant=variant), max_new_tokens=20, tracer=tracer)
        assert plain.token_ids == traced.token_ids
        its = [e for e in tracer.events if isinstance(e, JacobiIteration)]
        assert its and all(1 <= e.converged <= len(e.guess) and 0 <= e.committed <= e.converged for e in its)
        json.dumps([event_to_dict(e) for e in tracer.events])


def test_traces_draw_in_the_jacobi_view():
    # The scripted EOS run of each variant, drawn: every output token after the prefill's is
    # committed exactly once; cells after EOS are "past"; iteration 1 of the whole-output
    # jacobi already has every token right, but only its first verified: the rest are "early".
    from visualize.iterations import jacobi_view
    tokens = [3, 4, 5, 6, 7, 8, EOS, 10, 11, 12, 13, 14, 3]
    lm = scripted([0] * 13, tokens)
    for variant in VARIANTS:
        tracer = Tracer()
        res = jacobi(PROMPT, ModelPair(lm), JacobiParams(block_size=4, variant=variant), max_new_tokens=13,
                     tracer=tracer)
        doc = {"params": {"variant": variant}, "token_ids": res.token_ids,
               "events": [event_to_dict(e) for e in tracer.events]}
        page = jacobi_view(doc)
        assert page.count("<td data-state='committed'") == len(res.token_ids) - 1 == 6, variant
        # cells after EOS (position 6): hybrid and sliding only in the block/window holding it (2
        # iterations x positions 7-8), gs_jacobi also over block 9-12, jacobi over 7-12 twice
        past = {"hybrid": 2 * 2, "sliding": 2 * 2, "gs_jacobi": 2 * 2 + 2 * 4, "jacobi": 2 * 6}[variant]
        assert page.count("<td data-state='past'") == past, variant
        if variant == "jacobi":
            first = page[page.index("iteration 1</th>"):page.index("iteration 2</th>")]
            assert first.count("data-state='verified'") == 1 and first.count("data-state='early'") == 5


def test_defaults_are_the_papers():
    p = JacobiParams()
    assert (p.variant, p.init) == ("hybrid", "pad")
    assert VARIANTS == ("jacobi", "gs_jacobi", "hybrid", "sliding")


@pytest.mark.parametrize("bad,msg", [({"block_size": -1}, "block_size must be in [0, 64]"),
                                     ({"variant": "x"}, "variant must be one of"),
                                     ({"init": "zeros"}, "init must be one of"),
                                     ({"max_iterations": 0}, "max_iterations must be in")])
def test_params_validation(bad, msg):
    with pytest.raises(ValueError) as err:
        JacobiParams(**bad)
    assert msg in str(err.value)


def test_bundled_model_equals_greedy():
    lm = load_model("smollm2-135m-instruct")
    ids = encode_prompt(lm.tokenizer, "List the days of the week.", chat=True)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24).token_ids
    for variant in VARIANTS:
        res = jacobi(ids, ModelPair(lm), JacobiParams(block_size=6, variant=variant), max_new_tokens=24)
        assert res.token_ids == ref, variant
