"""Jacobi parallel decoding (Santilli et al. 2023), lossless under greedy.

Guess a block of future tokens and refine every position at once: one forward
over [newest committed token] + guess computes, for each block position, the
greedy token given the guess before it. Position 0 is always right; position i
is right once the guesses before it are. Three variants:

* ``jacobi``: iterate the whole block to its fixed point, then commit it
  (or, after ``max_iterations``, commit the prefix known to be right);
* ``gs_jacobi``: commit the converged prefix after every iteration and slide
  the block forward (Gauss-Seidel style), refilling its tail;
* ``hybrid``: like ``jacobi``, but a block ends as soon as a verified token is EOS.

All three stop at EOS exactly like greedy. Works for decoder-only and
encoder-decoder models alike (``Session`` runs the encoder once; Jacobi
iterates on the decoder input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .events import JacobiIteration, TokenCommitted
from .lm import Session
from .params import check_bool, check_number
from .result import ModelPair, Result
from .strategies import Strategy
from .tracer import NULL_TRACER

VARIANTS = ("jacobi", "gs_jacobi", "hybrid")
INITS = ("pad", "repeat", "random")


@dataclass(frozen=True)
class JacobiParams:
    block_size: int = 8
    max_iterations: int = 16
    variant: str = "gs_jacobi"
    init: str = "repeat"
    fast: bool = False              # static KV cache + CUDA graphs (decoding/fastpath.py)
    CHOICES = {"variant": VARIANTS, "init": INITS}

    def __post_init__(self) -> None:
        check_number("block_size", self.block_size, 1, 64, integer=True)
        check_number("max_iterations", self.max_iterations, 1, 256, integer=True)
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        check_bool("fast", self.fast)


def _initial(params: JacobiParams, n: int, last: int, pad: int, vocab: int,
             rng: Optional[torch.Generator]) -> list[int]:
    if params.init == "pad":
        return [pad] * n
    if params.init == "repeat":
        return [last] * n
    return torch.randint(0, vocab, (n,), generator=rng, device="cpu" if rng is None else rng.device).tolist()


def jacobi(prompt_ids: Sequence[int], pair: ModelPair, params: JacobiParams, *, max_new_tokens: int,
           tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None) -> Result:
    lm = pair.target
    target = Session(lm, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + params.block_size)
    eos = set(lm.eos_token_ids)
    pad = lm.model.generation_config.pad_token_id
    pad = pad if pad is not None else (min(eos) if eos else 0)
    vocab = lm.vocab_size
    logits = target.prefill(prompt_ids)[0]
    out = [int(logits.argmax())]
    if tracer.enabled:
        tracer.emit(TokenCommitted(step=1, position=0, token=out[0], source="greedy",
                                   prob=float(logits.softmax(-1)[out[0]])))
    iterations, blocks = 0, 0
    stop_at_eos = params.variant == "hybrid"

    def commit(tokens: list[int], step: int) -> bool:
        """Append verified tokens; True when generation must stop."""
        for i, tok in enumerate(tokens):
            out.append(tok)
            if tracer.enabled:
                tracer.emit(TokenCommitted(step=step, position=len(out) - 1, token=tok,
                                           source="greedy" if i == 0 else "jacobi"))
            if tok in eos or len(out) >= max_new_tokens:
                return True
        return False

    done = out[-1] in eos or len(out) >= max_new_tokens
    while not done:
        # 1. a new block of guesses after the newest committed token
        size = min(params.block_size, max_new_tokens - len(out))
        guess = _initial(params, size, out[-1], pad, vocab, rng)
        base, start, it = target.length, len(out), 0
        blocks += 1
        while not done:
            # 2. one parallel refinement: row i is greedy's token given out + guess[:i]
            logits = target.forward(target.tensor([[out[-1]] + guess[:-1]]), kind="jacobi")[0]   # [size, V]
            new = logits.argmax(-1).tolist()
            it += 1
            iterations += 1
            right = 1
            while right < len(new) and new[right - 1] == guess[right - 1]:
                right += 1                      # new[:right] is exactly greedy's continuation
            if stop_at_eos:
                hit = next((i for i in range(right) if new[i] in eos), None)
                right = right if hit is None else hit + 1
            if tracer.enabled:
                probs = logits.softmax(-1).gather(1, torch.tensor(new, device=logits.device)[:, None])[:, 0]
                tracer.emit(JacobiIteration(step=target.forwards, block=blocks, iteration=it, start=start,
                                            guess=tuple(new), converged=right,
                                            probs=tuple(round(float(p), 5) for p in probs)))
            converged = new == guess or right == len(new)
            eos_seen = params.variant != "jacobi" and any(t in eos for t in new[:right])
            if params.variant == "gs_jacobi" or converged or eos_seen or it >= params.max_iterations:
                # 3. commit what is verified; keep the cache of the inputs that were right
                done = commit(new[:right], target.forwards)
                target.crop(base + right)
                if params.variant == "gs_jacobi" and not done and right < len(new):
                    base, guess = target.length, new[right:]   # slide: keep refining the unverified tail
                    guess += _initial(params, size - len(guess), guess[-1], pad, vocab, rng)[:size - len(guess)]
                    size = min(size, max_new_tokens - len(out))
                    guess = guess[:size]
                    if size <= 0:
                        done = True
                    continue
                break
            # plain / hybrid Jacobi: refine the whole block again from the same prefix
            target.crop(base)
            guess = new
    return Result(out, target.forwards, stats={
        "iterations": iterations, "blocks": blocks,
        "step_compression": round(len(out) / target.forwards, 4),
        "mean_tokens_per_target_forward": round(len(out) / target.forwards, 4)},
        stop_reason="eos" if out[-1] in eos else "max_new_tokens")


STRATEGIES = [Strategy("jacobi", JacobiParams, jacobi, lossless=True, label="Jacobi",
                       description="Refine a block of guessed tokens in parallel until it stops changing.")]
