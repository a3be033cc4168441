"""A drafter whose tree also holds the continuations of model-free drafters (greedy verification only).

A model drafter is weakest where a model-free one is strongest: a prophet head
has little answer to attend to at the start of a reply, which is just where
replies restate the prompt, and it drafts only a few tokens deep, where a
copied line of code runs on for many. ``MergedDrafter`` runs its primary
drafter and its extras (prompt lookup, suffix) on the same context and merges
every path into one token tree (``TokenTree.from_paths``, the primary's paths
first). Extra branches cost a few verify positions and no model forward.
ArcticInference pairs suffix decoding with EAGLE drafts in the same spirit.

Greedy verification accepts whichever branch matches the target's argmax, so
the output stays greedy's. Under sampling the merge is skipped and the primary's
proposal goes through alone: its siblings were drawn from its own q, and
deterministic candidates among them would break the recursive rejection
sampling that keeps the target distribution.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.lookup import PromptLookupDrafter
from decoding.drafting.suffix import SuffixDrafter
from decoding.params import PromptLookupParams, ProphetParams, SuffixParams
from decoding.tree import TokenTree


def _paths(tree: TokenTree) -> list[list[int]]:
    """Root-to-leaf token paths of ``tree``, leaves in node order."""
    return [[tree.tokens[j] for j in tree.path(i)] for i in range(len(tree)) if not tree.children(i)]


class MergedDrafter(Drafter):
    """``primary`` plus model-free ``extras`` merged into one tree (greedy); the primary alone when sampling.

    ``extra_depth``: how many tokens the extras may propose (None: as many as the primary, ``k``).
    """

    def __init__(self, primary: Drafter, extras: Sequence[Drafter], greedy: bool,
                 extra_depth: Optional[int] = None) -> None:
        super().__init__()
        self.primary, self.extras, self.greedy, self.extra_depth = primary, list(extras), greedy, extra_depth
        self._own: list[Proposal] = []          # this step's proposal of each drafter, primary first
        self.source = primary.source
        self.accepted_source = primary.accepted_source
        self.needs_hidden = primary.needs_hidden
        self.hidden_layers = primary.hidden_layers

    @property
    def forwards(self) -> int:
        return self.primary.forwards

    def begin(self, prompt_ids: Sequence[int]) -> None:
        for d in [self.primary] + self.extras:
            d.begin(prompt_ids)

    def observe(self, hidden: torch.Tensor, tokens: Sequence[int]) -> None:
        self.primary.observe(hidden, tokens)

    def finish(self, output: Sequence[int]) -> None:
        for d in [self.primary] + self.extras:
            d.finish(output)

    def stats(self) -> dict:
        return self.primary.stats()

    def feedback(self, proposal: Proposal, accepted: Sequence[int]) -> None:
        """Each drafter hears about its own proposal (a suffix drafter follows its copy along the committed
        tokens; it would misread the merged tree's other branches as its copy cut short)."""
        own = self._own or [proposal] + [Proposal.empty()] * len(self.extras)
        for d, p in zip([self.primary] + self.extras, own):
            d.feedback(p, accepted)
        self._own = []

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        main = self.primary.propose(context, k)
        self._own = [main] + [Proposal.empty()] * len(self.extras)
        if not self.greedy:
            return main
        paths = _paths(main.tree)
        for i, extra in enumerate(self.extras, 1):
            self._own[i] = extra.propose(context, self.extra_depth or k)
            paths += _paths(self._own[i].tree)
        merged = TokenTree.from_paths(paths)
        if len(merged) == len(main.tree):
            return main                               # nothing new: keep the primary's q and order
        q_token = [_q_of(main, merged, i) for i in range(len(merged))]
        return Proposal(merged, None, q_token)


def _q_of(main: Proposal, merged: TokenTree, node: int) -> float:
    """q_draft of ``node``'s token if the primary drafted that path, else 1.0 (a copied token)."""
    at = -1
    for j in merged.path(node):
        at = main.tree.child_with(at, merged.tokens[j])
        if at is None:
            return 1.0
    return main.q_token[at] if at < len(main.q_token) else 1.0


def with_lookup(primary: Drafter, params: ProphetParams) -> Drafter:
    """``primary`` with a copy branch of up to ``params.lookup_tokens`` tokens merged into its tree: suffix
    decoding over this generation's prompt and output (no history of other runs), or n-gram prompt lookup
    (``params.lookup_source``)."""
    n = params.lookup_tokens
    if params.lookup_source == "prompt":
        # any match, a single token's too: a copy branch rides on the head's verify forward, it adds no step
        extra: Drafter = PromptLookupDrafter(PromptLookupParams(draft_tokens=n, min_ngram=1))
    else:
        extra = SuffixDrafter(SuffixParams(draft_tokens=n, tree=False, history=False, edit_tokens=0), history=None,
                              tree=False)
    return MergedDrafter(primary, [extra], greedy=params.is_greedy, extra_depth=n)
