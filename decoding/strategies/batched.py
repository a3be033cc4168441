"""A batch of prompts decoded together, each row accepting its own number of drafted tokens.

Greedy, speculative decoding (an assistant model, or the prophet head drafting chains) and the prophet (its
token trees) run over ``B`` prompts in one target forward per step. Every row keeps its own drafter (the one
``make_drafter`` builds for a single-row run, so it drafts exactly what it would alone), its own draft length
and its own output; the target's cache holds the rows with their own lengths (``runtime/ragged.RaggedBatch``).
Each step:

1. every unfinished row drafts (greedy rows draft nothing) and feeds its newest token and its draft;
   a finished row feeds nothing and waits;
2. one target forward over the batch, as wide as the widest row's feed;
3. each row verifies its own draft from its own logits (``stages.verify``), commits its accepted path and the
   target's token, keeps its accepted rows in the cache and tells its drafter;
4. a ``BatchStep`` event records, per row, what it accepted and committed and whether it waited.

The batch waits for its slowest row: a row that would have finished sooner alone keeps the forward company
until the last row ends (its ``waited_steps``). Every row's tokens are its prompt's single-row greedy tokens
(temperature 0 only: the exactness claim is against greedy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from decoding.commit import Output
from decoding.context import RunContext, processors
from decoding.drafting import Drafter, DraftLength, Proposal, make_drafter
from decoding.events import BatchStep
from decoding.params import MAX_TREE_NODES, SamplingParams
from decoding.result import Result
from decoding.runtime.attention import check_mask_support
from decoding.runtime.pair import ModelPair
from decoding.runtime.ragged import RaggedBatch
from decoding.runtime.session import Session
from decoding.strategies.speculative import drafter_kind
from decoding.strategies.stages import acceptance, choose_and_commit, verify
from decoding.tracer import NULL_TRACER
from decoding.tree import tree_layout

MAX_BATCH = 8                                               # rows in one batch, at most
BATCHABLE = ("greedy", "speculative", "prophet", "prompt_lookup")
GREEDY = SamplingParams(temperature=0.0)                   # every row verifies at temperature 0


def check_batch(batch: Any) -> int:
    """``batch`` as an int in ``1..MAX_BATCH``, else a ``ValueError`` naming the parameter and its range."""
    try:
        value = int(batch)
        ok = value == float(batch)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or isinstance(batch, bool) or not 1 <= value <= MAX_BATCH:
        raise ValueError(f"batch must be a whole number from 1 to {MAX_BATCH}, got {batch!r}")
    return value


@dataclass
class _Row:
    """One prompt's side of the batch."""
    prompt: list[int]
    out: Output
    proc: Any
    drafter: Optional[Drafter]
    length: Optional[DraftLength]
    proposal: Proposal = field(default_factory=Proposal.empty)
    steps: int = 0
    waited: int = 0
    drafted: int = 0
    accepted: list[int] = field(default_factory=list)


def batch_generate(strategy: str, prompts: Sequence[Sequence[int]], pair: ModelPair, params: Any, *,
                   max_new_tokens: int, tracer: Any = NULL_TRACER,
                   context: Optional[RunContext] = None) -> list[Result]:
    """Run ``strategy`` (one of :data:`BATCHABLE`) over ``prompts`` as one batch; one ``Result`` per row."""
    _check(strategy, prompts, pair, params)
    target = Session(pair.target, "target", tracer)
    max_len = max(len(p) for p in prompts) + max_new_tokens + MAX_TREE_NODES + 1
    rows = [_row(strategy, list(p), pair, params, target, max_len, max_new_tokens, context) for p in prompts]
    drafters = [r.drafter for r in rows if r.drafter is not None]
    hidden = bool(drafters) and drafters[0].needs_hidden
    if hidden:   # a prophet head reads the target's states (a layer-fusion head some inner layers' too)
        target.hidden_layers = tuple(drafters[0].hidden_layers)
    batch = RaggedBatch(target)
    # 1. prefill every row; each row's first token is the target's own
    logits = batch.prefill([r.prompt for r in rows], hidden=hidden)                          # [B, V]
    for b, row in enumerate(rows):
        first = choose_and_commit(logits[b], row.out, row.proc, _argmax, target.forwards, "greedy")
        if hidden:
            row.drafter.observe(target.last_hidden[b, -1:], [first])
    while not all(r.out.done for r in rows):
        _step(batch, rows, params, tracer, hidden)
    return [_result(row, target.forwards) for row in rows]


def _argmax(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def _check(strategy: str, prompts: Sequence[Sequence[int]], pair: ModelPair, params: Any) -> None:
    if strategy not in BATCHABLE:
        raise ValueError(f"a batch runs {', '.join(BATCHABLE)}; strategy {strategy!r} runs one prompt at a time")
    check_batch(len(prompts))
    if not getattr(params, "is_greedy", True):
        raise ValueError("a batch decodes greedily (temperature 0): every row must equal its greedy run")
    if pair.target.is_encoder_decoder:
        raise ValueError("a batch with per-row lengths runs decoder-only targets")
    check_mask_support(pair.target)             # rows of other lengths need a 4D mask with explicit positions


def _row(strategy: str, prompt: list[int], pair: ModelPair, params: Any, target: Session, max_len: int,
         max_new_tokens: int, context: Optional[RunContext]) -> _Row:
    """A row's output, logits processors and (for a drafting strategy) its own drafter and draft length."""
    out = Output(pair.target.eos_token_ids, max_new_tokens, NULL_TRACER)
    proc = processors(context, pair.target, prompt, max_new_tokens)
    if strategy == "greedy":
        return _Row(prompt, out, proc, None, None)
    drafter = make_drafter(drafter_kind(strategy, pair), pair, params, clock=lambda: target.forwards + 1,
                           max_len=max_len, context=context)
    drafter.begin(prompt)
    adaptive = bool(getattr(params, "adaptive", False)) and strategy != "prompt_lookup"
    return _Row(prompt, out, proc, drafter, DraftLength(params.draft_tokens, adaptive))


def _step(batch: RaggedBatch, rows: list[_Row], params: Any, tracer: Any, hidden: bool) -> None:
    """One verify forward over the batch: draft, verify each row on its own logits, commit, keep, trace."""
    step = batch.session.forwards + 1
    feeds, allowed, rel = [], [], []
    # 1. each unfinished row drafts (room left for the target's own token) and feeds [newest] + draft
    for row in rows:
        if row.out.done:
            row.waited += 1
            feeds.append([])
            allowed.append(None)
            rel.append(None)
            continue
        room = row.out.room - 1
        row.proposal = row.drafter.draft(row.prompt + row.out.tokens, min(row.length.k, room)).limited(room) \
            if row.drafter is not None and room > 0 else Proposal.empty()
        a, r = tree_layout(1, row.proposal.tree.parents)
        feeds.append([row.out.last] + row.proposal.tokens)
        allowed.append(a)
        rel.append(r)
    # 2. one forward for every row
    logits = batch.extend(feeds, allowed, rel, hidden=hidden)                                  # [B, W, V]
    accepted, committed = [], []
    for b, row in enumerate(rows):
        if not feeds[b]:
            accepted.append(0)
            committed.append(0)
            continue
        n_acc, n_new = _verify_row(batch, b, row, logits[b, :len(feeds[b])], params, step, hidden)
        accepted.append(n_acc)
        committed.append(n_new)
    batch.tidy()
    if tracer.enabled:
        tracer.emit(BatchStep(step=step, accepted=tuple(accepted), committed=tuple(committed),
                              fed=tuple(len(f) for f in feeds), width=max(len(f) for f in feeds),
                              waiting=tuple(b for b, f in enumerate(feeds) if not f)))


def _verify_row(batch: RaggedBatch, b: int, row: _Row, logits: torch.Tensor, params: Any, step: int,
                hidden: bool) -> tuple[int, int]:
    """Verify row ``b``'s draft on its logits ``[1 + n, V]``, commit, keep its accepted rows; (accepted,
    committed)."""
    tree = row.proposal.tree
    verdict, _, _ = verify(logits, tree, row.out.tokens, row.proc, GREEDY, None)
    new = [tree.tokens[i] for i in verdict.path] + [verdict.next_token]
    if row.drafter is None:
        sources: Any = "greedy"
    else:
        leaf = not tree.children(verdict.path[-1] if verdict.path else -1)
        sources = [row.drafter.accepted_source] * verdict.n_accepted + ["bonus" if leaf else "correction"]
    done = row.out.commit(new, step, sources)
    kept = [0] + [1 + i for i in verdict.path]
    batch.keep(b, kept)
    if row.drafter is not None:
        if hidden:   # the kept rows predicted the newly committed tokens
            row.drafter.observe(batch.last_hidden(b, kept), new)
        row.drafter.feedback(row.proposal, done)
        row.length.update(tree.depth, verdict.n_accepted)
    row.steps += 1
    row.drafted += tree.depth
    row.accepted.append(verdict.n_accepted)
    return verdict.n_accepted, len(done)


def _result(row: _Row, batch_forwards: int) -> Result:
    """A row's result: its tokens, the forwards it took part in (its prefill and its own steps, what a single-row
    run would count), the steps it waited, its accepted lengths and its drafter's statistics."""
    forwards = 1 + row.steps
    stats: dict = {"accepted_lengths": list(row.accepted), "steps": row.steps, "waited_steps": row.waited,
                   "batch_forwards": batch_forwards,
                   "mean_tokens_per_target_forward": round(len(row.out) / forwards, 4)}
    draft_forwards = 0
    if row.drafter is not None:
        row.drafter.finish(row.out.tokens)
        draft_forwards = row.drafter.forwards
        stats.update(acceptance(row.drafted, sum(row.accepted), row.steps, row.drafter.ms, 0.0, 0),
                     **row.drafter.stats())
    return Result(list(row.out.tokens), forwards, draft_forwards, stats=stats, stop_reason=row.out.stop_reason)
