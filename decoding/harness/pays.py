"""Which strategies of the default comparison are expected to pay on this machine, and why not, from its curve.

A strategy pays when it is expected to run at least as fast as greedy. Greedy commits 1 token per
one-position forward, ``c(1)``; a strategy step commits ``E`` tokens for one verify forward over ``T``
positions plus its drafting ``D`` and ``STEP`` of the loop's own work beyond greedy's (both in units of
``c(1)``), so its predicted speed-up is

    speedup = E / (c(T) / c(1) + D + STEP)      it pays when speedup >= 1, i.e. E >= c(T) / c(1) + D + STEP

``c``: the target's measured forward-cost curve (``runtime/forward_cost.py``). ``STEP`` = 0.05
(``runtime/widths.STEP``: one model for the widths and the verdicts): what the recorded races on the
default example leave unexplained by the curve ranges from about 0 (prompt lookup on the AMD EPYC) to
0.17 (the prophet on the Intel Xeon, float32); on the recorded curves and races of BENCHMARKS.md ("How
widths are chosen") 0.05 gives 12 of 14 verdicts right.

**How sure.** A measured curve carries each width's relative spread (``ForwardCost.spread``: the gap between
its fastest two timings), so ``c(T) / c(1)`` is known to ``r = spread(T) + spread(1)`` (relative) and the
prediction to ``± margin = speedup * (c(T) / c(1)) * r / (c(T) / c(1) + D + STEP)`` (its first-order change).
The verdict (``Verdict.call``) is

    pays               speedup - margin >= 1      ticked
    does not pay       speedup + margin <  1      left out
    too close to call  otherwise                  left out: the rule is "tick only what the curve says pays";
                                                  a noisy start never ticks a strategy that may run slower

so two starts whose curves each lie within their measured spread of the machine's own never call one strategy
"pays" at one and "does not pay" at the other (to first order: ``tests/test_pays_margin.py`` checks it with
noise of half the spread), and a prediction inside the band is left out at both. A start whose load differs
from the next one's can move the curve by more than either start's spread: the margin does not cover that.
On a curve without a spread (injected) the margin is 0 and the verdict is the sign of ``speedup - 1`` (1
itself pays), and the line says the curve has no measured spread.
Every line says how sure it is: ``predicted 0.89× greedy, ±0.06 from the curve's spread``.

What ``E``, ``T`` and ``D`` are, per strategy (``expectation``):

* ``lookahead`` and ``jacobi``: at the width their auto choice takes on this curve (or the user's), the
  models of ``runtime/widths.py``;
* ``prophet``: the step shape its parameters draft (``PROPHET_SHAPES``; ``PROPHET``, the default 8-node tree:
  5.18 tokens per forward on the default example (a summary that copies much of its text;
  ``harness/examples``), 64 tokens, a verify forward of 16.4 positions with the root and the copy branch, and
  its drafting, 0.25 ``c(1)``: 3.6 head calls of 2.35 ms per 35 ms forward, issue 36's profile);
  parameters of no recorded shape are judged as the default tree.
* ``prompt_lookup``: ``PROMPT_LOOKUP`` below: 3.35 tokens per forward on the default example and 1 + 4.44
  positions a forward (counted on the bundled model with the default ``min_ngram=2``; on the chat question that
  was the default example before, 1.05 and 1 + 0.47): a step without a match verifies one position, far narrower
  than 1 + ``draft_tokens``;
* ``greedy``: 1 token per ``c(1)``, the reference; other strategies: no model (reported as unknown).

``verdicts(curve)`` gives one ``Verdict`` per strategy, each with one line that says why;
``default_comparison(curve)`` keeps the ones that pay (greedy always) and the lines for the others.

**The prophet's step shape** (``choose_prophet_shape``): where a wide verify forward costs little (a GPU, a
flat CPU curve) the 8-node tree commits the most per forward; where it costs a lot (a compute-bound CPU: a
16-position forward 2.7-3.4x a one-position one on AVX2) a smaller tree or a short chain is the better step
(BENCHMARKS.md, "The prophet's step shape, chosen from the curve"). The start picks the shape with the most
expected tokens per ms on the served curve, ``E / (c(T) / c(1) + D + STEP)``, with ``E`` over prompts the
project did not write (the shape serves every prompt a visitor writes), the narrower one within the curve's
noise (``widths.best_within_noise``); the page's prophet fields start on it, examples are recorded with it,
and the prophet's verdict judges it on the default example.

**Timed steps.** ``D`` above is one CPU's profile of the head, and ``STEP`` a fit to one CPU's races: where memory
is slow the head's drafting costs more (the AMD EPYC Zen 3's predictions ran 1.28-1.41× for the 2-node tree
against about 1.06× raced). So where the start times the curve it also times each shape's whole step against
greedy's, in the served mode, on the default example (``harness/steps.step_ratios``: drafting, verify forward
and loop together), and ``E / ratio`` replaces the model, for the shape (``choose_prophet_shape(steps=...)``) and
for the prophet's verdict (``verdict(step=...)``), with the rounds' standard error as the noise. For the shape the
step is first moved along the curve from the positions its runs verified on the default example to those the shape
verifies on unseen prompts (``unseen_step_ms``): the example copies more, so its trees verify more.

**Raced verdicts.** The model's ``E`` for prompt lookup and lookahead is one count on one day, and its ``STEP``
a fit: on an Intel Xeon whose curve put both at 0.97× ("too close to call"), the same app raced them at 1.07×
and 1.19× greedy on the default example (lookahead made 1.33 tokens a forward, not the model's 1.13). So the
start also races the page's default comparison itself, at the page's default length, each strategy against
greedy in the same rounds (the prophet at the chosen shape; ``web/startup.timed_steps``), and a strategy's race
is its verdict: ``speedup`` the rounds' median of greedy's ms a token over its own, ``± speedup * spread`` the
rounds' standard error (pooled over every strategy raced in the same rounds where that is larger: three rounds
alone say little about their noise), the same three calls. The line says so (``raced against greedy on the
default example here (3 rounds): 1.33 tokens a forward for a step 1.12× greedy's: pays (1.19× greedy, ±0.03
from the timings' spread)``), and a strategy with no model of its step (suffix decoding) can be judged by its
race. The model stays for what is not raced (a curve injected, a GPU, a run that failed).

**Across starts.** One start's three rounds are one sample of a machine whose memory rate moves between starts:
lookahead on the bug-fix example under the AVX2 caps was judged 1.17 ± 0.06 at one start (ticked), 0.98 at the
next (left out) and 1.08 at a third. So each quiet start's rounds are kept per machine (``web/race_history.py``:
the code, torch, the CPU and its kernels' instruction set, the served config, the example and the race's
length), and the next start's verdict rests on its rounds pooled with the last starts' (``steps.pooled``: the
medians over every round; an error no smaller than the starts' own scatter). A call that stays too close to
make keeps the last start's (``previous``): a strategy does not flip in and out of the page between starts on
noise, only when its pooled race is clear of the line. Its line says over how many starts it was raced. The
prophet's shapes are pooled the same way before the shape is chosen (``web/race_history.RaceHistory.shapes``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from decoding.harness.steps import StepRatio
from decoding.runtime.widths import (STEP, WidthChoice, best_within_noise, choose_block, choose_window,
                                     jacobi_forward_ms, jacobi_forward_spread, jacobi_tokens, lookahead_paths,
                                     lookahead_positions, lookahead_tokens, ratio_spread, spread_known, tree_ms)
from decoding.strategies import registry

Cost = Callable[[float], float]


@dataclass(frozen=True)
class Expectation:
    """One step of a strategy: expected tokens, the verify forward's positions, drafting in units of c(1)."""
    tokens: float
    positions: float
    drafting: float = 0.0
    source: str = ""
    forward_ratio: Optional[float] = None   # the forward's cost / c(1) where not c(positions) / c(1) (Jacobi)
    forward_spread: float = 0.0             # relative spread of forward_ratio, where it is given
    paths: float = 2.0                      # root-to-leaf paths of its tree (row-exact attention pays per path)

    def __post_init__(self) -> None:
        if not self.tokens >= 1.0:
            raise ValueError(f"tokens must be at least 1 (a step commits the target's own token), got {self.tokens!r}")
        if not self.positions >= 1.0:
            raise ValueError(f"positions must be at least 1, got {self.positions!r}")
        if not self.drafting >= 0.0:
            raise ValueError(f"drafting must be >= 0, got {self.drafting!r}")
        if not self.paths >= 1.0:
            raise ValueError(f"paths must be at least 1, got {self.paths!r}")


# Recorded on the default example (see the module docstring; BENCHMARKS.md, "How widths are chosen").
PROMPT_LOOKUP = Expectation(tokens=3.353, positions=5.44, drafting=0.0,
                            source="the default example: 4.44 drafted positions a step, the summary copied from the "
                                   "text (min_ngram=2; a count, 2026-11-30)")


# the prophet's parameters that make its step's shape (a caller who sets one shapes the step itself)
SHAPE_PARAMS = ("budget", "draft_tokens", "tree", "tree_nodes", "tree_topk")


@dataclass(frozen=True)
class ProphetShape:
    """One step shape of the prophet (its parameters), and what it makes of the default example and of prompts the
    project did not write."""
    name: str                           # "tree8", "chain2", ...
    shown: str                          # "a tree of 8 nodes", "a chain of 2 drafted tokens"
    params: tuple[tuple[str, Any], ...]  # the prophet's parameters that draft it (beyond the defaults)
    expectation: Expectation            # on the default example (the verdicts)
    unseen_tokens: float                # tokens per forward, median over prompts the project did not write
    unseen_positions: float             # verified positions a step, median over the same prompts (the choice)

    def parsed(self) -> Any:
        return registry()["prophet"].parse(dict(self.params))


# Counted with the shipped head on the bundled model, eager float32: the default example, 64 tokens (recounted on
# 2026-11-30 when a summary became the default example and chains got the copy branch), and the medians over 6
# prompts of presets/bench_unseen.yaml (2 a category), 48 tokens, counted the same day: what the choice judges a
# shape by, since the shape serves every prompt a visitor writes. Positions: the root and the nodes verified a step,
# the copy branch's included (the summary copies more than most prompts: the 8-node tree verifies 16.4 positions a
# step there, 11.1 on the unseen prompts' median, 9.9 on the chat question that was the default example before);
# drafting: the head's ms a step in units of c(1), scaled from the 8-node tree's 0.25 by the shapes' measured
# draft ms (7.7, 5.9, 3.9, 4.0 and 2.4 ms a step on one CPU).
# Narrowest first (by positions, on the default example and on the unseen prompts): the order in which a near-tie is
# given to the narrower shape. With the copy branch a chain of 2 verifies as many positions as the 2-node tree.
PROPHET_SHAPES = (
    ProphetShape("chain1", "a chain of 1 drafted token", (("tree", False), ("draft_tokens", 1)),
                 Expectation(4.385, 8.92, 0.08, "the default example: a chain of 1 with its copy branch"), 1.90, 4.38),
    ProphetShape("tree2", "a tree of 2 nodes", (("tree_nodes", 2),),
                 Expectation(4.385, 9.75, 0.13, "the default example: a 2-node tree with its copy branch"), 2.29, 5.41),
    ProphetShape("chain2", "a chain of 2 drafted tokens", (("tree", False), ("draft_tokens", 2)),
                 Expectation(4.385, 9.75, 0.13, "the default example: a chain of 2 with its copy branch"), 2.24, 5.45),
    ProphetShape("tree4", "a tree of 4 nodes", (("tree_nodes", 4),),
                 Expectation(4.75, 11.91, 0.19, "the default example: a 4-node tree with its copy branch"), 2.60, 7.65),
    ProphetShape("tree8", "a tree of 8 nodes (the default)", (),
                 Expectation(5.182, 16.40, 0.25, "the default example: the 8-node tree with its copy branch"), 3.00,
                 11.05),
)
PROPHET = PROPHET_SHAPES[-1].expectation       # the library's default step
# the prophet's fields the shapes set (a page's fields and a benchmark's record follow all of them)
SHAPE_FIELDS = tuple(sorted({field for shape in PROPHET_SHAPES for field, _ in shape.params}))


@dataclass(frozen=True)
class ShapeChoice:
    """The prophet's step shape for this machine's curve (or its timed steps), and why."""
    shape: ProphetShape
    predicted: float                    # its predicted speed-up over greedy on prompts the project did not write
    default_predicted: float            # the library's default shape's, on the same curve
    timed: tuple[tuple[str, StepRatio], ...] = ()   # every shape's step over greedy's, timed here (none: modelled)
    moved: float = 0.0                  # the chosen shape's timed step moved to its unseen positions (unseen_step_ms)

    @property
    def step(self) -> Optional[StepRatio]:
        """The chosen shape's timed step, or None where the steps were modelled from the curve."""
        return dict(self.timed).get(self.shape.name)

    @property
    def reason(self) -> str:
        timed = ""
        if self.step is not None:
            timed = f", from its step timed at {self.step.ratio:.2f}× greedy's here"
            if self.step.starts > 1:
                timed += f" ({self.step.starts} starts pooled)"
            if self.step.positions:
                timed += (f" over {self.step.positions:.1f} positions on the default example, "
                          f"{self.moved:.2f}× over the {self.shape.unseen_positions:.1f} it verifies on those prompts")
        listed = ", ".join(f"{name} {step.ratio:.2f}×" for name, step in self.timed)
        steps = f"; steps timed here, over greedy's: {listed}" if self.timed else ""
        if self.shape is PROPHET_SHAPES[-1]:
            said = "its timed steps say" if self.step is not None else "the curve says"
            return (f"prophet: drafts {self.shape.shown} here: {said} no narrower step pays better "
                    f"(predicted {self.predicted:.2f}× greedy on prompts the project did not write{timed}){steps}")
        why = ("its steps, timed on this machine, make it the narrowest shape within their noise of the fastest"
               if self.step is not None else
               "a wide verify forward costs too much on this curve for the default 8-node tree")
        return (f"prophet: drafts {self.shape.shown} here: {why} (predicted {self.predicted:.2f}× greedy on "
                f"prompts the project did not write{timed}, against {self.default_predicted:.2f}× for the 8-node "
                f"tree){steps}")


def shape_of(params: Any) -> Optional[ProphetShape]:
    """The shape ``params`` (the prophet's; None: its defaults) draft, or None for one of no recorded shape."""
    if params is None:
        return PROPHET_SHAPES[-1]
    plain = dataclasses.replace(params, fast=False)
    return next((s for s in PROPHET_SHAPES if dataclasses.replace(s.parsed(), fast=False) == plain), None)


def choose_prophet_shape(cost: Cost, shapes: Sequence[ProphetShape] = PROPHET_SHAPES,
                         steps: Optional[Mapping[str, StepRatio]] = None) -> ShapeChoice:
    """The shape with the most expected tokens per ms on ``cost`` over prompts the project did not write (the shape
    serves every prompt a visitor writes, not only the example): ``E / (c(T) / c(1) + D + STEP)``; a narrower one
    within the curve's noise of the best wins (``widths.best_within_noise``, as lookahead's window).

    ``steps`` (shape name -> its step over greedy's, timed in the race's mode on this machine:
    ``harness/steps.step_ratios``): where every shape has one, the timed step replaces the model's denominator,
    ``E / ratio``, and the timings' spread is the noise; the step is timed on the default example, so its verify
    forward is moved along the curve to the positions the shape verifies on unseen prompts (``unseen_step_ms``).
    The model guesses the head's drafting from one CPU's profile; where memory is slow the head costs more (an AMD
    EPYC Zen 3's predictions ran 1.3-1.4× against about 1.06× raced)."""
    one = float(cost(1))
    timed = steps is not None and all(shape.name in steps for shape in shapes)

    def score(i: int) -> tuple[float, float, float, float]:
        shape = shapes[i - 1]
        e, positions = shape.expectation, shape.unseen_positions
        if timed:
            step = steps[shape.name]
            return shape.unseen_tokens, positions, unseen_step_ms(step, cost, positions, e.paths), step.spread
        forward = tree_ms(cost, positions, e.paths)
        ms = forward + e.drafting * one
        return (shape.unseen_tokens, positions, ms,
                ratio_spread(cost, positions) * float(cost(positions)) / ms)
    step = 0.0 if timed else STEP
    pick = best_within_noise("prophet shape", range(1, len(shapes) + 1), score, one, step=step)

    def predicted(i: int) -> float:
        tokens, _, ms, _ = score(i)
        return tokens / (ms / one + step)
    return ShapeChoice(shapes[pick.value - 1], predicted(pick.value), predicted(len(shapes)),
                       tuple((shape.name, steps[shape.name]) for shape in shapes) if timed else (),
                       score(pick.value)[2] / one if timed else 0.0)


def unseen_step_ms(step: StepRatio, cost: Cost, positions: float, paths: float) -> float:
    """A shape's step timed on the default example (``step``, over greedy's), in ms, moved along the curve to the
    ``positions`` it verifies on prompts the project did not write: its verify forward at the positions the timed
    runs verified (``step.positions``) swapped for one at ``positions``. The default example copies more of its
    prompt than most prompts, so its trees verify more (the served int8 forward: the 8-node tree 14.7 positions there,
    10.9 on the unseen prompts' median) and a curve that jumps between those widths (7.6 ms at 12 positions, 10.2
    at 16 on a Zen 5) overstated the wide shapes' steps: the start chose the 4-node tree, which then ran 1.15× greedy
    on unseen prompts against the 8-node tree's 1.32×. Never below that forward itself; unmoved where the timed runs
    did not count their positions."""
    one = float(cost(1))
    ms = step.ratio * one
    if not step.positions:
        return ms
    at_unseen = tree_ms(cost, positions, paths)
    return max(at_unseen, ms + at_unseen - tree_ms(cost, step.positions, paths))


@dataclass(frozen=True)
class Verdict:
    """Whether one strategy is expected to pay here, and the line that says why."""
    strategy: str
    speedup: Optional[float]          # predicted, over greedy; None: no model
    tokens: float = 0.0               # E
    positions: float = 0.0            # T
    cost_ratio: float = 0.0           # c(T) / c(1) + D + STEP: the tokens a step needs to break even
    forward: float = 0.0              # c(T) / c(1): the verify forward alone
    drafting: float = 0.0             # D
    width: Optional[WidthChoice] = None    # lookahead's window or Jacobi's block it was judged at
    margin: Optional[float] = None    # ± on speedup from the curve's measured spread; None: the curve has none
    timed: bool = False               # cost_ratio is its step timed here over greedy's (margin: the timings')
    raced: int = 0                    # rounds of a race against greedy on the default example that gave speedup
    starts: int = 1                   # the starts of this machine those rounds come from (``steps.pooled``)
    previous: Optional[bool] = None   # ticked at this machine's last start (None: no earlier start raced it)

    PAYS, SLOWER, CLOSE = "pays", "does not pay", "too close to call"

    @property
    def call(self) -> str:
        """pays | does not pay | too close to call (the prediction's band straddles 1; see the module docstring)."""
        if self.speedup is None:
            return self.PAYS
        m = self.margin or 0.0
        if self.speedup - m >= 1.0:
            return self.PAYS
        return self.SLOWER if self.speedup + m < 1.0 else self.CLOSE

    @property
    def pays(self) -> bool:
        """Ticked by default: no model, or the curve says it pays beyond its noise; too close to call: as at this
        machine's last start (``previous``), left out where there was none."""
        return self.call == self.PAYS or (self.call == self.CLOSE and self.previous is True)

    @property
    def certainty(self) -> str:
        """``±0.06 from the curve's spread``, or that the curve says nothing about how sure it is."""
        if self.margin is None:
            return "the curve has no measured spread"
        source = "the timings' spread" if self.timed else "the curve's spread"
        return f"±{self.margin:.2f} from {source}"

    @property
    def reason(self) -> str:
        """One line: ``lookahead: a 10-position forward costs 1.7× one position here; it needs ≥ 1.7 tokens per
        forward and makes ~1.3`` (or why it pays)."""
        if self.speedup is None:
            return f"{self.strategy}: no model of its step; not judged"
        if self.strategy == "greedy":
            return "greedy: the reference, one position per token"
        at = f" (at {self.width.shown})" if self.width is not None else ""
        verb = self.call
        if self.call == self.CLOSE:
            verb = ("too close to call, left out" if self.previous is None else
                    f"too close to call, {'ticked' if self.previous else 'left out'} as at this machine's last start")
        if self.raced:
            over = f" over {self.starts} starts" if self.starts > 1 else ""
            return (f"{self.strategy}{at}: raced against greedy on the default example here ({self.raced} rounds"
                    f"{over}): {self.tokens:.2f} tokens a forward for a step {self.cost_ratio:.2f}× greedy's: {verb} "
                    f"({self.speedup:.2f}× greedy, {self.certainty})")
        if self.timed:
            return (f"{self.strategy}: its step (drafting, a {self.positions:.0f}-position forward and its loop) "
                    f"timed {self.cost_ratio:.2f}× greedy's here; it needs ≥ {self.cost_ratio:.2f} tokens per "
                    f"forward and makes ~{self.tokens:.2f}: {verb} (predicted {self.speedup:.2f}× greedy, "
                    f"{self.certainty})")
        return (f"{self.strategy}{at}: a {self.positions:.0f}-position forward costs {self.forward:.2f}× one "
                f"position here; with its {'drafting and ' if self.drafting else ''}loop it needs ≥ "
                f"{self.cost_ratio:.2f} tokens per forward and makes ~{self.tokens:.2f}: {verb} "
                f"(predicted {self.speedup:.2f}× greedy, {self.certainty})")


def expectation(strategy: str, cost: Cost, params: Any = None) -> tuple[Optional[Expectation], Optional[WidthChoice]]:
    """The model of ``strategy``'s step on ``cost`` (``params``: its parameters, the defaults if None)."""
    if strategy == "greedy":
        return Expectation(1.0, 1.0, 0.0, "one token per forward"), None
    if params is None and strategy in registry():
        params = registry()[strategy].parse({})
    if strategy == "lookahead":
        w = (WidthChoice("window", params.window, "user") if params.window
             else choose_window(cost, params.ngram, params.guess_set))
        return Expectation(lookahead_tokens(w.value, params.ngram),
                           lookahead_positions(w.value, params.ngram, params.guess_set), 0.0, "runtime/widths.py",
                           paths=lookahead_paths(w.value)), w
    if strategy == "jacobi":
        b = (WidthChoice("block_size", params.block_size, "user") if params.block_size
             else choose_block(cost, params.variant))
        positions, ms = jacobi_forward_ms(b.value, params.variant, cost)     # the mean forward of a block
        return Expectation(jacobi_tokens(b.value, params.variant), positions, 0.0, "runtime/widths.py",
                           ms / float(cost(1)), jacobi_forward_spread(b.value, params.variant, cost, True)), b
    if strategy == "prophet":
        shape = shape_of(params)
        return (shape.expectation if shape is not None else PROPHET), None
    if strategy == "prompt_lookup":
        return PROMPT_LOOKUP, None
    return None, None


def verdict(strategy: str, cost: Cost, params: Any = None, step: Optional[StepRatio] = None) -> Verdict:
    """Whether ``strategy`` (with ``params``, else its defaults) is expected to pay on ``cost``; ``step``: its step
    over greedy's, timed on this machine in the race's mode (``harness/steps.step_ratios``), which then replaces
    the model's ``c(T) / c(1) + D + STEP``, its spread the curve's; where the same rounds raced it against greedy
    (``step.speedup``), that race is the verdict, model or none."""
    model, width = expectation(strategy, cost, params)
    if step is not None and step.speedup is not None and strategy != "greedy":
        tokens, positions, drafting = ((model.tokens, model.positions, model.drafting) if model is not None
                                       else (0.0, 0.0, 0.0))
        return Verdict(strategy, step.speedup, step.tokens if step.tokens is not None else tokens, positions,
                       step.ratio, 0.0, drafting, width, step.speedup * step.speedup_spread, timed=True,
                       raced=step.rounds, starts=step.starts)
    if model is None:
        return Verdict(strategy, None)
    if step is not None:
        speedup = model.tokens / step.ratio
        return Verdict(strategy, speedup, model.tokens, model.positions, step.ratio, 0.0, model.drafting, width,
                       speedup * step.spread, timed=True)
    if model.forward_ratio is not None:
        forward, rel = model.forward_ratio, model.forward_spread
    else:
        ms = tree_ms(cost, model.positions, model.paths)       # its per-path part counts as sure
        forward, rel = ms / float(cost(1)), ratio_spread(cost, model.positions) * float(cost(model.positions)) / ms
    ratio = forward + model.drafting + (STEP if strategy != "greedy" else 0.0)
    speedup = model.tokens / ratio
    margin = speedup * forward * rel / ratio if spread_known(cost) else None
    return Verdict(strategy, speedup, model.tokens, model.positions, ratio, forward, model.drafting, width, margin)


def verdicts(cost: Cost, strategies: Sequence[str], params: Optional[Mapping[str, Any]] = None,
             steps: Optional[Mapping[str, StepRatio]] = None,
             previous: Optional[Mapping[str, bool]] = None) -> list[Verdict]:
    """One verdict per strategy, in order (``params``: strategy name -> its parameters, where not the defaults;
    ``steps``: strategy name -> its timed step, where one was timed; ``previous``: strategy name -> whether this
    machine's last start ticked it, which decides a call too close to make)."""
    return [dataclasses.replace(verdict(name, cost, (params or {}).get(name), (steps or {}).get(name)),
                                previous=(previous or {}).get(name)) for name in strategies]


@dataclass(frozen=True)
class Comparison:
    """The default comparison for this machine: the strategies expected to pay, and one line per one left out."""
    strategies: tuple[str, ...]
    left_out: tuple[str, ...]
    notes: tuple[str, ...]            # one line per strategy left out: why, from the curve
    kept_notes: tuple[str, ...] = ()  # one line per strategy kept besides greedy: how sure (its race or model)

    @property
    def note(self) -> str:
        return "\n".join(self.notes)


def default_comparison(cost: Cost, strategies: Sequence[str], params: Optional[Mapping[str, Any]] = None,
                       steps: Optional[Mapping[str, StepRatio]] = None,
                       previous: Optional[Mapping[str, bool]] = None) -> Comparison:
    """``strategies`` less those not expected to pay on ``cost`` (or their timed ``steps``) beyond its noise
    (``Verdict.call``: one too close to call is left out too, unless ``previous``, this machine's last start,
    ticked it; its line says so); greedy, the reference, always stays."""
    judged = verdicts(cost, strategies, params, steps, previous)
    kept = tuple(v.strategy for v in judged if v.pays or v.strategy == "greedy")
    out = tuple(v for v in judged if v.strategy not in kept)
    return Comparison(kept, tuple(v.strategy for v in out), tuple(v.reason for v in out),
                      tuple(v.reason for v in judged if v.strategy in kept and v.strategy != "greedy"))
