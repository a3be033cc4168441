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
from decoding.params import SuffixParams
from decoding.result import Result
from decoding.runtime.pair import ModelPair
from decoding.strategies.speculative import run_drafted
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER


def suffix(prompt_ids: Sequence[int], pair: ModelPair, params: SuffixParams, *, max_new_tokens: int,
           tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
           context: Optional[RunContext] = None) -> Result:
    return run_drafted("suffix", prompt_ids, pair, params, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                       adaptive=False, context=context or EMPTY)


STRATEGIES = [
    Strategy("suffix", SuffixParams, suffix, lossless=True, label="Suffix decoding",
             description="Drafts the most frequent continuations of the longest earlier matches in the prompt, "
                         "the output and earlier outputs (suffix trees); the target verifies them in one forward."),
]
