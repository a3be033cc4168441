"""Lookahead decoding (Fu et al. 2024, arXiv 2402.02057), lossless under greedy.

One fused target forward per step runs two branches side by side:

* the **lookahead branch**: a 2D window of ``N-1`` levels x ``W`` columns of
  guessed tokens, refined Jacobi-style. Column ``i`` of level ``l`` sits at
  ``i + l + 1`` positions after the newest committed token (the *key*) and sees
  the key, level 0's columns ``0..i`` and its own column in levels ``1..l``:
  one causal chain per column. The last level's outputs become a new level; each
  column's chain plus its output is an n-gram for the pool, and the oldest level
  is dropped (the first ``N-2`` steps only fill the window);
* the **verification branch**: up to ``G`` pool n-grams that start with the key,
  merged by common prefix into a token tree (``decoding/tree.py``, the module
  speculative decoding's tree drafts use too). Under greedy decoding the longest
  path that equals the target's argmax is accepted, plus the target's next token
  (the bonus), so every step commits at least one token -- the same tokens
  greedy decoding produces. With ``temperature > 0`` the candidates are checked
  by speculative sampling with a one-hot q (``verify.verify_tree_sampling``): the
  committed tokens are distributed exactly as sampling from the target.

The input of a step is ``pending + candidates + window`` where ``pending`` are
the committed tokens whose keys/values are not cached yet (the key, and the
prompt's last token at the start). Afterwards the cache keeps the pending
tokens and the accepted path (compacted, ``Session.keep``) and drops the rest.

The fused forward needs a model that honours a custom 4D float attention mask
and explicit position ids; ``tree.check_mask_support`` probes that once per
model (fused vs separate logits) and raises ``ValueError`` otherwise (Marian and
T5 compute their own decoder positions, for example).

Trace: ``LookaheadStep.window`` is the window the forward saw (levels oldest
first), ``candidates`` the verified continuations *without* the key token.
``TokenCommitted.source`` is ``"ngram"`` for accepted candidate tokens and
``"greedy"`` (``"sample"`` when sampling) for the token the target adds each step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Sequence

import torch

from decoding.commit import Output
from decoding.context import RunContext, processors
from decoding.events import LookaheadStep
from decoding.params import LookaheadParams
from decoding.result import Result
from decoding.runtime.attention import attention_mask, check_mask_support
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.runtime.widths import WidthChoice, lookahead_window
from decoding.sampling import chooser
from decoding.strategies.stages import first_token, trace_width, verify
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER
from decoding.tree import TokenTree, tree_layout

# --------------------------------------------------------------------------- n-gram pool

class NgramPool:
    """N-grams keyed by their first token; each key keeps its ``capacity`` most recently seen."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._grams: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.size = 0

    def add(self, gram: Sequence[int]) -> None:
        key, cont = int(gram[0]), tuple(int(t) for t in gram[1:])
        bucket = self._grams.get(key)
        if bucket is None:
            bucket = self._grams[key] = OrderedDict()
        if cont in bucket:
            bucket.move_to_end(cont)
            return
        bucket[cont] = None
        self.size += 1
        if len(bucket) > self.capacity:
            bucket.popitem(last=False)       # least recently seen
            self.size -= 1

    def add_all(self, tokens: Sequence[int], n: int) -> None:
        for i in range(len(tokens) - n + 1):
            self.add(tokens[i:i + n])

    def touch(self, key: int, cont: tuple[int, ...]) -> None:
        bucket = self._grams.get(key)
        if bucket is not None and cont in bucket:
            bucket.move_to_end(cont)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """Continuations stored for ``key``, most recently seen first."""
        bucket = self._grams.get(key)
        return list(reversed(bucket)) if bucket else []

    def __len__(self) -> int:
        return self.size


# --------------------------------------------------------------------------- layout and mask

@lru_cache(maxsize=512)
def step_layout(pending: int, parents: tuple[int, ...], levels: int, width: int
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Attention pattern of one step's new tokens ``pending + tree + window``.

    Returns ``allowed [T, T]`` (bool, row = query may attend column = key),
    the positions ``[T]`` relative to the key (the last pending token, 0), and the
    first row of the window. The pending and tree rows are ``tree.tree_layout``'s;
    window cell (level ``l``, column ``i``) sees the pending tokens, level 0's
    columns ``0..i`` and column ``i`` of levels ``1..l``, at position ``i + l + 1``.
    Every row also sees the whole cache, not part of this block.
    """
    base, base_rel = tree_layout(pending, parents, extra=levels * width)
    allowed, rel = base.clone(), base_rel.clone()      # tree_layout's tensors are cached: never mutate them
    first = pending + len(parents)
    for l in range(levels):
        for i in range(width):
            r = first + l * width + i
            allowed[r, :pending] = True
            allowed[r, first:first + i + 1] = True
            for m in range(1, l + 1):
                allowed[r, first + m * width + i] = True
            rel[r] = i + l + 1
    return allowed, rel, first


# --------------------------------------------------------------------------- the loop

@dataclass
class _WindowTally:
    steps: int = 0
    hit_steps: int = 0
    accept_steps: int = 0
    candidate_positions: int = 0
    fed_positions: int = 0
    reused_kv: int = 0

    def __post_init__(self) -> None:
        self.accepted_lengths: list[int] = []


def lookahead(prompt_ids: Sequence[int], pair: ModelPair, params: LookaheadParams, *,
              max_new_tokens: int, tracer: Any = NULL_TRACER,
              rng: Optional[torch.Generator] = None, context: Optional[RunContext] = None) -> Result:
    lm = pair.target
    check_mask_support(lm)
    chosen = lookahead_window(lm, params)           # the user's window, or auto: from the measured curve
    n, width, greedy = params.ngram, chosen.value, params.is_greedy
    trace_width(tracer, chosen)
    target = Session(lm, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + 1 + (width + params.guess_set) * (n - 1))
    out = Output(lm.eos_token_ids, max_new_tokens, tracer)
    own = "greedy" if greedy else "sample"          # the source of the token the target adds each step
    pool = NgramPool(params.guess_set)
    seq = list(prompt_ids)                  # prompt + committed tokens
    if params.pool_from_prompt:
        pool.add_all(seq, n)

    proc = processors(context, lm, prompt_ids, max_new_tokens)
    # 1. prefill; the first token is the target's own
    first = first_token(target, seq, out, proc, chooser(params, rng), own)
    seq.append(first)
    pending = [first]                       # committed, not yet in the cache; the last is the key
    levels = [_initial_level(seq, width, rng)]
    tally = _WindowTally()

    while not out.done:
        # 2. candidates for the key, merged into a tree; a step commits at most `room` tokens
        key = out.last
        grams = pool.lookup(key) if out.room > 1 else []
        cands = [g[: out.room - 1] for g in grams]
        tree = TokenTree.from_paths(cands)
        allowed, rel, first_row = step_layout(len(pending), tree.parents, len(levels), width)
        # 3. one fused forward: pending + tree + window
        cached = target.length
        positions = rel + (cached + len(pending) - 1)                        # [T]
        flat = pending + list(tree.tokens) + [t for lv in levels for t in lv]
        logits = target.forward(target.tensor([flat]), position_ids=positions[None].to(lm.device),
                                attention_mask=attention_mask(lm, allowed, positions, cached),
                                kind="lookahead")[0]                            # [T, V]
        # 4. verification branch: the key row, then one row per tree node (processed with their own context)
        rows = [len(pending) - 1] + list(range(len(pending), len(pending) + len(tree)))
        verdict, _, branch = verify(logits[rows], tree, out.tokens, proc, params, rng)     # rows: [1 + n, V]
        path = verdict.path
        new = [tree.tokens[k] for k in path] + [verdict.next_token]
        choice = next(j for j, c in enumerate(cands) if list(c[:len(path)]) == new[:len(path)]) if path else -1
        if path:
            pool.touch(key, grams[choice])
        # 5. commit, stopping at EOS / max_new_tokens like greedy
        position = len(out)
        probs = None
        if tracer.enabled:
            used = [0] + [1 + k for k in path]
            probs = [float(branch[r].softmax(-1)[t]) for r, t in zip(used, new)]
        committed = out.commit(new, target.forwards, ["ngram"] * len(path) + [own], probs)
        seq.extend(committed)
        if params.pool_from_output:
            pool.add_all(seq[-(len(committed) + n - 1):], n)
        # 6. the window: the last level's outputs become a new level (n-grams once it is full)
        seen = levels
        fresh = logits[first_row + (len(levels) - 1) * width: first_row + len(levels) * width].argmax(-1).tolist()
        levels = _advance(levels, fresh, n - 1, pool)
        # 7. keep the pending tokens and the accepted path in the cache; the target's own token is pending
        target.keep(cached, list(range(len(pending))) + [len(pending) + k for k in path])
        pending = new[-1:]
        tally.steps += 1
        tally.hit_steps += bool(cands)
        tally.accept_steps += bool(path)
        tally.candidate_positions += len(tree)
        tally.fed_positions += len(flat)
        tally.reused_kv += len(path)
        tally.accepted_lengths.append(len(path))
        if tracer.enabled:
            tracer.emit(LookaheadStep(step=target.forwards, position=position,
                                      window=tuple(tuple(lv) for lv in seen), pool_size=len(pool),
                                      candidates=tuple(tuple(c) for c in cands), accepted_candidate=choice,
                                      accepted=tuple(committed), pool_hits=len(cands)))
    return Result(out.tokens, target.forwards, stats=_stats(tally, out.tokens, target, pool, chosen),
                  stop_reason=out.stop_reason)



def _initial_level(context: list[int], width: int, rng: Optional[torch.Generator]) -> list[int]:
    """Level 0 of the window: tokens drawn from the prompt (any guess keeps the output exact)."""
    device = "cpu" if rng is None else rng.device
    picks = torch.randint(0, len(context), (width,), generator=rng, device=device).tolist()
    return [context[i] for i in picks]


def _advance(levels: list[list[int]], fresh: list[int], depth: int, pool: NgramPool) -> list[list[int]]:
    """Append the new level; a full window (``depth`` levels) first yields one n-gram per column."""
    if len(levels) < depth:
        return levels + [fresh]
    for i, tok in enumerate(fresh):
        pool.add([lv[i] for lv in levels] + [tok])
    return levels[1:] + [fresh]


def _stats(t: _WindowTally, out: list[int], target: Session, pool: NgramPool, chosen: WidthChoice) -> dict:
    steps = max(t.steps, 1)
    lengths = [a for a in t.accepted_lengths if a]
    return {
        "window": chosen.value, "width_choice": chosen.record(),
        "mean_tokens_per_target_forward": round(len(out) / target.forwards, 4),
        "lookahead_steps": t.steps,
        "pool_hit_rate": round(t.hit_steps / steps, 4),
        "acceptance_rate": round(t.accept_steps / steps, 4),
        "mean_accepted_ngram": round(sum(lengths) / len(lengths), 4) if lengths else 0.0,
        "accepted_lengths": t.accepted_lengths,
        "mean_positions_per_forward": round(t.fed_positions / steps, 2),
        "mean_candidate_positions": round(t.candidate_positions / steps, 2),
        "reused_kv_tokens": t.reused_kv,
        "pool_size": len(pool),
    }


STRATEGIES = [Strategy("lookahead", LookaheadParams, lookahead, lossless=True, label="Lookahead",
                       description="Jacobi-style n-gram generation in a 2D window and verification of "
                                   "pooled n-grams, fused in one forward per step.")]
