"""What a lossy run cost (``acceptance`` lenient or typical, ``decoding/relaxed.py``), for the runner.

* At temperature 0, against the greedy reference of the same comparison: ``first_divergence``, the first
  position where the tokens differ, and ``differing_tokens``, how many positions differ. Position ``i`` differs
  when the two outputs hold different tokens there, or only one of them reaches it (a length difference counts
  every position past the shorter output). Once the texts part, later positions compare shifted text, so the
  count is a plain, reproducible upper measure of the change, not an edit distance.
* Above temperature 0 (any run that samples, so exact runs give the baseline to compare with):
  ``target_logprob``, the mean log-probability of the generated tokens under the target's own distribution
  (the softmax of its logits after the run's logits processors, at temperature 1), from one untimed forward
  over the prompt and the output.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from decoding.context import RunContext
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """The first position where ``a`` and ``b`` differ (a length difference included), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def differing_tokens(a: Sequence[int], b: Sequence[int]) -> int:
    """Positions where ``a`` and ``b`` hold different tokens, or where only one of them has a token."""
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def mean_target_logprob(pair: ModelPair, prompt_ids: Sequence[int], tokens: Sequence[int],
                        context: Optional[RunContext], max_new_tokens: int) -> Optional[float]:
    """The mean of ``log p_target(token_i | prompt, tokens[:i])`` over ``tokens`` (None when there are none)."""
    if not tokens:
        return None
    session = Session(pair.target)
    first = session.prefill(list(prompt_ids))                                     # [1, V]
    rows = [first]
    if len(tokens) > 1:
        rows.append(session.forward(session.tensor([list(tokens[:-1])]))[0])       # [n - 1, V]
    logits = torch.cat(rows).float()                                               # [n, V]
    proc = (context or RunContext()).processors(pair.target, prompt_ids, max_new_tokens)
    if proc is not None:
        logits = proc.rows([list(tokens[:i]) for i in range(len(tokens))], logits)
    logp = logits.log_softmax(dim=-1)
    index = torch.tensor(list(tokens), dtype=torch.long, device=logp.device)
    picked = logp[torch.arange(len(tokens), device=logp.device), index]
    return round(float(picked.mean()), 6)
