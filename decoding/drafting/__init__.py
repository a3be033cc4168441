"""Drafters for the propose -> verify -> accept loop, behind one contract (``base.Drafter``).

One module per drafter: ``assistant`` (a draft model with the target's
tokenizer), ``lookup`` (prompt lookup), ``prophet`` (the target's trained head).
``make_drafter`` builds the drafter a strategy needs from a model pair; the loop
never asks which one it got.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from decoding.drafting.assistant import AssistantDrafter, check_vocabularies
from decoding.drafting.base import Drafter, DraftLength, Proposal
from decoding.drafting.lookup import PromptLookupDrafter
from decoding.drafting.merged import with_lookup
from decoding.drafting.prophet import ProphetDrafter
from decoding.drafting.selfdraft import SelfDrafter
from decoding.drafting.suffix import SuffixDrafter, SuffixHistory
from decoding.drafting.universal import UniversalDrafter, shares_tokenizer
from decoding.params import MAX_DRAFT, MAX_TREE_NODES
from decoding.runtime.attention import supports_trees
from decoding.runtime.forward_cost import forward_cost
from decoding.runtime.head import prophet_for
from decoding.tracer import NULL_TRACER

__all__ = ["Drafter", "DraftLength", "Proposal", "MAX_DRAFT", "MAX_TREE_NODES", "make_drafter"]


def make_drafter(kind: str, pair: Any, params: Any, *, tracer: Any = NULL_TRACER, clock: Any = None,
                 rng: Optional[torch.Generator] = None, max_len: Optional[int] = None,
                 context: Any = None, target: Any = None) -> Drafter:
    """The drafter for strategy ``kind`` on ``pair`` (``context``: the run's ``RunContext``, e.g. its history).

    * ``prompt_lookup``: n-gram lookup in the context;
    * ``suffix``: suffix trees over the context and the run's history (``context.history``, when
      ``params.history``);
    * ``prophet``: the target's prophet head (``pair.prophet``, else the shipped one), its trees (or its chain,
      where the target verifies trees) merged with a copy branch (``lookup``: suffix decoding over this prompt
      and output, or prompt lookup; greedy only: ``merged.py``); with ``budget="measured"``, the target's
      verify-forward cost curve (``runtime/forward_cost.py``, timed at its first use, kept on it);
    * ``head``: the prophet head alone, with no copy branch (what ``speculative`` drafts with when the pair has
      no assistant model; that choice is the strategy's, ``strategies/speculative.py``);
    * ``speculative``: the assistant model (``universal`` when its tokenizer is not the target's);
    * ``self``: the target's own first layers or all but a skipped set (``selfdraft``), drafting on ``target``,
      the run's target session (its KV cache).
    """
    if kind == "prompt_lookup":
        tree = params.max_candidates > 1 and _trees_ok(pair)
        return PromptLookupDrafter(params, tree=tree, tracer=tracer, clock=clock)
    if kind == "suffix":
        history = context.history if params.history and context is not None else None
        if history is not None and not isinstance(history, SuffixHistory):
            raise ValueError(f"the suffix drafter's history must be a SuffixHistory, got {type(history).__name__}")
        return SuffixDrafter(params, history=history, tree=params.tree and _trees_ok(pair), tracer=tracer,
                             clock=clock)
    if kind in ("prophet", "head"):
        if pair.target.is_encoder_decoder:
            raise ValueError("the prophet head drafts for decoder-only targets")
        head = pair.prophet if pair.prophet is not None else prophet_for(pair.target)
        cost = None
        if params.tree and params.budget == "measured":   # timed once per model
            cost = forward_cost(pair.target, 1 + params.tree_shape(pair.target.device)[1], fast=params.fast)
        drafter = ProphetDrafter(head, params, tracer=tracer, clock=clock, rng=rng, cost=cost)
        # a copy branch beside the head's tree, or beside its chain where the target verifies trees (the chain
        # and the copy are then two paths of one tree)
        if kind == "prophet" and params.lookup and (params.tree or _trees_ok(pair)):
            return with_lookup(drafter, params)
        return drafter
    if kind == "speculative":
        if pair.assistant is None:
            raise ValueError("strategy 'speculative' needs an assistant model (or the prophet head)")
        if params.budget == "measured":
            raise ValueError("budget=measured sizes the prophet head's trees; an assistant model drafts with "
                             "budget=fixed")
        if not shares_tokenizer(pair.target, pair.assistant):   # another tokenizer: translate its drafts
            return UniversalDrafter(pair.target, pair.assistant, params, tracer, clock, rng, max_len=max_len)
        check_vocabularies(pair.target, pair.assistant)
        return AssistantDrafter(pair.assistant, params, tracer, clock, rng, max_len=max_len)
    if kind == "self":
        if target is None:
            raise ValueError("the self-drafter drafts on the target's session; make_drafter needs target=")
        return SelfDrafter(pair.target, target, params, tracer=tracer, clock=clock, rng=rng)
    raise ValueError(f"no drafter for strategy {kind!r}")


def _trees_ok(pair: Any) -> bool:
    """Model-free drafters fall back to chains on a target that cannot verify a tree (no 4D masks)."""
    return supports_trees(pair.target)
