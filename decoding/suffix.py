"""The ``suffix`` strategy: suffix decoding (SuffixDecoding, arXiv 2411.04975) in the shared speculative loop.

Drafts come from suffix trees over the prompt and the output so far and, when the caller passes one in
``RunContext.history``, over earlier outputs (``drafting/suffix.py``). The target verifies them in the
same propose -> verify -> accept loop as every drafter (``speculative.speculative_loop``): greedy at
temperature 0 (the tokens are greedy's), recursive rejection sampling with one-hot proposals above
(the target distribution). When the run's history is used, the output is added to it afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .context import EMPTY, RunContext
from .drafting import MAX_DRAFT, MAX_TREE_NODES, DraftLength, make_drafter
from .lm import Session
from .params import SamplingParams, check_bool, check_number
from .result import ModelPair, Result
from .speculative import speculative_loop
from .strategies import Strategy
from .tracer import NULL_TRACER


@dataclass(frozen=True)
class SuffixParams(SamplingParams):
    """Suffix decoding; temperature 0 = greedy verification (lossless).

    A match of ``m`` tokens (the context's last ``m`` tokens occurred before) may draft up to
    ``min(draft_tokens, m * spec_factor + spec_offset)`` tokens. ``min_token_prob``: stop a path
    when the empirical probability of reaching its next token is below it. ``tree``: draft a tree
    of the ``tree_nodes`` most probable continuations (a chain of the most frequent one otherwise;
    models without custom 4D mask support always get chains). ``max_depth``: the longest match
    the suffix trees index. ``history``: also draft from earlier outputs when the run has a
    history (``RunContext.history``), and add this output to it. ``history_min_match``: the
    shortest match in the history that may draft (a match of a token or two into unrelated
    earlier text mostly widens the verify forward). ``edit_tokens``: follow the copied text across
    small edits: when the target cuts a copy short (a renamed variable, an added word), the next
    drafts also hold up to ``edit_tokens`` tokens of that text from just after the rejected token
    (the target replaced it) and from the rejected token itself (the target inserted text before
    it), match or not; 0 turns this off. The defaults come from deterministic sweeps on the six
    input-grounded benchmark prompts (BENCHMARKS.md).
    """
    temperature: float = 0.0
    draft_tokens: int = 16
    spec_factor: float = 4.0        # 1 -> 4: 1.77 -> 2.05 tokens per target forward on the grounded prompts
    spec_offset: float = 0.0
    min_token_prob: float = 0.1
    tree: bool = True
    tree_nodes: int = 16            # 12 -> 16 with edit following: 2.14 -> 2.18 tokens/forward (SmolLM2), 3.29 -> 3.83 (Gemma 3)
    max_depth: int = 32
    history: bool = True
    history_min_match: int = 1
    edit_tokens: int = 16           # 0 -> 16: 2.07 -> 2.18 tokens/forward (SmolLM2), 3.02 -> 3.83 (Gemma 3)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_number("spec_factor", self.spec_factor, 0.0, 16.0)
        check_number("spec_offset", self.spec_offset, -16.0, float(MAX_DRAFT))
        check_number("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_bool("tree", self.tree)
        check_number("tree_nodes", self.tree_nodes, 1, MAX_TREE_NODES, integer=True)
        check_number("max_depth", self.max_depth, 2, 256, integer=True)
        check_bool("history", self.history)
        check_number("history_min_match", self.history_min_match, 1, 256, integer=True)
        check_number("edit_tokens", self.edit_tokens, 0, MAX_DRAFT, integer=True)
        if self.spec_factor == 0 and self.spec_offset < 1:
            raise ValueError("spec_factor 0 with spec_offset below 1 never drafts: raise spec_factor "
                             f"(in [0, 16]) or spec_offset (in [-16, {MAX_DRAFT}])")


def suffix(prompt_ids: Sequence[int], pair: ModelPair, params: SuffixParams, *, max_new_tokens: int,
           tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
           context: Optional[RunContext] = None) -> Result:
    context = context or EMPTY
    max_len = len(prompt_ids) + max_new_tokens + MAX_TREE_NODES + 1
    target = Session(pair.target, "target", tracer, fast=params.fast, max_len=max_len)
    drafter = make_drafter("suffix", pair, params, tracer=tracer, clock=lambda: target.forwards + 1,
                           context=context)
    result = speculative_loop(prompt_ids, pair, params, drafter, DraftLength(params.draft_tokens, False),
                              max_new_tokens=max_new_tokens, tracer=tracer, target=target, rng=rng,
                              context=context)
    result.stats["accepted_from"] = dict(drafter.accepted_from)
    result.stats["tree"] = drafter.tree_mode
    if drafter.history is not None:
        drafter.history.add(result.token_ids)
    return result


STRATEGIES = [
    Strategy("suffix", SuffixParams, suffix, lossless=True, label="Suffix decoding",
             description="Drafts the most frequent continuations of the longest earlier matches in the prompt, "
                         "the output and earlier outputs (suffix trees); the target verifies them in one forward."),
]
