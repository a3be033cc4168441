"""Turning logits into distributions and tokens.

The filters follow transformers' order (temperature, then top-k, then top-p) and
are applied identically to target and draft distributions, so speculative
sampling targets exactly the distribution plain sampling draws from.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from decoding.params import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to ``logits [..., V]``; filtered entries become -inf."""
    if params.temperature == 0:
        raise ValueError("temperature 0 means greedy; no distribution to filter")
    scores = logits / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]           # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        # keep a token if the mass strictly before it is below top_p (the first is always kept)
        drop_sorted = (cum - sorted_scores.softmax(dim=-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution that sampling with ``params`` draws from (float32, sums to 1)."""
    return filter_logits(logits.float(), params).softmax(dim=-1)


def sample(p: torch.Tensor, rng: Optional[torch.Generator]) -> int:
    """Draw one token id from a 1-D distribution with a seeded generator."""
    return int(torch.multinomial(p, 1, generator=rng).item())


def chooser(params: SamplingParams, rng: Optional[torch.Generator]) -> Callable[[torch.Tensor], int]:
    """How a loop picks a token from one position's logits ``[V]``: argmax at temperature 0, else a draw
    from the filtered distribution with the run's seeded generator."""
    if params.is_greedy:
        return lambda logits: int(torch.argmax(logits))
    return lambda logits: sample(probs(logits, params), rng)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen
