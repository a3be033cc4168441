"""Verifying a draft against the target: pure functions, no model calls.

Naming, because the papers and codebases swap p and q: ``p_target`` is the
target model's distribution, ``q_draft`` the drafter's.

Rows: the verify forward feeds the root (the newest committed token) and then
the draft's nodes, so target row 0 predicts what follows the root and row
``1 + i`` what follows node ``i``. A chain is the tree whose parents are ``i-1``.

* Greedy verification: walk down from the root, each time taking the child
  whose token equals the target's argmax at the current row; where no child
  does, the target's argmax there is the correction (or, at a leaf, the bonus).
  The committed tokens are exactly greedy's.
* Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), generalized
  to several candidates per position by recursive rejection sampling (SpecInfer,
  Miao et al. 2024; SpecTr, Sun et al. 2023; RRS, Jeon et al. 2024). At a node
  with current target ``p``, the children are tried in order: child ``x`` with
  proposal ``q`` is accepted with probability ``min(1, p(x) / q(x))``; on
  rejection ``p`` becomes the normalized residual ``max(0, p - q)`` and the next
  child is tried. If no child is accepted, the correction is drawn from the last
  residual; below an accepted leaf, the bonus is drawn from the target.
  Each child's proposal is the distribution it was drawn from:
  - ``q_draft[c]`` with the earlier siblings' tokens removed and renormalized,
    for siblings drawn one after another without replacement (``replacement=False``);
  - ``q_draft[c]`` itself, for siblings drawn independently (``replacement=True``);
  - one-hot on its token when the drafter is deterministic (``q_draft`` None).
  Each step is a single-draft speculative sampling step whose proposal is fixed
  before its token is drawn, so the output is distributed exactly as the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from decoding.tree import TokenTree


@dataclass
class Verdict:
    """The accepted path (node indices from depth 1 down) and the token the target adds after it."""
    path: list[int]
    next_token: int
    us: list[float] = field(default_factory=list)          # uniform draws, in the order children were tried
    residual: Optional[torch.Tensor] = None                 # [V] distribution a correction was drawn from
    tried: list[tuple[int, bool]] = field(default_factory=list)   # (node, accepted) in the order checked

    @property
    def n_accepted(self) -> int:
        return len(self.path)


# --------------------------------------------------------------------------- greedy

# ``[rows, V] -> [rows]`` first-maximum indices; ``decoding.runtime.attention_kernels`` puts its kernel here once it
# is loaded (PyTorch's CPU argmax costs ~10x a max over a wide forward's logits), with the same indices
_ARGMAX: list = [lambda x: x.argmax(dim=-1)]


def use_argmax(fn) -> None:
    """Greedy verification's argmax from now on (the same indices as ``torch.argmax``, faster)."""
    _ARGMAX[0] = fn


def verify_tree_greedy(target_logits: torch.Tensor, tree: TokenTree) -> Verdict:
    """``target_logits [1 + n, V]`` (row 0: after the root, row 1 + i: after node i)."""
    best = _ARGMAX[0](target_logits).tolist()                                  # [1 + n]
    path: list[int] = []
    tried: list[tuple[int, bool]] = []
    node, row = -1, 0
    while True:
        kids = tree.children(node)
        child = tree.child_with(node, best[row])
        if child is None:
            if kids:
                tried.append((kids[0], False))   # the drafter's first choice, for the trace
            return Verdict(path, int(best[row]), tried=tried)
        tried.append((child, True))
        path.append(child)
        node, row = child, 1 + child


def verify_greedy(target_logits: torch.Tensor, tokens: Sequence[int]) -> Verdict:
    """A chain draft: ``target_logits [k + 1, V]``, row i predicts the token after draft position i-1."""
    return verify_tree_greedy(target_logits, TokenTree.chain(tokens))


# --------------------------------------------------------------------------- sampling

def residual_distribution(p_row: torch.Tensor, q_row: Optional[torch.Tensor], token: int) -> torch.Tensor:
    """Normalized max(0, p_target - q_draft); q None means one-hot on ``token``."""
    if q_row is None:
        res = p_row.clone()
        res[token] = 0.0
    else:
        res = (p_row - q_row).clamp_min(0.0)
    total = res.sum()
    if not torch.isfinite(total) or total <= 0:   # p == q up to rounding: any draw from p is exact
        return p_row
    return res / total


def _without(q_row: torch.Tensor, tokens: list[int]) -> Optional[torch.Tensor]:
    """``q_row`` with ``tokens`` removed and renormalized (None if nothing is left)."""
    if not tokens:
        return q_row
    q = q_row.clone()
    q[tokens] = 0.0
    total = q.sum()
    return q / total if total > 0 else None


def verify_tree_sampling(p_target: torch.Tensor, tree: TokenTree, q_draft: Optional[torch.Tensor],
                         rng: Optional[torch.Generator], replacement: bool = False,
                         lenience: float = 1.0) -> Verdict:
    """``p_target [1 + n, V]`` and ``q_draft [n, V]`` (or None) are filtered, normalized distributions.

    ``lenience`` above 1 accepts a child when ``u < min(1, lenience * p(x) / q(x))``: lossy, the ``lenient``
    acceptance of ``decoding/relaxed.py``; 1 is the exact rule above.
    """
    path: list[int] = []
    us: list[float] = []
    tried: list[tuple[int, bool]] = []
    node, row = -1, 0
    while True:
        p = p_target[row]
        kids = tree.children(node)
        chosen = None
        drawn: list[int] = []                         # earlier siblings' tokens
        for c in kids:
            x = tree.tokens[c]
            if q_draft is None:
                q = None                              # deterministic: one-hot on x
                q_x = 1.0
            else:
                q = q_draft[c] if replacement else _without(q_draft[c], drawn)
                q_x = 0.0 if q is None else float(q[x])
            u = float(torch.rand((), generator=rng, device=p_target.device))
            us.append(u)
            if q_x > 0 and u < min(1.0, lenience * float(p[x]) / q_x):
                chosen = c
                tried.append((c, True))
                break
            tried.append((c, False))
            if q is not None or q_draft is None:
                p = residual_distribution(p, q, x)
            drawn.append(x)
        if chosen is None:
            token = int(torch.multinomial(p, 1, generator=rng))
            return Verdict(path, token, us, p if kids else None, tried)
        path.append(chosen)
        node, row = chosen, 1 + chosen


def verify_sampling(p_target: torch.Tensor, q_draft: Optional[torch.Tensor], tokens: Sequence[int],
                    rng: Optional[torch.Generator]) -> Verdict:
    """A chain draft: ``p_target [k+1, V]``, ``q_draft [k, V]`` (or None: deterministic)."""
    return verify_tree_sampling(p_target, TokenTree.chain(tokens), q_draft, rng)
