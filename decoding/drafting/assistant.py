"""An assistant (draft) model with the target's vocabulary, drafting a chain or a tree with its own KV cache.

Chain: one assistant forward per drafted token, stopping early when its top
probability is below ``confidence_threshold``. Tree (``tree=true``): an EAGLE-2
dynamic tree (``drafting/dynamic.py``), one assistant forward per depth over the
``tree_topk`` most probable nodes, each attending to the context and its own
ancestors through a 4D mask (the assistant must honour one). The draft cache
holds the context afterwards; ``feedback`` crops it to what the target committed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.dynamic import Growth, grow, visible_ancestors
from decoding.params import SpeculativeParams
from decoding.runtime.attention import attention_mask, check_mask_support
from decoding.runtime.session import Session
from decoding.sampling import probs as filtered_probs
from decoding.tracer import NULL_TRACER


def check_vocabularies(target: Any, assistant: Any) -> None:
    """Raise ``ValueError`` unless both models share one tokenizer (same-vocabulary speculative decoding)."""
    if target.vocab_size != assistant.vocab_size:
        raise ValueError(f"target and assistant vocabularies differ ({target.vocab_size} vs "
                         f"{assistant.vocab_size} tokens); speculative decoding needs a shared tokenizer")
    tt, ta = target.tokenizer, assistant.tokenizer
    if tt is not None and ta is not None and tt is not ta and tt.get_vocab() != ta.get_vocab():
        raise ValueError("target and assistant tokenizers differ; speculative decoding needs a shared tokenizer")


class AssistantDrafter(Drafter):
    source = "assistant"

    def __init__(self, assistant: Any, params: SpeculativeParams, tracer: Any = NULL_TRACER, clock: Any = None,
                 rng: Optional[torch.Generator] = None, max_len: Optional[int] = None) -> None:
        super().__init__()
        self.session = Session(assistant, "draft", tracer, clock=clock, fast=params.fast and not params.tree,
                               max_len=max_len)
        self.lm, self.params, self.rng = assistant, params, rng
        self.cached: list[int] = []   # the tokens whose keys/values sit in the draft cache
        if params.tree:
            check_mask_support(assistant)

    @property
    def forwards(self) -> int:          # the session counts the assistant's forwards
        return self.session.forwards

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.cached = []
        self._base = 0

    def _logits_for(self, context: Sequence[int]) -> torch.Tensor:
        """Bring the draft cache up to ``context``; next-token logits ``[V]``."""
        if not self.cached:
            self.cached = list(context)
            return self.session.prefill(context)[0]
        common = 0
        limit = min(len(self.cached), len(context) - 1)   # feed at least one token
        while common < limit and self.cached[common] == context[common]:
            common += 1
        self.session.crop(common)
        new = list(context[common:])
        self.cached = list(context)
        return self.session.forward(self.session.tensor([new]), last_only=True, kind="draft")[0, -1]

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        logits = self._logits_for(context)
        self._base = len(context)
        if self.params.tree:
            return self._tree(logits, len(context), k)
        return self._chain(logits, k)

    def feedback(self, proposal: Proposal, accepted: Sequence[int]) -> None:
        """Drop the drafted tokens the target rejected from the draft cache (the accepted ones stay)."""
        keep = self._base
        for tok in accepted:
            if keep >= len(self.cached) or self.cached[keep] != tok:
                break
            keep += 1
        if keep < len(self.cached):
            self.session.crop(keep)
            self.cached = self.cached[:keep]

    def _chain(self, logits: torch.Tensor, k: int) -> Proposal:
        greedy, threshold = self.params.is_greedy, self.params.confidence_threshold
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        for _ in range(k):
            # 1. the draft distribution (filtered like the target's) and a token from it
            raw = logits.softmax(-1)
            if tokens and threshold and float(raw.max()) < threshold:
                break                     # an unsure assistant stops early
            if greedy:
                token = int(raw.argmax())
                q_token.append(float(raw[token]))
            else:
                q = filtered_probs(logits, self.params)
                token = int(torch.multinomial(q, 1, generator=self.rng))
                q_rows.append(q)
                q_token.append(float(q[token]))
            tokens.append(token)
            if len(tokens) == k:
                break
            # 2. extend the draft cache by the drafted token
            self.cached.append(token)
            logits = self.session.forward(self.session.tensor([[token]]), last_only=True, kind="draft")[0, -1]
        return Proposal.chain(tokens, torch.stack(q_rows) if q_rows else None, q_token)

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        if self.params.is_greedy:
            return logits.float().log_softmax(-1)
        return filtered_probs(logits, self.params).log()

    def _tree(self, logits: torch.Tensor, prefix: int, depth: int) -> Proposal:
        s = self.session
        slots: dict[int, int] = {}
        positions: list[int] = []          # absolute position of each fed draft node, in feeding order

        def expand(g: Growth, nodes: list[int]) -> torch.Tensor:
            fed = len(slots)
            pos = torch.tensor([prefix - 1 + g.depths[e] for e in nodes])               # [K]
            allowed = torch.zeros(len(nodes), prefix + fed + len(nodes), dtype=torch.bool)
            allowed[:, :prefix] = True
            if fed:
                allowed[:, prefix:prefix + fed] = visible_ancestors(g, nodes, slots, fed)
            allowed[:, prefix + fed:] = torch.eye(len(nodes), dtype=torch.bool)
            keys = torch.tensor(list(range(prefix)) + positions + pos.tolist())
            mask = attention_mask(self.lm, allowed, pos, prefix + fed, key_positions=keys)
            out = s.forward(s.tensor([[g.tokens[e] for e in nodes]]), position_ids=pos[None].to(self.lm.device),
                            attention_mask=mask, kind="draft")[0]                         # [K, V]
            for e, p in zip(nodes, pos.tolist()):
                slots[e] = len(slots)
                positions.append(p)
            return self._rows(out)

        par = self.params
        topk, nodes = par.tree_shape(self.lm.device)
        proposal = grow(self._rows(logits), expand, depth=depth, topk=topk, budget=nodes,
                        threshold=par.confidence_threshold, sample=not par.is_greedy, rng=self.rng,
                        vocab=self.lm.vocab_size)
        s.crop(prefix)                    # the draft cache holds the context again
        self.cached = self.cached[:prefix]
        return proposal
