"""Speculative decoding: one propose -> verify -> accept loop, many drafters.

A drafter (``decoding/drafting/``) proposes a chain or a tree of tokens; the
target verifies all of it in one forward pass (a tree through a tree attention
mask, ``decoding/tree.py``); the accepted path plus one correction or bonus token
is committed (``decoding/verify.py``), and the target's KV cache keeps only the
accepted path. The loop never asks which drafter it has: the ``Drafter``
contract declares what it needs (the target's hidden states, feedback).

Invariant: the target's cache holds every committed token except the newest,
which is fed first (as the tree's root) in the next verify forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from decoding.commit import Output
from decoding.context import RunContext, processors
from decoding.drafting import Drafter, DraftLength, Proposal, make_drafter
from decoding.events import CorrectionToken, Distribution, DraftProposed, DraftTree, StepTiming, TokenVerified
from decoding.params import (MAX_TREE_NODES, PromptLookupParams, ProphetParams, SamplingParams, SelfSpeculativeParams,
                             SpeculativeParams)
from decoding.result import Result
from decoding.runtime.attention import tree_forward
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import chooser
from decoding.strategies.stages import acceptance, first_token, verify
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER
from decoding.verify import Verdict

TOP = 10  # tokens shown per position in the inspector


# --------------------------------------------------------------------------- parameters


# --------------------------------------------------------------------------- the loop

@dataclass
class _Tally:
    steps: int = 0
    depth: int = 0          # summed draft depths (= drafted tokens for chains)
    nodes: int = 0          # summed draft nodes
    accepted: int = 0

    def __post_init__(self) -> None:
        self.lengths: list[int] = []


def speculative_loop(prompt_ids: Sequence[int], pair: ModelPair, params: SamplingParams, drafter: Drafter,
                     length: DraftLength, *, max_new_tokens: int, tracer: Any = NULL_TRACER,
                     target: Optional[Session] = None, rng: Optional[torch.Generator] = None,
                     context: Optional[RunContext] = None) -> Result:
    target = target or Session(pair.target, "target", tracer, fast=params.fast,
                               max_len=len(prompt_ids) + max_new_tokens + MAX_TREE_NODES + 1)
    out = Output(pair.target.eos_token_ids, max_new_tokens, tracer)
    greedy, hidden = params.is_greedy, drafter.needs_hidden
    if hidden:   # a layer-fusion head reads intermediate layers' states too, from the same forwards
        target.hidden_layers = tuple(drafter.hidden_layers)
    prompt = list(prompt_ids)
    proc = processors(context, pair.target, prompt, max_new_tokens)
    drafter.begin(prompt)

    # 1. prefill: the first token comes from the target alone
    first = first_token(target, prompt, out, proc, chooser(params, rng), "greedy" if greedy else "sample",
                        hidden=hidden)
    if hidden:   # the last prompt position predicted the first token
        drafter.observe(target.last_hidden[0, -1:], [first])
    tally = _Tally()
    while not out.done:
        t0 = time.perf_counter()
        step = target.forwards + 1
        # 2. propose, leaving room for the correction/bonus
        room = out.room - 1
        proposal = drafter.draft(prompt + out.tokens, min(length.k, room)).limited(room) if room > 0 \
            else Proposal.empty()
        tree = proposal.tree
        t1 = time.perf_counter()
        # 3. verify everything in one target forward: [newest committed token] + nodes
        base = target.length
        logits = tree_forward(target, [out.last], tree, hidden=hidden)                  # [1 + n, V]
        t2 = time.perf_counter()
        verdict, p, logits = verify(logits, tree, out.tokens, proc, params, rng, proposal.q, proposal.replacement)
        new = [tree.tokens[i] for i in verdict.path] + [verdict.next_token]
        leaf = not tree.children(verdict.path[-1] if verdict.path else -1)
        sources = [drafter.accepted_source] * verdict.n_accepted + ["bonus" if leaf else "correction"]
        if tracer.enabled:
            _trace_step(tracer, step, len(out), drafter, proposal, logits, p, verdict, greedy, leaf)
        committed = out.commit(new, step, sources)
        # 4. keep the root and the accepted path in the cache; tell the drafter what was committed
        rows = [0] + [1 + i for i in verdict.path]
        target.keep(base, rows)
        if hidden:   # the kept rows predicted the newly committed tokens
            drafter.observe(target.last_hidden[0, rows], new)
        drafter.feedback(proposal, committed)
        length.update(tree.depth, verdict.n_accepted)
        tally.steps += 1
        tally.depth += tree.depth
        tally.nodes += len(tree)
        tally.accepted += verdict.n_accepted
        tally.lengths.append(verdict.n_accepted)
        if tracer.enabled:
            t3 = time.perf_counter()
            tracer.emit(StepTiming(step=step, draft_ms=round((t1 - t0) * 1e3, 3),
                                   verify_ms=round((t2 - t1) * 1e3, 3), overhead_ms=round((t3 - t2) * 1e3, 3),
                                   drafted=tree.depth, accepted=verdict.n_accepted))
    drafter.finish(out.tokens)
    return Result(out.tokens, target.forwards, drafter.forwards,
                  stats={**_stats(target, drafter, tally, len(out)), **drafter.stats()}, stop_reason=out.stop_reason)


def _tops(p_rows: Any, rows: list[int], n: int = TOP) -> dict[int, tuple[list[int], list[float]]]:
    """Each of ``rows``' ``n`` most likely tokens and their probabilities, from one ``topk`` over all of them."""
    vals, idx = torch.topk(torch.stack([p_rows[row] for row in rows]), n)
    return {row: (i, [round(v, 5) for v in vs]) for row, i, vs in zip(rows, idx.tolist(), vals.tolist())}


def _trace_step(tracer: Any, step: int, pos0: int, drafter: Drafter, proposal: Proposal, logits: torch.Tensor,
                p: Optional[torch.Tensor], verdict: Verdict, greedy: bool, leaf: bool) -> None:
    """DraftProposed (a chain) or DraftTree, then the checked nodes, the path's distributions and the correction."""
    tree = proposal.tree
    rows = [0] + [1 + i for i in verdict.path]
    if p is None:      # the target's distributions, only at the rows the events read (a tree has many more)
        used = sorted({*rows, *(0 if tree.parents[node] < 0 else 1 + tree.parents[node] for node, _ in verdict.tried)})
        p_rows = dict(zip(used, logits[used].softmax(-1)))
    else:
        p_rows = p                                                                    # [1 + n, V]
    q_tok = [round(q, 5) for q in proposal.q_token] if proposal.q_token else [1.0] * len(tree)
    if tree.is_chain:
        if len(tree):
            form = proposal.layers.event_fields() if proposal.layers is not None else {}
            tracer.emit(DraftProposed(step=step, position=pos0, tokens=tuple(tree.tokens), q=tuple(q_tok),
                                      source=drafter.source, **form))
    else:
        tracer.emit(DraftTree(step=step, position=pos0, tokens=tuple(tree.tokens), parents=tuple(tree.parents),
                              q=tuple(q_tok), accepted=tuple(verdict.path), next_token=verdict.next_token,
                              mask_size=1 + len(tree), source=drafter.source))
    for j, (node, ok) in enumerate(verdict.tried):
        row = 0 if tree.parents[node] < 0 else 1 + tree.parents[node]
        x = tree.tokens[node]
        tracer.emit(TokenVerified(step=step, position=pos0 + tree.depths[node] - 1, token=x, accepted=ok,
                                  p_target=round(float(p_rows[row][x]), 6), q_draft=round(q_tok[node], 6),
                                  u=None if greedy or j >= len(verdict.us) else round(verdict.us[j], 6)))
    tops = _tops(p_rows, rows)
    for i, row in enumerate(rows):
        top_tokens, p_top = tops[row]
        kids = tree.children(-1 if row == 0 else row - 1)
        q_top = tuple(round(float(proposal.q[kids[0], t]), 5) for t in top_tokens) \
            if proposal.q is not None and kids else ()
        residual = ()
        if i == len(rows) - 1 and verdict.residual is not None:
            residual = tuple(round(float(verdict.residual[t]), 5) for t in top_tokens)
        tracer.emit(Distribution(step=step, position=pos0 + i, tokens=tuple(top_tokens), p_target=tuple(p_top),
                                 q_draft=q_top, residual=residual))
    tracer.emit(CorrectionToken(step=step, position=pos0 + verdict.n_accepted, token=verdict.next_token,
                                kind="bonus" if leaf else "correction",
                                p_target=round(float(p_rows[rows[-1]][verdict.next_token]), 6)))


def _stats(target: Session, drafter: Drafter, t: _Tally, n_out: int) -> dict:
    """Acceptance per drafted depth and the Leviathan prediction (``stages.acceptance``), tokens per target
    forward, and the nodes a tree drafted."""
    return {**acceptance(t.depth, t.accepted, t.steps, drafter.ms, target.ms, target.forwards),
            "drafted_nodes": t.nodes, "mean_nodes_per_step": round(t.nodes / max(t.steps, 1), 3),
            "mean_tokens_per_target_forward": round(n_out / target.forwards, 4), "accepted_lengths": t.lengths}


# --------------------------------------------------------------------------- strategies

def drafter_kind(strategy: str, pair: ModelPair) -> str:
    """The drafter a drafting strategy asks ``make_drafter`` for: its own name, but ``speculative`` on a pair
    with no assistant model and the target's prophet head drafts with the head (the ``head`` kind)."""
    if strategy == "speculative" and pair.assistant is None and pair.prophet is not None:
        return "head"
    return strategy


def run_drafted(kind: str, prompt_ids: Sequence[int], pair: ModelPair, params: Any, *, max_new_tokens: int,
                tracer: Any, rng: Optional[torch.Generator], adaptive: bool, context: Optional[RunContext]) -> Result:
    """A strategy of the shared loop: the target's session, the drafter ``make_drafter`` builds for ``kind``
    (it owns its defaults and reports its own statistics), then ``speculative_loop``."""
    max_len = len(prompt_ids) + max_new_tokens + MAX_TREE_NODES + 1
    target = Session(pair.target, "target", tracer, fast=getattr(params, "fast", False), max_len=max_len)
    drafter = make_drafter(kind, pair, params, tracer=tracer, clock=lambda: target.forwards + 1, rng=rng,
                           max_len=max_len, context=context, target=target)
    return speculative_loop(prompt_ids, pair, params, drafter, DraftLength(params.draft_tokens, adaptive),
                            max_new_tokens=max_new_tokens, tracer=tracer, target=target, rng=rng, context=context)


def speculative(prompt_ids: Sequence[int], pair: ModelPair, params: SpeculativeParams, *, max_new_tokens: int,
                tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                context: Optional[RunContext] = None) -> Result:
    """Speculative decoding with an assistant model drafting. The policy for a pair with no assistant model but
    the target's prophet head (the app's "prophet head" assistant): the head drafts, as a plain drafter."""
    return run_drafted(drafter_kind("speculative", pair), prompt_ids, pair, params, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                       adaptive=params.adaptive, context=context)


def prophet(prompt_ids: Sequence[int], pair: ModelPair, params: ProphetParams, *, max_new_tokens: int,
            tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
            context: Optional[RunContext] = None) -> Result:
    """Speculative decoding with the target's prophet head drafting (a tree by default)."""
    return run_drafted("prophet", prompt_ids, pair, params, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                       adaptive=params.adaptive, context=context)


def prompt_lookup(prompt_ids: Sequence[int], pair: ModelPair, params: PromptLookupParams, *,
                  max_new_tokens: int, tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                  context: Optional[RunContext] = None) -> Result:
    return run_drafted("prompt_lookup", prompt_ids, pair, params, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                       adaptive=False, context=context)


def self_speculative(prompt_ids: Sequence[int], pair: ModelPair, params: SelfSpeculativeParams, *,
                     max_new_tokens: int, tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                     context: Optional[RunContext] = None) -> Result:
    """Self-speculative decoding: the target drafts with its first ``exit_layer`` layers (or all but a skipped
    set) on its own KV cache and verifies with all of them (``drafting/selfdraft.py``)."""
    if pair.target.is_encoder_decoder:
        raise ValueError("self_speculative drafts with a decoder-only model's own layers; "
                         f"{pair.target.name!r} is an encoder-decoder model")
    return run_drafted("self", prompt_ids, pair, params, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                       adaptive=params.adaptive, context=context)


STRATEGIES = [
    Strategy("speculative", SpeculativeParams, speculative, lossless=True, needs_assistant=True,
             label="Speculative",
             description="An assistant model drafts k tokens (or a tree); the target verifies them in one forward."),
    Strategy("prompt_lookup", PromptLookupParams, prompt_lookup, lossless=True, label="Prompt lookup",
             description="Drafts by copying n-gram continuations from the prompt and the output so far."),
    Strategy("prophet", ProphetParams, prophet, lossless=True, needs_assistant=False, label="Prophet head",
             description="A 1-layer head trained on the target's own hidden states drafts a token tree; "
                         "the target verifies it in one forward."),
    Strategy("self_speculative", SelfSpeculativeParams, self_speculative, lossless=True, needs_assistant=False,
             label="Self-speculative",
             description="The target drafts with its own first layers (early exit; or all but a skipped set) "
                         "and verifies with all of them: no second model, no training."),
]
