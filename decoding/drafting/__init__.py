"""Drafters for the propose -> verify -> accept loop, behind one contract (``base.Drafter``).

One module per drafter: ``assistant`` (a draft model with the target's
tokenizer), ``lookup`` (prompt lookup), ``prophet`` (the target's trained head).
``make_drafter`` builds the drafter a strategy needs from a model pair; the loop
never asks which one it got.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..tracer import NULL_TRACER
from .base import MAX_DRAFT, MAX_TREE_NODES, Drafter, DraftLength, Proposal

__all__ = ["Drafter", "DraftLength", "Proposal", "MAX_DRAFT", "MAX_TREE_NODES", "make_drafter"]


def make_drafter(kind: str, pair: Any, params: Any, *, tracer: Any = NULL_TRACER, clock: Any = None,
                 rng: Optional[torch.Generator] = None, max_len: Optional[int] = None,
                 context: Any = None) -> Drafter:
    """The drafter for strategy ``kind`` on ``pair`` (``context``: the run's ``RunContext``, e.g. its history).

    * ``prompt_lookup``: n-gram lookup in the context;
    * ``prophet``: the target's prophet head (``pair.prophet``, else the shipped one), its trees merged
      with a prompt-lookup branch (``lookup``, greedy only: ``merged.py``);
    * ``speculative``: the assistant model, or the prophet head when the pair has no assistant.
    """
    if kind == "prompt_lookup":
        from .lookup import PromptLookupDrafter
        return PromptLookupDrafter(params)
    if kind == "prophet" or (kind == "speculative" and pair.assistant is None and pair.prophet is not None):
        from ..prophet import prophet_for
        from .prophet import ProphetDrafter
        if pair.target.is_encoder_decoder:
            raise ValueError("the prophet head drafts for decoder-only targets")
        head = pair.prophet if pair.prophet is not None else prophet_for(pair.target)
        drafter = ProphetDrafter(head, params, tracer=tracer, clock=clock, rng=rng)
        if kind == "prophet" and params.tree and params.lookup:   # a prompt-lookup branch in the tree
            from .merged import with_lookup
            return with_lookup(drafter, params)
        return drafter
    if kind == "speculative":
        if pair.assistant is None:
            raise ValueError("strategy 'speculative' needs an assistant model (or the prophet head)")
        from .assistant import AssistantDrafter, check_vocabularies
        check_vocabularies(pair.target, pair.assistant)
        return AssistantDrafter(pair.assistant, params, tracer, clock, rng, max_len=max_len)
    raise ValueError(f"no drafter for strategy {kind!r}")
