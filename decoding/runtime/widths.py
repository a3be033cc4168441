"""Widths from the machine's measured forward-cost curve: lookahead's window and Jacobi's block.

A wider lookahead window or Jacobi block commits more tokens per target forward, and makes that forward
wider. On a GPU a wide forward costs about a narrow one; on a CPU it may cost up to twice as much
(BENCHMARKS.md, "The cost of a wide forward"). So, as the prophet's measured tree budget does
(``drafting/budget.py``), the width is the one that maximizes expected tokens per unit of time:

    value(x) = E(x) / (c(T(x)) + STEP * c(1))         predicted speed-up over greedy = value(x) * c(1)

``c``: the target's verify forward over ``T`` positions, in ms, measured on this machine
(``forward_cost.py``); ``E(x)``: the tokens a forward is expected to commit at width ``x``; ``T(x)``: the
positions that forward holds; ``STEP``: the loop's own work a step beyond greedy's, 0.05 ``c(1)`` (what the
recorded races leave unexplained by the curve ranges from 0 to 0.17; ``harness/pays.py``). Greedy
commits 1 token per ``c(1)``. The models of ``E`` and ``T`` are simple, stated and conservative:

* **lookahead**, window ``W``, n-gram ``N``, guess set ``G``:
  ``E(W) = 1 + LOOKAHEAD_GAIN * min(1, (N - 1) / 3) * log2(1 + W)``: fitted to the recorded (W, N, G)
  sweep on the bundled model, 4 code and chat prompts (``bench-cpu-lookahead.md``, N = 4, G = 4:
  1.12 / 1.21 / 1.27 / 1.34 tokens per forward at W = 1 / 2 / 3 / 5; the formula gives 1.13 / 1.21 /
  1.26 / 1.34). ``T(W) = 1 + min(LOOKAHEAD_CANDIDATES, G * (N - 1)) + (N - 1) * W``: the key, the
  verified candidates (1.1-3.6 positions a step on three prompts, counted) and the window's cells. Its
  tree has ``W + 1`` root-to-leaf paths (a column each, and the candidates): a model whose verify rows
  are exact per path (bfloat16 weights) pays each path beyond the probe's two, ``ForwardCost.per_path_ms``.
  ``N`` stays the user's (default 4): at equal width N = 4 committed more than N = 3 in that sweep.
* **Jacobi**, block ``n`` (``hybrid``, ``gs_jacobi``): a block of ``n`` guesses is decided in about
  ``n`` forwards whose inputs shrink from ``n`` to 1 (the verified prefix is not fed again), so a forward
  costs ``mean(c(1), ..., c(n))`` on average; ``E(n) = 1 + JACOBI_GAIN[variant] * log2(n)`` (recorded:
  1.00-1.02 tokens per forward at blocks 2-16 for ``hybrid`` on the default example, 1.14 for
  ``sliding`` at block 8). ``sliding`` feeds its whole window every forward: ``T(n) = n``. ``jacobi``
  (PJ) has no block (its block is the whole length budget).

**Noise.** A measured curve says how sure each width's time is (``ForwardCost.spread``: the gap between its
fastest two timings). Two widths whose values differ by less than their forwards' spreads together are a
coin toss that another start of the same machine may call the other way, so the choice is the *narrowest*
width whose value is within that noise of the best one's (``best_within_noise``; the prophet's step shape uses it
too, ``harness/pays.choose_prophet_shape``): a wider width must win by more than the noise. On a curve without a
spread (injected) that is the plain best, ties going to the narrower.

``lookahead_window`` and ``jacobi_block`` resolve a run's width: a value the user gave (anything but 0)
always wins; 0 (the default) means *auto*: on a CPU the choice above on the loaded model's curve (timed
once per model and kept on it, ``forward_cost``); on any other device, or where no curve can be timed
(an encoder-decoder), the fixed ``FALLBACK``. Either way ``WidthChoice`` says what was chosen and why
(``shown``: ``window=auto→5``), and the strategies put it in their stats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from decoding.runtime.forward_cost import forward_cost

Cost = Callable[[float], float]          # c(T): ms for a verify forward over T positions

WINDOWS = tuple(range(1, 9))             # lookahead windows auto may choose
BLOCKS = tuple(range(2, 17))             # Jacobi blocks auto may choose (1 would be greedy itself)
LOOKAHEAD_GAIN = 0.13                    # E(W) = 1 + GAIN * min(1, (N-1)/3) * log2(1 + W)
LOOKAHEAD_CANDIDATES = 2.0               # verified candidate positions per step (capped by G * (N - 1))
JACOBI_GAIN = {"hybrid": 0.01, "gs_jacobi": 0.01, "sliding": 0.047, "jacobi": 0.047}
FALLBACK = {"window": 2, "block_size": 8}    # auto without a measured curve: the former fixed defaults
STEP = 0.05                              # a step's own work beyond greedy's, in units of c(1)
CURVE_WIDTH = 33                         # the widest forward the curve covers (also the prophet budget's)
ARROW = "\u2192"


@dataclass(frozen=True)
class WidthChoice:
    """One run's width and why: the user's value, the curve's choice, or the fallback."""
    name: str                    # the parameter: "window" | "block_size"
    value: int
    source: str                  # "user" | "curve" | "fallback"
    tokens_per_forward: float = 0.0    # E at that width (the model above)
    positions: float = 0.0             # mean positions of one forward at that width
    cost_ratio: float = 0.0            # c(positions) / c(1) (Jacobi: its mean forward's); 0 without a curve
    predicted_speedup: float = 0.0     # E / (cost_ratio + STEP); 0 where no curve was used

    def __post_init__(self) -> None:
        if self.source not in ("user", "curve", "fallback"):
            raise ValueError(f"source must be user, curve or fallback, got {self.source!r}")
        if not isinstance(self.value, int) or self.value < 1:
            raise ValueError(f"{self.name} must be a positive integer, got {self.value!r}")

    @property
    def auto(self) -> bool:
        return self.source != "user"

    @property
    def shown(self) -> str:
        """``window=5`` for the user's value, ``window=auto→5`` for the automatic one."""
        return f"{self.name}=auto{ARROW}{self.value}" if self.auto else f"{self.name}={self.value}"

    def record(self) -> dict:
        """Flat and JSON-friendly, for a run's stats."""
        return {"name": self.name, "value": self.value, "source": self.source, "shown": self.shown,
                "tokens_per_forward": round(self.tokens_per_forward, 4), "positions": round(self.positions, 2),
                "cost_ratio": round(self.cost_ratio, 4), "predicted_speedup": round(self.predicted_speedup, 4)}


# --------------------------------------------------------------------------- the models of E and T

def lookahead_tokens(window: int, ngram: int) -> float:
    """E(W): tokens a lookahead forward is expected to commit (see the module docstring)."""
    return 1.0 + LOOKAHEAD_GAIN * min(1.0, (ngram - 1) / 3) * math.log2(1 + window)


def lookahead_positions(window: int, ngram: int, guess_set: int) -> float:
    """T(W): the key, the verified candidates and the window's ``(N - 1) * W`` cells."""
    return 1.0 + min(LOOKAHEAD_CANDIDATES, guess_set * (ngram - 1)) + (ngram - 1) * window


def lookahead_paths(window: int) -> float:
    """Root-to-leaf paths of a lookahead forward's tree: one per window column, one for the candidates."""
    return window + 1.0


def tree_ms(cost: Cost, width: float, paths: float) -> float:
    """ms of a verify forward of ``width`` positions in ``paths`` root-to-leaf paths: the curve's own tree cost
    where it measured one (``ForwardCost.tree``: row-exact attention pays per path), else ``c(width)``."""
    tree = getattr(cost, "tree", None)
    return float(tree(width, paths)) if callable(tree) else float(cost(width))


def spread(cost: Cost, width: float) -> float:
    """Relative spread of ``cost(width)`` as measured (``ForwardCost.spread_at``); 0 for a curve without one."""
    at = getattr(cost, "spread_at", None)
    return float(at(width)) if callable(at) else 0.0


def spread_known(cost: Cost) -> bool:
    """Whether ``cost`` carries a measured spread (a margin of 0 on it means sure, not unknown)."""
    return bool(getattr(cost, "spread_known", False))


def ratio_spread(cost: Cost, width: float) -> float:
    """Relative spread of ``c(width) / c(1)``: both ends' (0 at one position, where the ratio is 1 exactly)."""
    return 0.0 if width <= 1 else spread(cost, width) + spread(cost, 1)


def jacobi_tokens(block: int, variant: str) -> float:
    """E(n): tokens a Jacobi forward is expected to commit; exactly 1 for a block of 1 (greedy)."""
    return 1.0 + JACOBI_GAIN.get(variant, JACOBI_GAIN["hybrid"]) * math.log2(block)


def jacobi_forward_ms(block: int, variant: str, cost: Cost) -> tuple[float, float]:
    """(mean positions, mean ms) of a Jacobi forward: inputs shrink n..1 in a block, or stay n (sliding)."""
    if variant == "sliding":
        return float(block), float(cost(block))
    return (block + 1) / 2, sum(float(cost(w)) for w in range(1, block + 1)) / block


def jacobi_forward_spread(block: int, variant: str, cost: Cost, ratio: bool = False) -> float:
    """Relative spread of ``jacobi_forward_ms``'s mean ms (``ratio``: of that mean over ``c(1)``): each width's
    own, weighted by its ms."""
    one = ratio_spread if ratio else spread
    widths = [block] if variant == "sliding" else list(range(1, block + 1))
    ms = [float(cost(w)) for w in widths]
    return sum(m * one(cost, w) for m, w in zip(ms, widths)) / sum(ms)


# --------------------------------------------------------------------------- the choice

def best_within_noise(name: str, options: Iterable[int],
                      score: Callable[[int], tuple[float, float, float, float]], one_ms: float,
                      step: float = STEP) -> WidthChoice:
    """The narrowest option whose tokens per ms is within the noise of the best one's; ``score(x)`` = (E,
    positions, forward ms, relative spread of that ms); each step also costs ``step * one_ms`` (0 where the
    score's ms is a whole step, timed: ``harness/pays.choose_prophet_shape``). Noise between
    two options: the sum of their step ms' spreads (``x`` loses to the best ``b`` only when ``value(x) * (1 +
    noise(x) + noise(b)) < value(b)``). Without spreads: the best, ties going to the narrower."""
    rows = []                                  # x, E, positions, step ms, forward ms, relative spread of step ms
    for x in sorted(options):
        tokens, positions, forward_ms, rel = score(x)
        if not (math.isfinite(forward_ms) and forward_ms > 0):
            raise ValueError(f"the forward-cost curve gave {forward_ms!r} ms at {positions:g} positions; "
                             f"it must be positive")
        ms = forward_ms + step * one_ms
        rows.append((x, tokens, positions, ms, forward_ms, rel * forward_ms / ms))
    if not rows:
        raise ValueError(f"{name}: no width to choose from")
    top = max(rows, key=lambda r: r[1] / r[3])                    # the first of the best: the narrowest
    x, tokens, positions, ms, forward_ms, _ = next(
        r for r in rows if r is top or r[1] / r[3] * (1 + r[5] + top[5]) >= top[1] / top[3])
    return WidthChoice(name, x, "curve", tokens, positions, forward_ms / one_ms, tokens * one_ms / ms)


def choose_window(cost: Cost, ngram: int = 4, guess_set: int = 4, windows: Iterable[int] = WINDOWS) -> WidthChoice:
    """Lookahead's window with the most expected tokens per ms on ``cost``, among the windows whose forward
    the curve covers (it is flat beyond its widest measured width; the narrowest window is always a choice)."""
    one = float(cost(1))
    widest = getattr(cost, "max_width", math.inf)
    windows = sorted(windows)
    windows = [w for w in windows if lookahead_positions(w, ngram, guess_set) <= widest] or windows[:1]

    def score(w: int) -> tuple[float, float, float, float]:
        t = lookahead_positions(w, ngram, guess_set)
        ms = tree_ms(cost, t, lookahead_paths(w))
        return lookahead_tokens(w, ngram), t, ms, spread(cost, t) * float(cost(t)) / ms
    return best_within_noise("window", windows, score, one)


def choose_block(cost: Cost, variant: str = "hybrid", blocks: Iterable[int] = BLOCKS) -> WidthChoice:
    """Jacobi's block with the most expected tokens per ms on ``cost``, among those the curve covers."""
    one = float(cost(1))
    widest = getattr(cost, "max_width", math.inf)
    blocks = sorted(blocks)
    blocks = [n for n in blocks if n <= widest] or blocks[:1]

    def score(n: int) -> tuple[float, float, float, float]:
        positions, ms = jacobi_forward_ms(n, variant, cost)
        return jacobi_tokens(n, variant), positions, ms, jacobi_forward_spread(n, variant, cost)
    return best_within_noise("block_size", blocks, score, one)


# --------------------------------------------------------------------------- a run's width

def machine_curve(lm: Any, fast: bool = False) -> Optional[Cost]:
    """The loaded model's measured curve where auto widths use one (a decoder-only model on a CPU), else None."""
    if getattr(lm.device, "type", str(lm.device)) != "cpu" or lm.is_encoder_decoder:
        return None
    return forward_cost(lm, CURVE_WIDTH, fast=fast)


def lookahead_window(lm: Any, params: Any, curve: Optional[Cost] = None) -> WidthChoice:
    """The window a lookahead run uses: the user's, else the curve's choice (``curve``: injected, tests)."""
    if params.window:
        return WidthChoice("window", int(params.window), "user")
    curve = curve if curve is not None else machine_curve(lm, params.fast)
    if curve is None:
        return WidthChoice("window", FALLBACK["window"], "fallback")
    return choose_window(curve, params.ngram, params.guess_set)


def jacobi_block(lm: Any, params: Any, curve: Optional[Cost] = None) -> WidthChoice:
    """The block a Jacobi run uses: the user's, else the curve's choice (``curve``: injected, tests)."""
    if params.block_size:
        return WidthChoice("block_size", int(params.block_size), "user")
    if params.variant == "jacobi":          # PJ has no block: its block is the whole length budget
        return WidthChoice("block_size", FALLBACK["block_size"], "fallback")
    curve = curve if curve is not None else machine_curve(lm, params.fast)
    if curve is None:
        return WidthChoice("block_size", FALLBACK["block_size"], "fallback")
    return choose_block(curve, params.variant)
