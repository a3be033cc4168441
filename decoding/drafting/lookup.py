"""Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``): copy what followed the last n-gram.

Model-free and deterministic (q_draft is one-hot on each drafted token): the
latest earlier occurrence of the context's last ``ngram_size`` tokens (falling
back to shorter n-grams) proposes the tokens that followed it.
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import Drafter, Proposal


class PromptLookupDrafter(Drafter):
    source = "prompt_lookup"

    def __init__(self, params: Any) -> None:
        super().__init__()
        self.params = params

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        context = list(context)
        L = len(context)
        for n in range(min(self.params.ngram_size, L - 1), 0, -1):
            tail = context[L - n:]
            # latest earlier occurrence whose continuation is non-empty
            for start in range(L - n - 1, -1, -1):
                if context[start:start + n] == tail:
                    follow = context[start + n:start + n + k]
                    if follow:
                        return Proposal.chain(follow, origins=[("context", start + n + i) for i in range(len(follow))])
        return Proposal.empty()
