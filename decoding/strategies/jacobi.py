"""Jacobi parallel decoding (Santilli et al. 2023, arXiv 2305.10427), lossless under greedy.

Greedy decoding solves, position after position, y_i = argmax p(. | prompt, y_<i).
Jacobi decoding guesses a block y^0 of n future tokens and refines every position
at once: one forward over [newest decoded token] + y^(k-1)[:n-1] gives

    y^k_i = argmax p(. | prompt, decoded, y^(k-1)_<i)     for every i in the block.

Position 0 is right after one iteration and position i after at most i + 1, so
a block is greedy's after n iterations; often sooner, because a guess can be
right before the tokens it depends on are (the dependency structure the paper's
DDGviz shows). A fixed point y^k = y^(k-1) satisfies greedy's equations, so it
*is* greedy's continuation.

Stopping rule, as the paper states it: a block stops at the first iteration k
with y^k = y^(k-1), or after n iterations (its loop bound; the block is greedy's
by then). This usually takes one iteration more than "every position verified"
(inputs equal to outputs but for the last position), which the loop of earlier
versions used. ``max_iterations`` caps the iterations of one block further: a
block cut short commits only its verified prefix and the next block starts
there, so the output stays exact.

Variants (the first three are the paper's, named as it names them):

* ``jacobi`` (the paper's PJ): one block spanning the whole length budget
  (``max_new_tokens`` after the first token; ``block_size`` is not used),
  iterated to its fixed point. Like the paper's PJ it decodes a fixed length:
  it does not look for EOS while iterating, and positions after an EOS are
  decoded too. The output is greedy's, cut after the first EOS.
* ``gs_jacobi`` (PGJ): blocks of ``block_size`` in sequence over the same fixed
  length, Jacobi inside each block (Gauss-Seidel across blocks). Also decodes
  past EOS, as the paper's PGJ decodes a given length.
* ``hybrid`` (HGJ): GS-Jacobi blocks that stop at the first block whose fixed
  point holds an EOS, the paper's answer to an unknown target length. The
  paper's fall-back to one-token steps beyond its length guess never applies
  here, where the length limit is hard (``max_new_tokens``).
* ``sliding`` (ours, not in the paper): a window of ``block_size`` guesses that
  slides. After every forward it commits the longest prefix of the window that
  this forward left unchanged (y^k_i = y^(k-1)_i for every i of the prefix:
  the paper's rule applied prefix by prefix; when the whole window is
  unchanged, that is the paper's rule for the whole window), then slides: the
  changed tail is refined again and refilled with init tokens up to
  ``block_size``. The first uncommitted token is always verified, so it
  commits on the next forward. A new window (fresh init) opens only when a
  forward commits the whole window, or when ``max_iterations`` forwards have
  refined it; then the verified prefix is committed instead.

The default is ``hybrid`` with ``pad`` init: the paper's algorithm for text of
unknown length (ours: chat replies end at EOS), its blocks show the Jacobi
fixed point block by block, and it stops at EOS like every other strategy, so
its forward counts and timings compare fairly. ``pad`` is the paper's
initialisation. Works for decoder-only and encoder-decoder models alike
(``Session`` runs the encoder once; Jacobi iterates on the decoder input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from decoding.commit import Output
from decoding.context import RunContext, processors
from decoding.events import JacobiIteration
from decoding.params import JacobiParams
from decoding.result import Result
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.runtime.widths import jacobi_block
from decoding.strategies.stages import first_token, trace_width
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER


def verified(prev: Sequence[int], new: Sequence[int]) -> int:
    """How many leading tokens of ``new`` are provably greedy's.

    ``new`` came from inputs [decoded token] + ``prev[:-1]``; output i is greedy's when
    inputs 1..i were, i.e. when ``prev[:i] == new[:i]``. Output 0 always is.
    """
    right = 1
    while right < len(new) and new[right - 1] == prev[right - 1]:
        right += 1
    return right


def unchanged(prev: Sequence[int], new: Sequence[int]) -> int:
    """Length of the longest common prefix: the positions where y^k = y^(k-1)."""
    same = 0
    while same < len(new) and new[same] == prev[same]:
        same += 1
    return same


@dataclass
class _Run:
    """One generation's state: the session, the output and every decoded token."""
    target: Session
    out: Output
    params: JacobiParams
    tracer: Any
    pad: int
    vocab: int
    rng: Optional[torch.Generator]
    max_new_tokens: int
    block: int = 1                                     # block (window) size: the user's, or auto's choice
    proc: Any = None                                   # logits processors (processors.Processors), if any
    decoded: list[int] = field(default_factory=list)   # output, then (jacobi, gs_jacobi) past EOS
    iterations: int = 0
    blocks: int = 0
    per_block: list = field(default_factory=list)     # [iterations, tokens decided] of each block or window

    def init(self, n: int, last: int) -> list[int]:
        if n <= 0:
            return []
        if self.params.init == "pad":
            return [self.pad] * n
        if self.params.init == "repeat":
            return [last] * n
        device = "cpu" if self.rng is None else self.rng.device
        return torch.randint(0, self.vocab, (n,), generator=self.rng, device=device).tolist()

    def refine(self, inputs: list[int], guess: list[int], offset: int = 0) -> tuple[list[int], list[float]]:
        """One forward over ``inputs`` after the cache: argmax and its probability per position.

        Output ``j`` is block position ``offset + j``: it continues the decoded tokens
        plus ``guess[:offset + j]`` (the context its logits processors see).
        """
        logits = self.target.forward(self.target.tensor([inputs]), kind="jacobi")[0]   # [T, V]
        if self.proc is not None:
            logits = self.proc.rows([self.decoded + guess[:offset + j] for j in range(len(inputs))], logits)
        tokens = logits.argmax(-1)                                                    # [T]
        probs: list[float] = []
        if self.tracer.enabled:
            probs = [round(float(p), 5) for p in logits.softmax(-1).gather(1, tokens[:, None])[:, 0]]
        self.iterations += 1
        return tokens.tolist(), probs

    def emit(self, iteration: int, start: int, guess: list[int], right: int, committed: int,
             probs: list[float]) -> None:
        if self.tracer.enabled:
            self.tracer.emit(JacobiIteration(step=self.target.forwards, block=self.blocks, iteration=iteration,
                                             start=start, guess=tuple(guess), converged=right,
                                             probs=tuple(probs), committed=committed))

    def tally(self, decided: int) -> None:
        """Count one iteration, and the tokens it decided, for the current block (or window)."""
        if len(self.per_block) < self.blocks:
            self.per_block.append([0, 0])
        self.per_block[-1][0] += 1
        self.per_block[-1][1] += decided

    def accept(self, tokens: list[int]) -> None:
        """Tokens decoded for good: into ``decoded``, and into the output until EOS or the limit."""
        self.decoded += tokens
        self.out.commit(tokens, self.target.forwards, ["greedy"] + ["jacobi"] * (len(tokens) - 1))


def _solve_block(run: _Run, n: int) -> int:
    """Jacobi on one block of ``n`` guesses after the newest decoded token; returns tokens accepted.

    Stops on the paper's rule (y^k = y^(k-1)), its bound (k = n) or ``max_iterations``
    (then only the verified prefix is accepted). Each forward feeds only the inputs
    whose outputs may still change: those after the verified prefix. Once every
    position is verified, y^k = y^(k-1) is certain, but the paper's rule still spends
    the forward that observes it: that is the iteration it costs over "all verified".
    """
    base, start, last = run.target.length, len(run.decoded), run.decoded[-1]
    prev = run.init(n, last)                     # y^0
    prev_probs = [0.0] * n
    right = 0                                    # leading outputs of the last iteration known greedy's
    for k in range(1, n + 1):
        # 1. y^k: outputs [0, right) cannot change (same inputs), so feed inputs from there on; at
        #    least the last one, so that the confirming iteration of the paper's rule is a real forward
        keep = min(right, n - 1)
        run.target.crop(base + keep)
        tail, tail_probs = run.refine(([last] + prev[:-1])[keep:], prev, keep)
        new, probs = prev[:keep] + tail, prev_probs[:keep] + tail_probs
        # 2. the paper's rule, its loop bound, or our cap
        stop = new == prev or k == n or k >= run.params.max_iterations
        right = verified(prev, new)
        count = right if stop else 0                 # = n unless cut short by max_iterations
        run.emit(k, start, new, right, count, probs)
        run.tally(count)
        if stop:
            # 3. the cached inputs [last] + new[:count-1] are greedy's: keep them
            run.target.crop(base + count)
            run.accept(new[:count])
            return count
        prev, prev_probs = new, probs
    raise AssertionError("unreachable: a block stops after n iterations")


def _blocks(run: _Run) -> None:
    """jacobi, gs_jacobi and hybrid: blocks in sequence (one block for jacobi)."""
    variant = run.params.variant
    while len(run.decoded) < run.max_new_tokens and not (variant == "hybrid" and run.out.done):
        room = run.max_new_tokens - len(run.decoded)
        run.blocks += 1
        _solve_block(run, room if variant == "jacobi" else min(run.block, room))


def _sliding(run: _Run) -> None:
    """Our sliding window: commit the unchanged prefix after every forward, slide, refill."""
    size = run.block
    guess: list[int] = []
    k = 0
    while not run.out.done:
        room = run.max_new_tokens - len(run.decoded)
        last = run.decoded[-1]
        if not guess:                                   # 1. open a window of fresh guesses
            run.blocks, k = run.blocks + 1, 0
            guess = run.init(min(size, room), last)
        # 2. one Jacobi iteration over the window
        base, start = run.target.length, len(run.decoded)
        new, probs = run.refine([last] + guess[:-1], guess)
        k += 1
        right = verified(guess, new)
        cut = k >= run.params.max_iterations
        count = right if cut else unchanged(guess, new)
        run.emit(k, start, new, right, count, probs)
        run.tally(count)
        # 3. commit and keep the cache of the inputs [last] + new[:count-1]
        run.target.crop(base + count)
        run.accept(new[:count])
        # 4. slide: the changed tail is refined again, refilled to the window size
        rest = [] if cut else new[count:]
        n = min(size, room - count)
        guess = (rest + run.init(n - len(rest), rest[-1]))[:n] if rest else []


def jacobi(prompt_ids: Sequence[int], pair: ModelPair, params: JacobiParams, *, max_new_tokens: int,
           tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
           context: Optional[RunContext] = None) -> Result:
    lm = pair.target
    chosen = jacobi_block(lm, params)               # the user's block, or auto: from the measured curve
    trace_width(tracer, chosen)
    target = Session(lm, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + chosen.value + 1)
    eos = set(lm.eos_token_ids)
    run = _Run(target, Output(eos, max_new_tokens, tracer), params, tracer, lm.pad_token_id, lm.vocab_size, rng,
               max_new_tokens, block=chosen.value,
               proc=processors(context, lm, prompt_ids, max_new_tokens))
    first = first_token(target, prompt_ids, run.out, run.proc, lambda logits: int(logits.argmax()), "greedy")
    run.decoded.append(first)
    (_sliding if params.variant == "sliding" else _blocks)(run)
    n = len(run.out)
    return Result(list(run.out.tokens), target.forwards, stats={
        "iterations": run.iterations, "blocks": run.blocks,
        "block_size": chosen.value, "width_choice": chosen.record(),
        "mean_tokens_per_target_forward": round(n / target.forwards, 4),
        # per block (per window for sliding): its iterations and the tokens they decided (past EOS too)
        "iterations_per_block": [b[0] for b in run.per_block], "tokens_per_block": [b[1] for b in run.per_block],
        "mean_iterations_per_block": round(run.iterations / max(1, len(run.per_block)), 4)},
        stop_reason=run.out.stop_reason)


STRATEGIES = [Strategy("jacobi", JacobiParams, jacobi, lossless=True, label="Jacobi",
                       description="Refine a block of guessed tokens in parallel until an iteration changes "
                                   "none of them (Santilli et al. 2023); variants jacobi, gs_jacobi, hybrid "
                                   "and our sliding window.")]
