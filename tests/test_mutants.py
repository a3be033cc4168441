"""Tests that fail on the small bugs a mutation pass found alive (issue #18).

* Prompt lookup that never drafts passed every exactness test: its tokens equal
  greedy's either way. Here it must draft, get drafts accepted, and need fewer
  target forwards than greedy on output that repeats itself.
* The rejection-sampling unit test drafted as many tokens as the output had left,
  so the bonus token (drawn from the target after a fully accepted draft) was
  always cut off. Here drafts stop one short, so the bonus is the last output
  token; a bonus drawn from the wrong target row must fail the same test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_speculative import _chi_square, _passes

from decoding.params import GreedyParams
from decoding.runtime.pair import ModelPair
from decoding.strategies import registry
from decoding.strategies.baselines import greedy
from decoding.tracer import Tracer
from decoding.verify import verify_sampling

from tiny_models import ARCHS, prompt, tiny_causal


def _repeats(tokens: list[int], n: int = 3) -> bool:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


def _prompt_lookup(prompt_ids: list[int], pair: ModelPair, max_new: int) -> tuple:
    strategy = registry()["prompt_lookup"]
    tracer = Tracer()
    res = strategy.generate(prompt_ids, pair, strategy.parse({}), max_new_tokens=max_new, tracer=tracer, rng=None)
    names = [type(e).__name__ for e in tracer.events]
    accepted = sum(1 for e in tracer.events if type(e).__name__ == "TokenCommitted" and e.source == "accepted")
    return res, names.count("DraftProposed"), accepted


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_lookup_drafts_and_saves_target_forwards_on_repeating_output(arch):
    pair = ModelPair(tiny_causal(arch, seed=0, scale=8.0, eos=False))
    ids = prompt(8)
    ref = greedy(ids, pair, GreedyParams(), max_new_tokens=40)
    assert _repeats(ref.token_ids), "precondition: this tiny model's greedy output must repeat itself"
    res, drafts, accepted = _prompt_lookup(ids, pair, 40)
    assert res.token_ids == ref.token_ids
    assert drafts > 0 and accepted > 0
    assert res.target_forwards < ref.target_forwards == 40
    assert res.target_forwards + accepted >= len(res.token_ids)    # each forward commits 1 + what it accepted


@pytest.mark.bundled
def test_prompt_lookup_copies_a_list_on_the_bundled_model():
    from decoding.harness.runner import encode_prompt
    from decoding.runtime.models import load_model
    lm = load_model("smollm2-135m-instruct")
    ids = encode_prompt(lm.tokenizer, "Repeat this list exactly, once: apple, banana, cherry, damson, elderberry, "
                                      "fig, grape, honeydew, kiwi, lemon, mango.", chat=True)
    pair = ModelPair(lm)
    ref = greedy(ids, pair, GreedyParams(), max_new_tokens=24)
    res, drafts, accepted = _prompt_lookup(ids, pair, 24)
    assert res.token_ids == ref.token_ids
    assert drafts > 0 and accepted >= 8 and res.target_forwards <= ref.target_forwards - 8


# --------------------------------------------------------------------------- the bonus token

def _simulate(p: torch.Tensor, q: torch.Tensor, n_out: int, samples: int, seed: int,
              bonus_row_offset: int = 0) -> tuple[dict, int]:
    """verify_sampling on history-independent rows, each draft one token short of the output's end.

    Returns (counts of n_out-token outputs, how many verify steps ended in a bonus token).
    ``bonus_row_offset = -1`` hands the verifier the wrong row for the bonus (the negative control).
    """
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    bonuses = 0
    for _ in range(samples):
        out: list[int] = []
        while len(out) < n_out:
            i0 = len(out)
            kk = max(n_out - 1 - i0, 0)                       # the bonus, if any, is the last output token
            qs = q[i0:i0 + kk]
            draft = [int(torch.multinomial(row, 1, generator=gen)) for row in qs]
            rows = p[i0:i0 + kk + 1].clone()                  # [kk + 1, V]: row kk is the bonus row
            if kk:
                rows[kk] = p[i0 + kk + bonus_row_offset]
            v = verify_sampling(rows, qs, draft, gen)
            bonuses += bool(kk) and v.n_accepted == kk
            out += draft[:v.n_accepted] + [v.next_token]
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts, bonuses


def test_bonus_token_is_drawn_from_the_target_row_after_the_draft():
    torch.manual_seed(0)
    V, n_out, n = 4, 3, 12000
    p = torch.softmax(torch.randn(n_out, V) * 1.5, -1)
    q = torch.softmax(p.log() + 0.5 * torch.randn(n_out, V), -1)   # a decent drafter: many full acceptances
    exact = {seq: float(p[0, seq[0]] * p[1, seq[1]] * p[2, seq[2]])
             for seq in itertools.product(range(V), repeat=n_out)}
    counts, bonuses = _simulate(p, q, n_out, n, seed=1)
    assert bonuses > n // 4, "the bonus path must be sampled often for this test to see it"
    stat, dof = _chi_square(counts, exact, n)
    assert _passes(stat, dof), (stat, dof)
    wrong, _ = _simulate(p, q, n_out, n, seed=1, bonus_row_offset=-1)     # bonus from the previous row
    stat_wrong, _ = _chi_square(wrong, exact, n)
    assert not _passes(stat_wrong, dof), (stat_wrong, dof)
