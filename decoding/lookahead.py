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
  each a causal chain of its own after the key. The longest candidate prefix
  that equals the target's argmax is accepted, plus the target's next token
  (the bonus), so every step commits at least one token -- the same tokens
  greedy decoding produces.

The input of a step is ``pending + candidates + window`` where ``pending`` are
the committed tokens whose keys/values are not cached yet (at least the key).
Afterwards the cache is cropped back to the committed prefix; the accepted
tokens' keys/values are kept when they came from candidate 0 (contiguous with
``pending``), otherwise they are re-fed next step as ``pending``.

The fused forward needs a model that honours a custom 4D float attention mask
and explicit position ids; :func:`check_mask_support` probes that once per
model (fused vs separate logits) and raises ``ValueError`` otherwise (Marian and
T5 compute their own decoder positions, for example).

Trace: ``LookaheadStep.window`` is the window the forward saw (levels oldest
first), ``candidates`` the verified continuations *without* the key token.
``TokenCommitted.source`` is ``"ngram"`` for accepted candidate tokens and
``"greedy"`` for the one token the target adds each step (and after prefill).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Optional, Sequence

import torch

from .events import LookaheadStep, TokenCommitted
from .lm import Session
from .params import check_number
from .result import ModelPair, Result
from .strategies import Strategy
from .tracer import NULL_TRACER


@dataclass(frozen=True)
class LookaheadParams:
    """``window`` W, ``ngram`` N, ``guess_set`` G (n-grams kept per key and verified per step).

    The defaults (W=2, N=4, G=4) are the point of ``make bench-lookahead``'s sweep that
    meets both CPU goals on code prompts (step compression >= 1.3, wall clock >= greedy);
    on a GPU, where a wide forward costs what a narrow one does, wider windows pay more
    (BENCHMARKS.md: W=4, N=5, G=2 was the H100 sweep's best).
    """
    window: int = 2
    ngram: int = 4
    guess_set: int = 4
    pool_from_prompt: bool = True
    pool_from_output: bool = False
    fast: bool = False              # static KV cache + CUDA graphs (decoding/fastpath.py)

    def __post_init__(self) -> None:
        check_number("window", self.window, 1, 32, integer=True)
        check_number("ngram", self.ngram, 2, 8, integer=True)
        check_number("guess_set", self.guess_set, 1, 32, integer=True)
        for name in ("pool_from_prompt", "pool_from_output", "fast"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")


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


# --------------------------------------------------------------------------- candidate tree

@dataclass
class CandidateTree:
    """Candidates merged by common prefix: one input token per tree node, in depth-first order.

    ``parents[r]`` is the node's parent (-1: the key token); ``children[r]``
    maps a token to the child node (``root`` for the key's children). The first
    candidate occupies nodes ``0..len-1``, so an accepted prefix of it is
    contiguous with the tokens fed before the tree.
    """
    tokens: list[int]
    parents: tuple[int, ...]
    root: dict[int, int]
    children: list[dict[int, int]]

    @classmethod
    def build(cls, cands: Iterable[Sequence[int]]) -> "CandidateTree":
        tokens: list[int] = []
        parents: list[int] = []
        root: dict[int, int] = {}
        children: list[dict[int, int]] = []
        for cand in cands:
            level, parent = root, -1
            for tok in cand:
                node = level.get(tok)
                if node is None:
                    node = level[tok] = len(tokens)
                    tokens.append(tok)
                    parents.append(parent)
                    children.append({})
                level, parent = children[node], node
        # depth-first order so that each candidate's first branch is contiguous
        order: list[int] = []
        stack = list(reversed(root.values()))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(children[node].values()))
        new = {old: i for i, old in enumerate(order)}
        return cls(tokens=[tokens[o] for o in order],
                   parents=tuple(-1 if parents[o] < 0 else new[parents[o]] for o in order),
                   root={t: new[c] for t, c in root.items()},
                   children=[{t: new[c] for t, c in children[o].items()} for o in order])

    def walk(self, greedy_after: Sequence[int], key_row: int, offset: int) -> list[int]:
        """Nodes on the longest path that greedy decoding would produce.

        ``greedy_after[r]`` is the target's argmax after input row ``r``; the key
        is row ``key_row`` and node ``k`` is row ``offset + k``.
        """
        path: list[int] = []
        node = self.root.get(greedy_after[key_row])
        while node is not None:
            path.append(node)
            node = self.children[node].get(greedy_after[offset + node])
        return path


# --------------------------------------------------------------------------- layout and mask

@lru_cache(maxsize=512)
def step_layout(pending: int, parents: tuple[int, ...], levels: int, width: int
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Attention pattern of one step's new tokens ``pending + tree + window``.

    Returns ``allowed [T, T]`` (bool, row = query may attend column = key),
    the positions ``[T]`` relative to the key (the last pending token, 0), and the
    first row of the window. Every row also sees the whole cache, not part of this block.
    """
    rows: list[int] = []
    cols: list[int] = []
    rel: list[int] = []

    def see(r: int, cs: Iterable[int]) -> None:
        for c in cs:
            rows.append(r)
            cols.append(c)

    # 1. pending tokens: plain causal
    for r in range(pending):
        see(r, range(r + 1))
        rel.append(r - pending + 1)
    # 2. tree nodes: pending, their ancestors and themselves
    depth: list[int] = []
    for k, parent in enumerate(parents):
        r = pending + k
        depth.append(1 if parent < 0 else depth[parent] + 1)
        chain, a = [r], parent
        while a >= 0:
            chain.append(pending + a)
            a = parents[a]
        see(r, range(pending))
        see(r, chain)
        rel.append(depth[k])
    # 3. window: (l, i) sees level 0 columns 0..i and column i of levels 1..l
    first = pending + len(parents)
    for l in range(levels):
        for i in range(width):
            r = first + l * width + i
            see(r, range(pending))
            see(r, range(first, first + i + 1))
            see(r, (first + m * width + i for m in range(1, l + 1)))
            rel.append(i + l + 1)
    total = len(rel)
    allowed = torch.zeros(total, total, dtype=torch.bool)
    allowed[rows, cols] = True
    return allowed, torch.tensor(rel, dtype=torch.long), first


def float_mask(allowed: torch.Tensor, cached: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """``[1, 1, T, cached + T]``: 0 where attention is allowed, -inf where blocked."""
    t = allowed.shape[0]
    mask = torch.zeros(1, 1, t, cached + t, dtype=dtype, device=device)
    mask[0, 0, :, cached:].masked_fill_(~allowed.to(device), float("-inf"))
    return mask


def _layer_kinds(config: Any) -> tuple[set[str], Optional[int]]:
    kinds = set(getattr(config, "layer_types", None) or ())
    return kinds, getattr(config, "sliding_window", None)


def attention_mask(lm: Any, allowed: torch.Tensor, positions: torch.Tensor, cached: int) -> Any:
    """The mask argument for a fused forward; a per-layer-type dict for sliding-window models.

    A sliding-window layer additionally blocks keys ``sliding_window`` or more
    positions before the query (the cache holds positions ``0..cached-1``).
    """
    mask = float_mask(allowed, cached, lm.dtype, lm.device)
    kinds, window = _layer_kinds(lm.model.config)
    if "sliding_attention" not in kinds or not window:
        return mask
    key_pos = torch.cat((torch.arange(cached, device=lm.device), positions.to(lm.device)))   # [C+T]
    far = positions.to(lm.device)[:, None] - key_pos[None, :] >= window                     # [T, C+T]
    return {"full_attention": mask,
            "sliding_attention": mask.masked_fill(far[None, None], float("-inf"))}


def check_mask_support(lm: Any) -> None:
    """Raise ``ValueError`` unless ``lm`` honours a custom 4D mask with explicit positions.

    Runs once per model (the verdict is kept in ``lm.extras``): the logits of a
    token fed after a sibling it must not see are compared with those of a plain
    forward that never saw the sibling.
    """
    verdict = lm.extras.get("lookahead_mask")
    if verdict is None:
        verdict = _probe(lm)
        lm.extras["lookahead_mask"] = verdict
    if verdict != "ok":
        raise ValueError(f"lookahead decoding needs a model that accepts a custom 4D attention mask "
                         f"with explicit position ids; {type(lm.model).__name__} does not ({verdict})")


def _probe(lm: Any) -> str:
    kinds, _ = _layer_kinds(lm.model.config)
    odd = kinds - {"full_attention", "sliding_attention"}
    if odd:
        return f"unsupported layer types {sorted(odd)}"
    vocab = lm.vocab_size
    a, b, c, d = (3 % vocab, 5 % vocab, 7 % vocab, 11 % vocab)
    try:
        fused = Session(lm)
        fused.prefill([a, b])
        cached = fused.length
        # rows: c, d (after c), e=d again but as a sibling of the first d (sees c only)
        allowed = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        pos = torch.tensor([0, 1, 1]) + cached
        got = fused.forward(fused.tensor([[c, d, b]]), position_ids=pos[None].to(lm.device),
                            attention_mask=attention_mask(lm, allowed, pos, cached))[0]
        plain = Session(lm)
        plain.prefill([a, b])
        ref = plain.forward(plain.tensor([[c, b]]))[0]
    except Exception as exc:  # a model that rejects the arguments outright
        return f"{type(exc).__name__}: {exc}"
    scale = float(ref.abs().max()) + 1e-6
    tol = 1e-3 if lm.dtype in (torch.float32, torch.float64) else 3e-2
    diff = float((got[[0, 2]] - ref).abs().max()) / scale
    return "ok" if diff <= tol else f"fused and separate logits differ by {diff:.3g} (relative)"


# --------------------------------------------------------------------------- the loop

@dataclass
class _Tally:
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
              rng: Optional[torch.Generator] = None) -> Result:
    lm = pair.target
    check_mask_support(lm)
    target = Session(lm, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + 1 + (params.window + params.guess_set) * (params.ngram - 1))
    eos = set(lm.eos_token_ids)
    n, width = params.ngram, params.window
    pool = NgramPool(params.guess_set)
    context = list(prompt_ids)              # prompt + committed tokens
    if params.pool_from_prompt:
        pool.add_all(context, n)

    # 1. prefill; the first token is greedy's
    logits = target.prefill(context)[0]
    out = [int(logits.argmax())]
    context.append(out[0])
    if tracer.enabled:
        tracer.emit(TokenCommitted(step=target.forwards, position=0, token=out[0], source="greedy",
                                   prob=round(float(logits.softmax(-1)[out[0]]), 6)))
    pending = [out[0]]                      # committed, not yet in the cache; the last is the key
    levels = [_initial_level(context, width, rng)]
    tally = _Tally()

    while out[-1] not in eos and len(out) < max_new_tokens:
        # 2. candidates for the key, merged into a tree; a step commits at most `room` tokens
        room = max_new_tokens - len(out)
        key = out[-1]
        grams = pool.lookup(key) if room > 1 else []
        cands = [g[: room - 1] for g in grams]
        tree = CandidateTree.build(cands)
        allowed, rel, first = step_layout(len(pending), tree.parents, len(levels), width)
        # 3. one fused forward: pending + tree + window
        cached = target.length
        positions = rel + (cached + len(pending) - 1)                        # [T]
        flat = pending + tree.tokens + [t for lv in levels for t in lv]
        logits = target.forward(target.tensor([flat]), position_ids=positions[None].to(lm.device),
                                attention_mask=attention_mask(lm, allowed, positions, cached),
                                kind="lookahead")[0]                            # [T, V]
        best = logits.argmax(-1).tolist()
        # 4. verification: the longest greedy path through the tree, then the bonus token
        key_row = len(pending) - 1
        path = tree.walk(best, key_row, len(pending))
        rows = [key_row] + [len(pending) + k for k in path]
        new = [tree.tokens[k] for k in path] + [best[rows[-1]]]
        accepted = len(path)
        choice = next(j for j, c in enumerate(cands) if list(c[:accepted]) == new[:accepted]) if path else -1
        if path:
            pool.touch(key, grams[choice])
        # 5. commit, stopping at EOS / max_new_tokens like greedy
        position = len(out)
        committed = _commit(new, out, eos, max_new_tokens)
        context.extend(committed)
        if params.pool_from_output:
            pool.add_all(context[-(len(committed) + n - 1):], n)
        # 6. the window: the last level's outputs become a new level (n-grams once it is full)
        seen = levels
        fresh = [best[first + (len(levels) - 1) * width + i] for i in range(width)]
        levels = _advance(levels, fresh, n - 1, pool)
        # 7. keep the cache of pending tokens and of an accepted path that directly follows them
        keep = accepted if path == list(range(accepted)) else 0
        target.crop(cached + len(pending) + keep)
        pending = new[keep:]
        tally.steps += 1
        tally.hit_steps += bool(cands)
        tally.accept_steps += accepted > 0
        tally.candidate_positions += len(tree.tokens)
        tally.fed_positions += len(flat)
        tally.reused_kv += keep
        tally.accepted_lengths.append(accepted)
        if tracer.enabled:
            _trace(tracer, target.forwards, position, seen, pool, cands, choice, committed, accepted,
                   logits, rows)
    return Result(out, target.forwards, stats=_stats(tally, out, target, pool),
                  stop_reason="eos" if out[-1] in eos else "max_new_tokens")


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


def _commit(new: list[int], out: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
    committed = []
    for tok in new:
        committed.append(tok)
        out.append(tok)
        if tok in eos or len(out) >= max_new_tokens:
            break
    return committed


def _trace(tracer: Any, step: int, position: int, window: list[list[int]], pool: NgramPool,
           cands: list[tuple[int, ...]], choice: int, committed: list[int], accepted: int,
           logits: torch.Tensor, rows: list[int]) -> None:
    tracer.emit(LookaheadStep(step=step, position=position, window=tuple(tuple(lv) for lv in window),
                              pool_size=len(pool), candidates=tuple(tuple(c) for c in cands),
                              accepted_candidate=choice, accepted=tuple(committed), pool_hits=len(cands)))
    p = logits[rows].softmax(-1)                                             # [a+1, V]
    for i, tok in enumerate(committed):
        tracer.emit(TokenCommitted(step=step, position=position + i, token=tok,
                                   source="ngram" if i < accepted else "greedy",
                                   prob=round(float(p[i, tok]), 6)))


def _stats(t: _Tally, out: list[int], target: Session, pool: NgramPool) -> dict:
    steps = max(t.steps, 1)
    lengths = [a for a in t.accepted_lengths if a]
    return {
        "step_compression": round(len(out) / target.forwards, 4),
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
