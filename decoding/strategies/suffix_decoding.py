"""The ``suffix`` strategy: suffix decoding (SuffixDecoding, arXiv 2411.04975) in the shared speculative loop.

Drafts come from suffix trees over the prompt and the output so far and, when the caller passes one in
``RunContext.history``, over earlier outputs (``drafting/suffix.py``). The target verifies them in the
same propose -> verify -> accept loop as every drafter (``speculative.speculative_loop``): greedy at
temperature 0 (the tokens are greedy's), recursive rejection sampling with one-hot proposals above
(the target distribution). When the run's history is used, the output is added to it afterwards.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from decoding.context import EMPTY, RunContext
from decoding.drafting import DraftLength, make_drafter
from decoding.params import MAX_TREE_NODES, SuffixParams
from decoding.result import Result
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies.base import Strategy
from decoding.strategies.speculative import speculative_loop
from decoding.tracer import NULL_TRACER


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
