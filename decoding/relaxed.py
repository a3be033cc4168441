"""Relaxed (lossy) acceptance of drafts: ``lenient`` and ``typical``, beside the exact rule of ``decoding.verify``.

Every strategy that verifies drafts (speculative decoding with any drafter, prompt lookup, suffix decoding,
the prophet, lookahead's n-gram branch) verifies through ``strategies.stages.verify``, which hands a run whose
``acceptance`` is not ``exact`` (``params.DraftedParams``) to ``verify_relaxed`` here. Both rules trade exactness
for accepted tokens: the run is marked lossy, and the runner reports what it cost (``harness/cost.py``).

``p`` below is the target's distribution at a row: at temperature 0 the softmax of the row's logits (after the
run's logits processors) at temperature 1, the model's own distribution; above 0 the run's filtered
distribution (temperature, top-k, top-p), the one exact speculative sampling targets. ``x`` is a drafted token,
``q`` the drafter's proposal (one-hot for deterministic drafters).

* ``lenient`` (the ``lenience`` factor of lucidrains' speculative-decoding). His code scales the draft's
  probability by ``lenience`` in the ratio test, so values below 1 relax it there; here the factor multiplies
  the target's side instead, so ``lenience`` L >= 1 relaxes and 1 is the exact rule (his 0.5 is our 2).
  - above temperature 0: the child is accepted when ``u < min(1, L * p(x) / q(x))``; on rejection the next
    sibling is tried against the residual ``max(0, p - q)`` and the correction is drawn from the last residual
    (``verify.verify_tree_sampling`` with ``lenience``);
  - at temperature 0: accepted when ``L * p(x) >= max p``, i.e. its logit lies within ``ln L`` of the top
    logit (the greedy limit of the same ratio with the target's mode as the proposal). The argmax always
    passes, so a step accepts at least what exact verification would.
* ``typical`` (Medusa, Cai et al. 2024, ``evaluate_posterior``): accepted when
  ``p(x) > min(ε, δ * exp(-H(p)))`` with ``H`` the entropy of ``p`` (ε ``posterior_threshold``, δ
  ``posterior_alpha``). Medusa computes ``p`` at the sampling temperature and falls back to exact matching at
  temperature 0; here temperature 0 judges with the model's own distribution (temperature 1), or the rule
  would change nothing in a greedy race. The target's own token after the accepted path (Medusa's "first
  token" of the next step) is the argmax at temperature 0; above, it is drawn from ``p`` restricted to the
  tokens at or above the threshold (Medusa's typical sampling of that token; the argmax always qualifies).

Deterministic acceptance (typical at any temperature, lenient at temperature 0) checks every node of a tree at
its parent's row and keeps the deepest path whose nodes all pass, ties broken by the path's summed
log-probability (Medusa keeps the longest accepted candidate, ties by likelihood).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from decoding.sampling import probs as filtered_probs
from decoding.tree import TokenTree
from decoding.verify import Verdict, verify_tree_sampling


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """``p [R, V]`` -> ``[R]``: ``min(ε, δ * exp(-H(p)))``, the entropy in nats (zero-probability terms add 0)."""
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)                                   # [R]
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def node_probs(p: torch.Tensor, tree: TokenTree) -> torch.Tensor:
    """``p [1 + n, V]`` -> ``[n]``: each node's token's probability at its parent's row."""
    rows = torch.tensor([0 if parent < 0 else 1 + parent for parent in tree.parents], dtype=torch.long)
    return p[rows.to(p.device), torch.tensor(tree.tokens, dtype=torch.long, device=p.device)]


def passing(p: torch.Tensor, tree: TokenTree, params: Any) -> list[bool]:
    """Whether each node passes the deterministic test at its parent's row (``lenient`` or ``typical``)."""
    if not len(tree):
        return []
    px = node_probs(p, tree)                                                           # [n]
    rows = torch.tensor([0 if parent < 0 else 1 + parent for parent in tree.parents], dtype=torch.long,
                        device=p.device)
    if params.acceptance == "lenient":
        top = p.max(dim=-1).values[rows]                                               # [n]
        return (px * params.lenience >= top).tolist()
    threshold = typical_threshold(p, params.posterior_threshold, params.posterior_alpha)[rows]
    return (px > threshold).tolist()


def deepest_path(tree: TokenTree, ok: list[bool], logp: list[float]) -> list[int]:
    """The deepest node whose ancestors and itself all pass (``ok``), ties by summed ``logp``; its path."""
    reach: list[bool] = []
    score: list[float] = []
    best, best_key = -1, (0, 0.0)
    for i, parent in enumerate(tree.parents):        # parents come before their children
        reach.append(ok[i] and (parent < 0 or reach[parent]))
        score.append(logp[i] + (score[parent] if parent >= 0 else 0.0))
        key = (tree.depths[i], score[i])
        if reach[i] and key > best_key:
            best, best_key = i, key
    return tree.path(best) if best >= 0 else []


def _tried(tree: TokenTree, path: list[int], ok: list[bool]) -> list[tuple[int, bool]]:
    """The trace's checked nodes: the path, then below it the most promising child that failed (if any)."""
    tried = [(node, True) for node in path]
    kids = tree.children(path[-1] if path else -1)
    if kids:
        failed = [k for k in kids if not ok[k]]
        tried.append(((failed or kids)[0], False))
    return tried


def verify_deterministic(p: torch.Tensor, tree: TokenTree, params: Any, greedy: bool,
                         rng: Optional[torch.Generator], logits: Optional[torch.Tensor] = None) -> Verdict:
    """Typical acceptance, or lenient at temperature 0: ``p [1 + n, V]`` as the module docstring says."""
    ok = passing(p, tree, params)
    logp = [math.log(v) if v > 0 else -math.inf for v in node_probs(p, tree).tolist()] if len(tree) else []
    path = deepest_path(tree, ok, logp)
    row = 1 + path[-1] if path else 0
    if greedy:
        source = logits if logits is not None else p
        return Verdict(path, int(torch.argmax(source[row])), tried=_tried(tree, path, ok))
    threshold = typical_threshold(p[row:row + 1], params.posterior_threshold, params.posterior_alpha)[0]
    kept = torch.where(p[row] >= threshold, p[row], torch.zeros_like(p[row]))
    kept = kept / kept.sum()
    token = int(torch.multinomial(kept, 1, generator=rng))
    residual = kept if tree.children(path[-1] if path else -1) else None
    return Verdict(path, token, residual=residual, tried=_tried(tree, path, ok))


def verify_relaxed(logits: torch.Tensor, tree: TokenTree, params: Any, rng: Optional[torch.Generator],
                   q: Optional[torch.Tensor] = None, replacement: bool = False
                   ) -> tuple[Verdict, Optional[torch.Tensor]]:
    """Verify ``tree`` from the processed rows ``logits [1 + n, V]`` under ``params.acceptance`` (not exact).

    Returns (verdict, the target's filtered probabilities when sampling else None), as the exact path does.
    """
    if params.is_greedy:
        return verify_deterministic(logits.float().softmax(dim=-1), tree, params, True, rng, logits), None
    p_target = filtered_probs(logits, params)                                          # [1 + n, V]
    if params.acceptance == "lenient":
        return verify_tree_sampling(p_target, tree, q, rng, replacement, lenience=params.lenience), p_target
    return verify_deterministic(p_target, tree, params, False, rng), p_target
