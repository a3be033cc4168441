"""Held-out measures of a consistency-trained model, as training goes.

* ``teacher_forced``: the losses and the share of state positions already mapped to the fixed point
  (``state_acc``) on held-out trajectories, no gradient;
* ``decode``: the real thing on held-out prompts: the default Jacobi's tokens per target forward
  (every run checked token-identical to the model's own greedy) and how far the model's greedy
  answers moved from the base model's (position-wise agreement, and the common prefix).
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Sequence

import torch

from decoding.params import GreedyParams, JacobiParams
from decoding.runtime.models import wrap_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi
from playground.training.consistency import Weights, losses


@torch.no_grad()
def teacher_forced(model: Any, records: Sequence[dict], weights: Weights, per_block: int = 4,
                   batch: int = 4) -> dict:
    was = model.training
    model.eval()
    rng = random.Random(0)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for i in range(0, len(records), batch):
        out = losses(model, records[i:i + batch], weights, per_block, rng)
        for k, v in out.items():
            if k not in ("loss", "states", "tokens", "hard_rows"):
                n = out["hard_rows"] if k == "hard_acc" else out["states"]
                sums[k] = sums.get(k, 0.0) + v * n
                counts[k] = counts.get(k, 0) + n
    model.train(was)
    return {k: round(v / max(counts[k], 1), 4) for k, v in sums.items()}


def agreement(a: Sequence[int], b: Sequence[int]) -> tuple[float, int]:
    """(share of positions equal over the longer answer, common prefix length)."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b), 1), prefix


EVAL_BLOCK = 8       # Jacobi's block in evaluations (its default before auto widths, runtime/widths.py)


@torch.no_grad()
def decode(model: Any, tokenizer: Any, items: Sequence[dict], max_new: int) -> dict:
    """Jacobi (defaults, block 8: a fixed block, so evaluations compare across machines and no curve is timed on
    a model being trained) vs the model's own greedy on ``items`` (``{prompt, answer}``: base answers)."""
    was = model.training
    model.eval()
    lm = wrap_model(model, tokenizer, name="training")
    pair = ModelPair(lm)
    tpf, agree, prefix, exact = [], [], [], 0
    for item in items:
        ref = greedy(item["prompt"], pair, GreedyParams(), max_new_tokens=max_new)
        res = jacobi(item["prompt"], pair, JacobiParams(block_size=EVAL_BLOCK), max_new_tokens=max_new)
        exact += res.token_ids == ref.token_ids
        tpf.append(len(res.token_ids) / res.target_forwards)
        share, common = agreement(ref.token_ids, list(item["answer"])[:max_new])
        agree.append(share)
        prefix.append(common)
    model.train(was)
    return {"tokens_per_forward": round(statistics.median(tpf), 4), "tpf_mean": round(statistics.mean(tpf), 4),
            "agree_base": round(statistics.mean(agree), 4), "common_prefix": round(statistics.mean(prefix), 2),
            "exact": f"{exact}/{len(items)}"}
