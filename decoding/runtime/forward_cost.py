"""What one verify forward over T positions costs on this machine: a measured curve c(T), kept per model.

The prophet's measured tree budget (``drafting/budget.py``) weighs the tokens a
bigger tree is expected to add against what the wider verify forward costs. That
cost depends on the machine, the model and its kernels (on a CPU each bucket of
row counts may run another linear kernel, ``kernel_choice.py``; on a GPU a wide
forward costs about a narrow one), so it is measured, not assumed.

``forward_cost(lm, max_width)`` times the target's own verify forward
(``attention.tree_forward``: the newest token plus a tree of T - 1 nodes, every
row's logits and the last hidden states, as the prophet's loop runs it) after a
prefill of ``CONTEXT`` tokens, for the widths of ``GRID`` up to ``max_width``
(both sides of every CPU kernel bucket edge, so interpolation never straddles a
kernel switch). One warm-up pass, then ``REPEATS`` passes with the widths in
rotating order; each width keeps its fastest time (a busy machine only adds
time). On CUDA every timed forward sits between synchronisations. A few seconds
on the CPU for a 135M model, once: the curve hangs on the loaded model
(``LoadedModel.state.forward_cost``, per fast-path flag) and dies with it.
A curve that covers fewer widths than asked is measured again, wider.

``ForwardCost`` is the curve itself: milliseconds at the measured widths,
linear in between, flat beyond the ends. Tests inject their own.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from decoding.runtime.attention import supports_trees, tree_forward
from decoding.runtime.session import Session
from decoding.tree import TokenTree

# Widths (root + nodes) timed, up to the asked maximum. 1 | 2-3 | 4-9 | 10-17 | 18-64 | 65+ are the CPU
# kernel buckets (kernels.BUCKETS): both sides of each edge are measured.
GRID = (1, 2, 3, 4, 6, 9, 10, 13, 17, 18, 25, 33, 48, 64, 65)
CONTEXT = 128            # cached positions before the timed forward: a prompt plus some answer
PROBE_PATHS = 2          # root-to-leaf paths of the probe trees (``_probe_tree``: a root branching in two)
STAR = 9                 # width of the star tree (the root and STAR - 1 leaves) that times the cost of a path
REPEATS = 3

Timer = Callable[[Callable[[], Any]], float]


@dataclass(frozen=True)
class ForwardCost:
    """c(T) in ms: ``points`` maps measured widths to ms; linear in between, flat beyond the ends."""
    points: Mapping[int, float]
    source: str = "injected"          # measured | injected
    seconds: float = 0.0              # time the measurement took
    context: int = 0
    # ms a verify forward costs per root-to-leaf path of its tree beyond the probe's PROBE_PATHS: 0 where a tree's
    # rows cost what a chain's do; row-exact attention (bfloat16 weights, gqa_attention.rows_sdpa_forward) lays
    # out each path's keys apart and pays per path. Measured with a star tree (``calibrate``).
    per_path_ms: float = 0.0
    _xs: tuple = field(init=False, repr=False, compare=False)
    _ys: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a forward-cost curve needs at least one measured width")
        xs = tuple(sorted(int(t) for t in self.points))
        if xs[0] < 1:
            raise ValueError(f"widths must be at least 1, got {xs[0]}")
        ys = tuple(float(self.points[t]) for t in xs)
        bad = [(t, y) for t, y in zip(xs, ys) if not (math.isfinite(y) and y > 0)]
        if bad:
            raise ValueError(f"forward costs must be positive finite ms, got {bad[0][1]!r} at T={bad[0][0]}")
        if not (math.isfinite(self.per_path_ms) and self.per_path_ms >= 0):
            raise ValueError(f"per_path_ms must be a finite number >= 0, got {self.per_path_ms!r}")
        object.__setattr__(self, "_xs", xs)
        object.__setattr__(self, "_ys", ys)

    @property
    def max_width(self) -> int:
        return self._xs[-1]

    def __call__(self, width: float) -> float:
        xs, ys = self._xs, self._ys
        if width <= xs[0]:
            return ys[0]
        if width >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, width)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (width - x0) / (x1 - x0)

    def tree(self, width: float, paths: float) -> float:
        """ms of a verify forward of ``width`` positions whose tree has ``paths`` root-to-leaf paths."""
        return self(width) + max(0.0, paths - PROBE_PATHS) * self.per_path_ms

    def record(self) -> dict:
        """Flat and JSON-friendly (a run's stats hold flat mappings of scalars)."""
        return {**{f"c{t}_ms": round(y, 3) for t, y in zip(self._xs, self._ys)},
                "per_path_ms": round(self.per_path_ms, 3)}


def widths_up_to(max_width: int) -> list[int]:
    return sorted({t for t in GRID if t <= max_width} | {max(1, int(max_width))})


def _timer(device: torch.device) -> Timer:
    sync = device.type == "cuda"

    def run(fn: Callable[[], Any]) -> float:
        if sync:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3
    return run


def _probe_tree(nodes: int, branching: bool) -> TokenTree:
    """``nodes`` nodes, branching at the root when it may (a verify forward with the tree's 4D mask)."""
    if not branching or nodes < 2:
        return TokenTree.chain(range(nodes))
    return TokenTree(tuple(range(nodes)), (-1, -1) + tuple(range(1, nodes - 1)))


def calibrate(lm: Any, max_width: int, *, fast: bool = False, context: int = CONTEXT, repeats: int = REPEATS,
              hidden: bool = True, timer: Optional[Timer] = None) -> ForwardCost:
    """Time ``lm``'s verify forward for the widths up to ``max_width`` (see the module docstring)."""
    if lm.is_encoder_decoder:
        raise ValueError("the measured tree budget times decoder-only verify forwards")
    t_start = time.perf_counter()
    widths = widths_up_to(max_width)
    limit = getattr(lm.model.config, "max_position_embeddings", None) or getattr(lm.model.config, "n_positions",
                                                                                  None)
    if limit:
        context = max(1, min(context, int(limit) - widths[-1] - 1))
    vocab = lm.vocab_size
    session = Session(lm, "calibration", fast=fast, max_len=context + widths[-1] + 1)
    session.prefill([(17 * i + 3) % vocab for i in range(context)])
    base = session.length
    branching = supports_trees(lm)
    trees = {t: _probe_tree(t - 1, branching) for t in widths}
    timer = timer or _timer(lm.device)
    root = [(31 * context + 7) % vocab]

    def verify(tree: TokenTree) -> None:
        tree_forward(session, root, tree, hidden=hidden)
        session.crop(base)

    def forward(t: int) -> None:
        verify(trees[t])

    for t in widths:                                   # warm-up (and, with fast, the graph captures)
        forward(t)
    best = {t: math.inf for t in widths}
    for rep in range(max(1, repeats)):
        shift = rep % len(widths)
        for t in widths[shift:] + widths[:shift]:
            best[t] = min(best[t], timer(lambda: forward(t)))
    floor = 1e-6                                       # a clock too coarse for a tiny model still gives > 0
    per_path = 0.0
    if branching and STAR in best:                     # the same width in STAR - 1 paths instead of two
        star = TokenTree(tuple(range(STAR - 1)), (-1,) * (STAR - 1))
        verify(star)
        star_ms = min(timer(lambda: verify(star)) for _ in range(max(1, repeats)))
        per_path = max(0.0, (star_ms - best[STAR]) / (STAR - 1 - PROBE_PATHS))
    return ForwardCost({t: max(ms, floor) for t, ms in best.items()}, source="measured",
                       seconds=time.perf_counter() - t_start, context=context, per_path_ms=per_path)


def forward_cost(lm: Any, max_width: int, *, fast: bool = False,
                 measure: Optional[Callable[..., ForwardCost]] = None) -> ForwardCost:
    """The model's cost curve covering ``max_width``: measured once, then read from ``lm.state``."""
    curves = lm.state.forward_cost
    curve = curves.get(bool(fast))
    if curve is None or curve.max_width < max_width:
        curve = curves[bool(fast)] = (measure or calibrate)(lm, max_width, fast=fast)
    return curve
