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
time). Adaptive: a width whose fastest two times disagree by more than
``AGREE`` (relative) is timed again, interleaved with the other unsettled
widths, until they agree or it has been timed ``MAX_REPEATS`` times, or the
extra passes have cost ``EXTRA_COST`` times the first ones; a quiet machine
settles at ``REPEATS`` and pays nothing more. The gap between a width's
fastest two times (at least ``SPREAD_FLOOR``) is kept as its ``spread``: how far
the fastest time may be from another start's, so that a caller (the verdicts of
``harness/pays.py``, the auto widths of ``runtime/widths.py``) knows how sure the
curve is. On CUDA every timed forward sits between synchronisations. A few
seconds on the CPU for a 135M model, once: the curve hangs on the loaded model
(``LoadedModel.state.forward_cost``, per fast-path flag) and dies with it.
A curve that covers fewer widths than asked is measured again, wider.

``ForwardCost`` is the curve itself: milliseconds at the measured widths,
linear in between, flat beyond the ends, with each width's relative spread
(none for an injected curve unless given: then every margin built on it is 0).
Tests inject their own.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Optional

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
REPEATS = 3              # passes every width gets
MAX_REPEATS = 10         # the most a width is timed while its fastest two disagree (the start's cost cap)
AGREE = 0.03             # a width is settled when its fastest two times agree within this fraction
EXTRA_COST = 1.0         # the extra passes together cost at most this times the first REPEATS passes' timed ms
SPREAD_FLOOR = 0.02      # the least spread a measured width reports: two fastest-of-few can agree by chance
                         # more closely than two starts do (clock, frequency, placement)

Timer = Callable[[Callable[[], Any]], float]


def filler_ids(vocab: int, n: int) -> list[int]:
    """``n`` token ids spread over a vocabulary of ``vocab``: a context to time forwards after (only its length
    matters to a forward's cost)."""
    return [(17 * i + 3) % vocab for i in range(int(n))]


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
    # relative spread of each measured width's time: (second fastest - fastest) / fastest, at least SPREAD_FLOOR
    # (``calibrate``); empty where unknown (an injected curve, or one width timed once): margins on it are 0
    spread: Mapping[int, float] = field(default_factory=dict)
    samples: Mapping[int, int] = field(default_factory=dict)     # how many times each width was timed
    _xs: tuple = field(init=False, repr=False, compare=False)
    _ys: tuple = field(init=False, repr=False, compare=False)
    _ss: tuple = field(init=False, repr=False, compare=False)

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
        stray = sorted(set(int(t) for t in self.spread) - set(xs))
        if stray:
            raise ValueError(f"a spread needs a measured width, got one at T={stray[0]}")
        ss = tuple(float(self.spread.get(t, 0.0)) for t in xs)
        bad = [(t, v) for t, v in zip(xs, ss) if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise ValueError(f"a spread must be a finite fraction >= 0, got {bad[0][1]!r} at T={bad[0][0]}")
        object.__setattr__(self, "_xs", xs)
        object.__setattr__(self, "_ys", ys)
        object.__setattr__(self, "_ss", ss)

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

    @property
    def spread_known(self) -> bool:
        """Whether the curve says how sure it is (a measured spread), so a margin of 0 means sure, not unknown."""
        return bool(self.spread)

    def spread_at(self, width: float) -> float:
        """Relative spread of ``self(width)``: a measured width's own; between two, the wider of theirs (an
        interpolation is as unsure as its less sure end); beyond the ends, the end's. 0 where unknown."""
        xs, ss = self._xs, self._ss
        if width <= xs[0]:
            return ss[0]
        if width >= xs[-1]:
            return ss[-1]
        i = bisect.bisect_left(xs, width)
        return ss[i] if xs[i] == width else max(ss[i - 1], ss[i])

    def tree(self, width: float, paths: float) -> float:
        """ms of a verify forward of ``width`` positions whose tree has ``paths`` root-to-leaf paths."""
        return self(width) + max(0.0, paths - PROBE_PATHS) * self.per_path_ms

    def record(self) -> dict:
        """Flat and JSON-friendly (a run's stats hold flat mappings of scalars)."""
        return {**{f"c{t}_ms": round(y, 3) for t, y in zip(self._xs, self._ys)},
                "per_path_ms": round(self.per_path_ms, 3), "max_spread": round(max(self._ss), 4)}


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


def _settled(times: list[float], agree: float) -> bool:
    """Whether the fastest two of ``times`` agree within ``agree`` (relative to the fastest)."""
    if len(times) < 2:
        return False
    a, b = sorted(times)[:2]
    return b - a <= agree * a


def _spread(times: list[float]) -> Optional[float]:
    """(second fastest - fastest) / fastest, at least SPREAD_FLOOR; None for a width timed once."""
    if len(times) < 2:
        return None
    a, b = sorted(times)[:2]
    return max(SPREAD_FLOOR, (b - a) / a if a > 0 else 0.0)


def repeat_bounds(repeats: Optional[int], max_repeats: Optional[int]) -> tuple[int, int]:
    """(passes every width gets, the most a width gets): ``repeats`` alone fixes the count (as before the
    adaptive repeats); neither: REPEATS up to MAX_REPEATS."""
    lo = max(1, int(repeats if repeats is not None else REPEATS))
    cap = max_repeats if max_repeats is not None else (lo if repeats is not None else MAX_REPEATS)
    return lo, max(lo, int(cap))


def time_until_settled(keys: list, run: Callable[[Any], float], lo: int, hi: int, agree: float = AGREE,
                       extra_cost: float = EXTRA_COST) -> dict[Any, list[float]]:
    """Every key's times: ``lo`` passes over all keys, then passes over the keys whose fastest two disagree by
    more than ``agree`` until they agree or have ``hi`` times, or the extra passes have timed ``extra_cost``
    times the ms of the first ``lo`` (a busy machine's start stays bounded: at most about twice the fixed
    passes' cost). Each pass starts one key further on (a slow moment does not always land on the same key)."""
    times: dict[Any, list[float]] = {k: [] for k in keys}
    spent = [0.0, 0.0]                                 # ms timed in the first lo passes, in the extra ones
    for rnd in range(hi):
        todo = [k for k in keys if len(times[k]) < lo or not _settled(times[k], agree)]
        if not todo or (rnd >= lo and spent[1] >= extra_cost * spent[0]):
            break
        shift = rnd % len(todo)
        for k in todo[shift:] + todo[:shift]:
            ms = run(k)
            times[k].append(ms)
            spent[rnd >= lo] += ms
    return times


def calibrate(lm: Any, max_width: int, *, fast: bool = False, context: int = CONTEXT,
              repeats: Optional[int] = None, max_repeats: Optional[int] = None, agree: float = AGREE,
              hidden: bool = True, timer: Optional[Timer] = None,
              hold: Callable[[], ContextManager] = contextlib.nullcontext) -> ForwardCost:
    """Time ``lm``'s verify forward for the widths up to ``max_width`` (see the module docstring). ``repeats``
    alone: exactly that many passes (tests); else REPEATS passes, and more (up to ``max_repeats``, default
    MAX_REPEATS) for the widths whose fastest two times disagree by more than ``agree``. ``hold``: entered around
    the prefill and warm-up and around each timed forward (the app's line: no run computes beside them, and a run
    waiting goes between them)."""
    if lm.is_encoder_decoder:
        raise ValueError("the measured tree budget times decoder-only verify forwards")
    t_start = time.perf_counter()
    lo, hi = repeat_bounds(repeats, max_repeats)
    widths = widths_up_to(max_width)
    limit = getattr(lm.model.config, "max_position_embeddings", None) or getattr(lm.model.config, "n_positions",
                                                                                  None)
    if limit:
        context = max(1, min(context, int(limit) - widths[-1] - 1))
    vocab = lm.vocab_size
    timer = timer or _timer(lm.device)
    root = [(31 * context + 7) % vocab]
    with hold():
        branching = supports_trees(lm)                 # probed with a forward, once per model
        session = Session(lm, "calibration", fast=fast, max_len=context + widths[-1] + 1)
        session.prefill(filler_ids(vocab, context))
    base = session.length
    trees = {t: _probe_tree(t - 1, branching) for t in widths}

    def verify(tree: TokenTree) -> None:
        tree_forward(session, root, tree, hidden=hidden)
        session.crop(base)

    def timed(tree: TokenTree) -> float:
        with hold():
            return timer(lambda: verify(tree))

    with hold():
        for t in widths:                               # warm-up (and, with fast, the graph captures)
            verify(trees[t])
    times = time_until_settled(widths, lambda t: timed(trees[t]), lo, hi, agree)
    best = {t: min(ms) for t, ms in times.items()}
    spread = {t: s for t, s in ((t, _spread(ms)) for t, ms in times.items()) if s is not None}
    floor = 1e-6                                       # a clock too coarse for a tiny model still gives > 0
    per_path = 0.0
    if branching and STAR in best:                     # the same width in STAR - 1 paths instead of two
        star = TokenTree(tuple(range(STAR - 1)), (-1,) * (STAR - 1))
        with hold():
            verify(star)
        star_ms = min(time_until_settled(["star"], lambda _: timed(star), lo, hi, agree)["star"])
        per_path = max(0.0, (star_ms - best[STAR]) / (STAR - 1 - PROBE_PATHS))
    return ForwardCost({t: max(ms, floor) for t, ms in best.items()}, source="measured",
                       seconds=time.perf_counter() - t_start, context=context, per_path_ms=per_path,
                       spread=spread, samples={t: len(ms) for t, ms in times.items()})


def forward_cost(lm: Any, max_width: int, *, fast: bool = False,
                 measure: Optional[Callable[..., ForwardCost]] = None) -> ForwardCost:
    """The model's cost curve covering ``max_width``: measured once, then read from ``lm.state``."""
    curves = lm.state.forward_cost
    curve = curves.get(bool(fast))
    if curve is None or curve.max_width < max_width:
        curve = curves[bool(fast)] = (measure or calibrate)(lm, max_width, fast=fast)
    return curve


def product_flops(model: torch.nn.Module) -> int:
    """Floating-point operations of one position through the model's linear layers (the LM head included): 2 per
    weight of every module that holds a 2-d ``weight`` and is not an embedding (a lookup, not a product)."""
    total = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Embedding) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if any(isinstance(getattr(child, "weight", None), torch.Tensor) for child in module.children()):
            continue                                   # a wrapper: its inner linear is counted once, on its own
        total += 2 * weight.numel()
    return total


def compute_floor_ms(model: torch.nn.Module, width: int, gflops: float) -> float:
    """The least a ``width``-position forward can cost on cores that multiply-add ``gflops`` GFLOP/s
    (``attention_kernels.fma_gflops``): its products' operations at that peak, nothing else counted. A forward
    whose products are compute-bound cannot beat it, so ``c(T) / c(1)`` cannot fall below
    ``compute_floor_ms(T) / c(1)`` on that machine, whatever the kernel."""
    if not gflops > 0:
        raise ValueError(f"gflops must be positive, got {gflops!r}")
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width!r}")
    return width * product_flops(model) / (gflops * 1e6)
