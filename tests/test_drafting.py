"""The drafter contract: what the loop gives a drafter (hidden rows, feedback) and what it reads back."""

from __future__ import annotations

import pytest
import torch

from decoding.drafting import Drafter, DraftLength, Proposal, make_drafter
from decoding.params import GreedyParams, PromptLookupParams, SpeculativeParams
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies.baselines import greedy
from decoding.strategies.speculative import speculative_loop
from decoding.tree import TokenTree

from tiny_models import prompt, tiny_causal

F64 = torch.float64


class ScriptedDrafter(Drafter):
    """Drafts a fixed two-branch tree (or chain) from a reference continuation; records every call."""

    source = "scripted"
    needs_hidden = True

    def __init__(self, reference: list[int], prompt_len: int, tree: bool, wrong_first: bool = False) -> None:
        super().__init__()
        self.reference, self.prompt_len, self.tree, self.wrong_first = reference, prompt_len, tree, wrong_first
        self.observed: list[tuple[torch.Tensor, list[int]]] = []
        self.feedbacks: list[list[int]] = []
        self.begun = 0

    def begin(self, prompt_ids):
        self.begun += 1

    def observe(self, hidden, tokens):
        self.observed.append((hidden.clone(), list(tokens)))

    def propose(self, context, k):
        done = len(context) - self.prompt_len
        right = self.reference[done:done + k]
        if not right:
            return Proposal.empty()
        wrong = [(t + 1) % 90 + 3 for t in right]
        if not self.tree:
            return Proposal.chain(right)
        # two branches below the root: a wrong one first, then the right one (so the path is not contiguous)
        paths = [wrong[:2], right] if self.wrong_first else [right, wrong[:2]]
        return Proposal(TokenTree.from_paths(paths))

    def feedback(self, proposal, accepted):
        self.feedbacks.append(list(accepted))


def _hidden_states(lm, ids):
    with torch.no_grad():
        return lm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]   # [T, H]


@pytest.mark.parametrize("tree,wrong_first", [(False, False), (True, False), (True, True)])
def test_the_loop_gives_observe_the_rows_that_predicted_each_committed_token(tree, wrong_first):
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    ids = prompt(8, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=20).token_ids
    drafter = ScriptedDrafter(ref, len(ids), tree, wrong_first)
    res = speculative_loop(ids, ModelPair(lm), SpeculativeParams(), drafter, DraftLength(4, False),
                           max_new_tokens=20)
    assert res.token_ids == ref and drafter.begun == 1
    assert res.target_forwards < len(ref)                   # the right branch was accepted, several at a time
    # every committed token arrives exactly once, with the target state that predicted it
    tokens = [t for _, toks in drafter.observed for t in toks]
    assert tokens[:len(ref)] == ref
    want = _hidden_states(lm, ids + ref)                   # row P - 1 + i predicted ref[i]
    got = torch.cat([h for h, _ in drafter.observed])[:len(ref)]
    torch.testing.assert_close(got, want[len(ids) - 1:len(ids) - 1 + len(ref)], rtol=1e-9, atol=1e-9)
    # feedback carries the committed tokens themselves, in order
    assert [t for fb in drafter.feedbacks for t in fb] == ref[1:]


def test_make_drafter_picks_by_strategy_and_explains_what_is_missing():
    lm = tiny_causal("llama", seed=0)
    assert make_drafter("prompt_lookup", ModelPair(lm), PromptLookupParams()).source == "prompt_lookup"
    assert make_drafter("speculative", ModelPair(lm, lm), SpeculativeParams()).source == "assistant"
    with pytest.raises(ValueError, match="needs an assistant model"):
        make_drafter("speculative", ModelPair(lm), SpeculativeParams())
    with pytest.raises(ValueError, match="no prophet head is shipped"):
        make_drafter("prophet", ModelPair(lm), SpeculativeParams())
    with pytest.raises(ValueError, match="no drafter for strategy"):
        make_drafter("beam", ModelPair(lm), SpeculativeParams())


def test_draft_length_adapts_both_ways_within_bounds():
    length = DraftLength(4, adaptive=True, cap=8)
    length.update(4, 4)
    assert length.k == 6                          # fully accepted: +2
    length.update(6, 6)
    length.update(8, 8)
    assert length.k == 8                          # capped
    for _ in range(10):
        length.update(length.k, 0)
    assert length.k == 1                          # a rejection shrinks it, never below 1
    length.update(0, 0)
    assert length.k == 1                          # an empty draft says nothing
    fixed = DraftLength(4, adaptive=False)
    fixed.update(4, 4)
    fixed.update(4, 0)
    assert fixed.k == 4


def test_drafting_time_is_counted_for_model_free_drafters_too():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    ids = prompt(6, 2) * 3
    drafter = make_drafter("prompt_lookup", ModelPair(lm), PromptLookupParams())
    res = speculative_loop(ids, ModelPair(lm), PromptLookupParams(), drafter, DraftLength(8, False),
                           max_new_tokens=24)
    # one proposal a step, but for a last step with no room left for a draft
    assert drafter.forwards == 0 and res.stats["steps"] - 1 <= drafter.proposals <= res.stats["steps"]
    assert drafter.proposals > 0
    assert drafter.ms > 0 and res.stats["cost_ratio"] > 0 and res.stats["draft_ms_per_step"] > 0


def test_proposal_limited_keeps_q_rows_with_their_nodes():
    tree = TokenTree.from_paths([(1, 2, 3), (4, 5)])
    q = torch.arange(len(tree), dtype=torch.float32)[:, None].repeat(1, 3)
    p = Proposal(tree, q, [0.1 * i for i in range(len(tree))])
    short = p.limited(2)
    assert short.tree.depth == 2 and len(short) == 4
    assert short.q[:, 0].tolist() == [float(tree.tokens.index(t)) for t in short.tree.tokens]
    assert p.limited(5) is p


def test_a_session_keeps_hidden_rows_for_a_tree_forward():
    lm = tiny_causal("gpt2", seed=1, dtype=F64)
    s = Session(lm)
    s.prefill(prompt(5, 3))
    from decoding.runtime.attention import tree_forward
    tree = TokenTree.from_paths([(7, 8), (9,)])
    logits = tree_forward(s, [4], tree, hidden=True)
    assert logits.shape[0] == 4 and s.last_hidden.shape[1] == 4


def test_tree_shape_defaults_depend_on_the_device_and_explicit_values_win():
    from decoding.params import TREE_DEFAULTS
    auto = SpeculativeParams(tree=True)
    assert auto.tree_shape(torch.device("cpu")) == TREE_DEFAULTS["cpu"]
    assert auto.tree_shape("cuda") == TREE_DEFAULTS["cuda"] != TREE_DEFAULTS["cpu"]
    assert SpeculativeParams(tree=True, tree_topk=2, tree_nodes=5).tree_shape("cuda") == (2, 5)
    with pytest.raises(ValueError, match="tree_nodes must be in"):
        SpeculativeParams(tree_nodes=65)


def test_merged_drafter_unions_branches_when_greedy_and_steps_aside_when_sampling():
    from decoding.drafting.merged import MergedDrafter

    class Fixed(Drafter):
        def __init__(self, proposal):
            super().__init__()
            self.proposal = proposal

        def propose(self, context, k):
            return self.proposal
    main = Proposal(TokenTree.from_paths([(5, 6), (7,)]), None, [0.5, 0.4, 0.3])
    extra = Proposal.chain([5, 9, 10])
    merged = MergedDrafter(Fixed(main), [Fixed(extra)], greedy=True).propose([1, 2], 3)
    assert sorted(tuple(merged.tree.tokens[j] for j in merged.tree.path(i)) for i in range(len(merged.tree))
                  if not merged.tree.children(i)) == [(5, 6), (5, 9, 10), (7,)]
    q = {tuple(merged.tree.tokens[j] for j in merged.tree.path(i)): merged.q_token[i] for i in range(len(merged.tree))}
    assert q[(5,)] == 0.5 and q[(5, 6)] == 0.4 and q[(7,)] == 0.3 and q[(5, 9)] == 1.0
    sampling = MergedDrafter(Fixed(main), [Fixed(extra)], greedy=False)
    assert sampling.propose([1, 2], 3) is main
    assert MergedDrafter(Fixed(main), [Fixed(Proposal.chain([7]))], greedy=True).propose([1], 3) is main


def test_merged_drafter_gives_each_drafter_feedback_on_its_own_proposal():
    from decoding.drafting.merged import MergedDrafter

    class Fixed(Drafter):
        def __init__(self, proposal):
            super().__init__()
            self.proposal, self.heard = proposal, []

        def propose(self, context, k):
            return self.proposal

        def feedback(self, proposal, accepted):
            self.heard.append((proposal, list(accepted)))

    main, copy = Proposal(TokenTree.from_paths([(5, 6), (7,)]), None, [0.5, 0.4, 0.3]), Proposal.chain([5, 9, 10])
    head, extra = Fixed(main), Fixed(copy)
    merged_drafter = MergedDrafter(head, [extra], greedy=True)
    merged = merged_drafter.propose([1, 2], 3)
    merged_drafter.feedback(merged, [5, 9, 4])
    assert head.heard == [(main, [5, 9, 4])] and extra.heard == [(copy, [5, 9, 4])]
    sampling = MergedDrafter(head, [extra], greedy=False)      # the extras drafted nothing this step
    sampling.feedback(sampling.propose([1, 2], 3), [7, 3])
    assert extra.heard[-1][0].tree.tokens == () and head.heard[-1] == (main, [7, 3])


def test_speculative_without_an_assistant_drafts_with_the_prophet_head_by_its_own_choice():
    """The policy lives in the strategy: a pair with no assistant model but a prophet head asks make_drafter for
    the head; make_drafter itself refuses 'speculative' without an assistant."""
    from test_prophet import random_prophet

    from decoding.drafting.prophet import ProphetDrafter
    from decoding.strategies.speculative import speculative
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float64)
    pair = ModelPair(lm, prophet=random_prophet(lm, 1))
    with pytest.raises(ValueError, match="assistant"):
        make_drafter("speculative", pair, SpeculativeParams())
    assert isinstance(make_drafter("head", pair, SpeculativeParams()), ProphetDrafter)
    ids = prompt(7, 1)
    result = speculative(ids, pair, SpeculativeParams(draft_tokens=3), max_new_tokens=20)
    assert result.token_ids == greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=20).token_ids
    assert result.stats.get("drafted_nodes", 0) > 0
