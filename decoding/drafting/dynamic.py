"""EAGLE-2-style dynamic draft trees (Li et al. 2024, "EAGLE-2"): grow where the drafter is confident.

Model-agnostic. A drafter supplies the root's next-token log-probabilities and an
``expand(growth, nodes)`` callback that runs its model once on a batch of nodes
and returns the log-probabilities of their children. Then:

1. the root's ``topk`` best tokens become the depth-1 nodes; a node's *score* is
   the sum of the draft log-probabilities along its path (log of the probability
   that the drafter's path reaches it);
2. at each further depth the ``topk`` best-scoring nodes of the newest depth are
   expanded in one batched call, each getting its ``topk`` best children;
3. growth stops at ``depth``, or early when even the best new node's path
   probability is below ``threshold``, or when no node of the newest depth can
   still place a descendant in the kept set: a node scoring no better than the
   ``budget``-th best node grown so far is not expanded (its descendants never
   outscore it and lose ties to older nodes), which saves head calls and never
   lowers the kept nodes' path probabilities;
4. the whole tree is reranked by score and cut to the ``budget`` best nodes. A
   child never scores above its parent (log-probabilities are <= 0) and ties go to
   the earlier node, so the kept set contains every kept node's ancestors
   (``budget.rank_nodes`` makes sure of it whatever the scores);
5. ``choose`` (optional) then cuts that ranking shorter: given the kept nodes'
   path probabilities, best first, it returns how many to verify (the prophet's
   measured budget, ``drafting/budget.py``).

Sampling (``sample=True``): children are drawn without replacement by the
Gumbel-top-k trick, in draw order, and a sibling's score is capped by the
previous sibling's, so the kept children of a node are always a prefix of its
draws. Verification (``verify.verify_tree_sampling``) then tries them in that
order against ``q`` with the earlier siblings removed: lossless.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from decoding.drafting.base import Proposal
from decoding.drafting.budget import rank_nodes
from decoding.tree import TokenTree

@dataclass
class Growth:
    """The nodes grown so far (all of them, not only the kept ones)."""
    tokens: list[int] = field(default_factory=list)      # token ids
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)    # cumulative log q along the path
    own: list[float] = field(default_factory=list)       # log q of the node's own token
    source_row: list[int] = field(default_factory=list)  # index into rows: the distribution it was drawn from
    rows: list[torch.Tensor] = field(default_factory=list)   # log q rows [V'] (root first)

    def ancestors(self, node: int) -> list[int]:
        out = []
        node = self.parents[node]
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out


def _pick(row: torch.Tensor, k: int, sample: bool, rng: Optional[torch.Generator],
          ids: Optional[torch.Tensor] = None) -> tuple[list[int], list[float]]:
    """``k`` indices of ``row`` (log-probs ``[V']``) with finite log-probs: the best, or draws without
    replacement (Gumbel-top-k); mapped through ``ids`` when given. Fewer when fewer are finite."""
    k = min(k, row.shape[-1])
    if k <= 0:
        return [], []
    if sample:
        u = torch.rand(row.shape, generator=rng, device=row.device, dtype=torch.float32).clamp_(1e-20, 1.0)
        keys = row.float() - torch.log(-torch.log(u))
        idx = torch.topk(keys, k).indices                         # in draw order
    else:
        idx = torch.topk(row, k).indices
    return _finite_prefix((idx if ids is None else ids[idx]).tolist(), row[idx].float().tolist())


def _finite_prefix(tokens: list[int], logq: list[float]) -> tuple[list[int], list[float]]:
    """The picks up to the first without a finite log-prob: one whose log-prob is -inf (filtered out, or
    beyond the finite ones) comes last in either order."""
    finite = sum(1 for v in logq if math.isfinite(v))
    return tokens[:finite], logq[:finite]


def _picks(rows: torch.Tensor, k: int, ids: Optional[torch.Tensor]) -> list[tuple[list[int], list[float]]]:
    """``_pick`` (greedy) of every row of ``rows [K, V']`` with one ``topk``: the same indices, row by row."""
    k = min(k, rows.shape[-1])
    if k <= 0 or rows.dim() != 2:
        return [_pick(row, k, False, None, ids) for row in rows]
    vals, idx = torch.topk(rows, k)
    picked = (idx if ids is None else ids[idx]).tolist()
    return [_finite_prefix(tokens, logq) for tokens, logq in zip(picked, vals.float().tolist())]


def grow(root: torch.Tensor, expand: Callable[[Growth, list[int]], torch.Tensor], *, depth: int, topk: int,
         budget: int, threshold: float = 0.0, sample: bool = False, rng: Optional[torch.Generator] = None,
         ids: Optional[torch.Tensor] = None, vocab: Optional[int] = None,
         choose: Optional[Callable[[list[float]], int]] = None, prune: bool = True) -> Proposal:
    """A dynamic tree below ``root`` (log-probs ``[V']`` of the token after the newest committed one).

    ``ids [V']`` maps row indices to token ids (None: the identity). With ``sample``,
    the rows must be the filtered distributions the target is verified against,
    and ``vocab`` (the full vocabulary size) sizes the proposal's ``q`` rows.
    ``prune=False`` expands every chosen node even when none of its descendants can be kept (step 3; for
    comparisons).
    """
    g = Growth(rows=[root])

    def add_children(parent: int, row_index: int, base: float, d: int,
                     best: Optional[tuple[list[int], list[float]]] = None) -> list[int]:
        picked, logq = best or _pick(g.rows[row_index], topk, sample, None if not sample else rng, ids)
        made, cap = [], math.inf
        for token, lq in zip(picked, logq):
            lq_path = min(lq, 0.0)              # a child never outscores its parent (step 3 relies on it)
            score = min(base + lq_path, cap) if sample else base + lq_path
            cap = score
            g.tokens.append(token)
            g.parents.append(parent)
            g.depths.append(d)
            g.scores.append(score)
            g.own.append(lq)
            g.source_row.append(row_index)
            made.append(len(g.tokens) - 1)
        return made

    # 1. depth 1: the root's best tokens (or draws)
    frontier = add_children(-1, 0, 0.0, 1)
    # 2. expand the best nodes of the newest depth, one batched drafter call per depth
    for d in range(2, depth + 1):
        best = sorted(frontier, key=lambda i: (-g.scores[i], i))[:topk]
        if not best or (threshold and math.exp(g.scores[best[0]]) < threshold):
            break
        if prune and len(g.scores) >= budget:     # only nodes that beat the budget-th best can add a kept one
            floor = heapq.nlargest(budget, g.scores)[-1]
            best = [e for e in best if g.scores[e] > floor]
            if not best:
                break
        rows = expand(g, best)                                                     # [K, V']
        # greedy: every expanded node's best children from one topk (draws keep their per-row order of rng use)
        picks = [None] * len(best) if sample else _picks(rows, topk, ids)
        frontier = []
        for node, row, pick in zip(best, rows, picks):
            g.rows.append(row)
            frontier += add_children(node, len(g.rows) - 1, g.scores[node], d, pick)
    # 3. rerank everything grown and keep the budget's best (ancestor-closed, sibling-prefix-closed)
    keep = rank_nodes(g.scores, g.parents)[:budget]
    # 4. optionally fewer: the prefix of that ranking worth its verify forward
    if choose is not None:
        keep = keep[:max(0, min(len(keep), int(choose([math.exp(g.scores[i]) for i in keep]))))]
    tree, kept = TokenTree(tuple(g.tokens), tuple(g.parents)).subtree(keep)
    q_token = [round(math.exp(g.own[i]), 6) for i in kept]
    q = None
    if sample:
        q = torch.stack([_full_row(g.rows[g.source_row[i]].float().exp(), ids, vocab) for i in kept]) \
            if kept else None
    return Proposal(tree, q, q_token, replacement=False)


def _full_row(q: torch.Tensor, ids: Optional[torch.Tensor], vocab: Optional[int]) -> torch.Tensor:
    if ids is None:
        return q
    full = torch.zeros(vocab, dtype=q.dtype, device=q.device)
    full[ids] = q
    return full


def visible_ancestors(g: Growth, nodes: Sequence[int], slots: dict[int, int], width: int) -> torch.Tensor:
    """``[K, width]`` bool: which already-fed draft positions (``slots``: node -> position) each node sees."""
    vis = torch.zeros(len(nodes), width, dtype=torch.bool)
    for r, node in enumerate(nodes):
        for a in g.ancestors(node):
            if a in slots:
                vis[r, slots[a]] = True
    return vis
