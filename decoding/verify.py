"""Verifying a draft against the target: pure functions, no model calls.

Naming, because the papers and codebases swap p and q: ``p_target`` is the
target model's distribution, ``q_draft`` the drafter's.

* Greedy verification (temperature 0 or no draft probabilities needed): accept
  drafted tokens while they equal the target's argmax; the first mismatch is
  replaced by the target's argmax (a correction), and a fully accepted draft
  earns the target's next argmax (a bonus). The output equals plain greedy.
* Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept token x
  with probability min(1, p_target(x) / q_draft(x)); on rejection sample from the
  normalized residual max(0, p_target - q_draft). A drafter without
  probabilities (prompt lookup) is deterministic: q_draft is one-hot on its token.
  The committed tokens are then distributed exactly as sampling from the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class Verdict:
    n_accepted: int                 # drafted tokens accepted (a prefix of the draft)
    next_token: int                 # correction (n < k) or bonus (n == k)
    us: list[float] = field(default_factory=list)   # uniform draws, one per checked token (sampling)
    residual: Optional[torch.Tensor] = None          # [V] distribution the correction was drawn from


def verify_greedy(target_logits: torch.Tensor, tokens: list[int]) -> Verdict:
    """``target_logits [k+1, V]``: row i predicts the token after draft position i-1."""
    best = target_logits.argmax(dim=-1).tolist()                       # [k+1]
    n = 0
    while n < len(tokens) and tokens[n] == best[n]:
        n += 1
    return Verdict(n, int(best[n]))


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


def verify_sampling(p_target: torch.Tensor, q_draft: Optional[torch.Tensor], tokens: list[int],
                    rng: Optional[torch.Generator]) -> Verdict:
    """``p_target [k+1, V]`` and ``q_draft [k, V]`` (or None) are filtered, normalized distributions."""
    us: list[float] = []
    for i, x in enumerate(tokens):
        p = float(p_target[i, x])
        q = float(q_draft[i, x]) if q_draft is not None else 1.0
        u = float(torch.rand((), generator=rng, device=p_target.device))
        us.append(u)
        if q > 0 and u < min(1.0, p / q):
            continue
        residual = residual_distribution(p_target[i], None if q_draft is None else q_draft[i], x)
        token = int(torch.multinomial(residual, 1, generator=rng))
        return Verdict(i, token, us, residual)
    bonus = int(torch.multinomial(p_target[len(tokens)], 1, generator=rng))
    return Verdict(len(tokens), bonus, us)
