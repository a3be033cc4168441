"""What a race's step costs: read from a run's events, or measured by running the race's own loop.

A bare forward is not what a visitor's race pays. On an AMD EPYC Zen 3 the float16-weight version's bare
one-position forward timed 50 ms against 82 ms for float32, yet through the app's race both ran greedy at about
80 ms a token: the loop's own work, its cache and its kernels' row buckets are part of the step. So:

* :func:`decode_steps_ms` reads a finished run's decode steps from its events and their times (the runner stamps
  every event, ``RunResult.times_ms``): the gaps between consecutive target forwards, so the prefill, however
  long the prompt, is never a step;
* :func:`race_costs` runs the race's greedy loop itself (the registered strategy, in the mode the race will run
  it: eager, or ``fast`` on the compiled forward) on the default example, warm-up first, and returns its median
  decode step beside a ``width``-position verify forward in the same mode (``runtime/forward_cost``);
* :func:`step_ratios` times whole runs of other strategies the same way, each against greedy's in the same
  rounds: what a prophet step of each shape costs on this machine, its drafting and its loop included
  (``harness/pays.choose_prophet_shape``), where a model of the step from the forward-cost curve guesses the
  drafting from another CPU's profile; and the same rounds' races, each run's wall time against greedy's over the
  same tokens, the speed-up the page's race will show on the default example (``harness/pays.verdict``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Optional, Sequence

from decoding.events import ForwardPass
from decoding.harness.examples import default_example
from decoding.harness.runner import HookTracer, encode_prompt, run_one
from decoding.params import GreedyParams
from decoding.runtime import compiled
from decoding.runtime.forward_cost import SPREAD_FLOOR, calibrate, filler_ids, forward_cost
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy

PROMPT = default_example()[1]   # the page's default example (harness/examples)
TOKENS = 24            # decode steps per timed run
REPEATS = 3


def _is_target_forward(event: Any) -> bool:
    if isinstance(event, dict):
        return event.get("type") == "ForwardPass" and event.get("model") == "target"
    return isinstance(event, ForwardPass) and event.model == "target"


def decode_steps_ms(events: Sequence[Any], times_ms: Sequence[float]) -> list[float]:
    """The run's decode steps in ms: the gaps between consecutive target forwards' event times (each gap is one
    forward and the loop's work around it). The first stamp ends the prefill, so the prefill is no step.
    ``events``: event objects or their dicts (a trace document's)."""
    stamps = [float(t) for e, t in zip(events, times_ms) if _is_target_forward(e)]
    return [b - a for a, b in zip(stamps, stamps[1:]) if b >= a]


def median_step_ms(events: Sequence[Any], times_ms: Sequence[float]) -> Optional[float]:
    """The median decode step of a run (None: fewer than two target forwards, or no times)."""
    steps = decode_steps_ms(events, times_ms)
    return statistics.median(steps) if steps else None


def _prompt_ids(lm: Any) -> list[int]:
    if lm.tokenizer is None:
        return filler_ids(lm.vocab_size, 24)
    return list(encode_prompt(lm.tokenizer, PROMPT, chat=bool(getattr(lm.tokenizer, "chat_template", None))))


def context_bucket(prompt_tokens: int) -> int:
    """The context a decode step is timed at for a prompt of ``prompt_tokens``: the next power of two, at least 64
    (attention grows with the context: a step after 600 prompt tokens costs more than one after 20)."""
    return max(64, 1 << max(0, int(prompt_tokens) - 1).bit_length())


def greedy_steps_ms(lm: Any, fast: bool, *, tokens: int = TOKENS, repeats: int = REPEATS,
                    context: Optional[int] = None, hold: Callable[[], ContextManager] = contextlib.nullcontext
                    ) -> list[float]:
    """Every decode step of ``repeats`` timed greedy runs of ``tokens`` tokens, as the race runs greedy (after an
    untimed warm-up run: caches allocated, graphs compiled or read from disk). ``context``: a prompt of that many
    tokens instead of the default example (filler ids: only its length matters to a step's cost). ``hold``: entered
    around each run (the warm-up's included)."""
    ids = _prompt_ids(lm) if context is None else filler_ids(lm.vocab_size, context)
    timed = _timed_run("greedy", GreedyParams(fast=fast), ids, ModelPair(lm))

    def run(n: int) -> Timed:
        with hold():
            return timed(n)
    run(min(tokens, 8))                         # the warm-up: caches allocated, graphs compiled; not kept
    return [step for _ in range(max(1, repeats)) for step in run(tokens).steps_ms]


@dataclass(frozen=True)
class Timed:
    """One timed run: its decode steps (ms), its wall time (ms, the prefill included, as the race times a run), the
    tokens it made for its target forwards, and the positions its decode forwards verified (mean; 0: unknown)."""
    steps_ms: list[float]
    wall_ms: float
    tokens: int
    forwards: int
    positions: float = 0.0


def _decode_positions(events: Sequence[Any]) -> float:
    """The mean positions of a run's target forwards after its prefill (0 where it made none)."""
    widths = [e.positions for e in events if isinstance(e, ForwardPass) and e.model == "target"
              and e.kind != "prefill"]
    return sum(widths) / len(widths) if widths else 0.0


def _timed_run(name: str, params: Any, ids: list[int], pair: Any) -> Callable[[int], Timed]:
    """A call that runs strategy ``name`` for the tokens it is given and returns the run, timed."""
    strategy = get_strategy(name)

    def run(tokens: int) -> Timed:
        tracer = HookTracer()
        result, wall_s, _ = run_one(strategy, params, ids, pair, max_new_tokens=tokens, tracer=tracer)
        return Timed(decode_steps_ms(tracer.events, tracer.times), 1000.0 * wall_s, len(result.token_ids),
                     int(result.target_forwards), _decode_positions(tracer.events))
    return run


def _ms_a_token(run: Timed) -> float:
    return run.wall_ms / run.tokens if run.tokens > 0 and run.wall_ms > 0 else math.nan


def _median_error(values: list[float]) -> tuple[float, float]:
    """The median of ``values`` and their standard error relative to it, at least ``SPREAD_FLOOR``."""
    mid = statistics.median(values)
    error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mid, max(SPREAD_FLOOR, error / mid)


@dataclass(frozen=True)
class StepRatio:
    """A strategy's measured step over greedy's, in the race's mode: ``ratio`` (the median of the rounds'), and
    ``spread``, how sure it is: the rounds' standard error (their standard deviation over the square root of
    their number) relative to it, at least ``SPREAD_FLOOR``. Not the rounds' range: a shape then lost to a
    narrower one whenever both rounds' ranges summed past their gap (a start on an Intel Xeon took the 2-node
    tree, predicted 1.68× greedy, over the 8-node tree's 1.92×).

    The same rounds race it: ``speedup`` is greedy's wall time over its own for the same tokens (the median of
    the rounds', the race's figure; ``speedup_spread`` as ``spread``, or the error pooled over every label raced
    in the same rounds where that is larger: ``_pooled_error``), ``tokens`` its tokens per target forward
    there. None where only a step was timed (injected).

    ``per_round``: each round's (step over greedy's, speed-up, tokens a forward), what :func:`pooled` joins with
    other starts' rounds; ``starts``: how many starts' rounds the figures rest on (1: this one's); ``positions``:
    the positions its decode forwards verified, the median of the rounds' means (None: not counted), which says
    what the step's verify forward was (``pays.choose_prophet_shape`` moves a shape's step to the positions it
    verifies on other prompts along the curve)."""
    ratio: float
    spread: float
    rounds: int
    speedup: Optional[float] = None
    speedup_spread: float = 0.0
    tokens: Optional[float] = None
    per_round: tuple[tuple[float, float, float], ...] = ()
    starts: int = 1
    positions: Optional[float] = None


def step_ratios(lm: Any, runs: Mapping[str, tuple[str, Any]], pair: Any, *, tokens: int = TOKENS,
                repeats: int = REPEATS, hold: Callable[[], ContextManager] = contextlib.nullcontext
                ) -> dict[str, StepRatio]:
    """Each of ``runs`` (label -> (strategy, params)) against greedy in ``pair`` (its mode: ``fast`` as the runs'
    params say) on the default example: every label's median decode step over greedy's, greedy and every label
    timed in each of ``repeats`` rounds, in turn, after one short untimed warm-up of each. A step is the gap between
    two target forwards, so a drafting strategy's step holds its drafting and its loop's work, and a run's steps
    include the ones that draft nothing (a chain that stops at the confidence threshold). Each round also races
    them: greedy's wall time a token over the label's (``StepRatio.speedup``). ``hold``: entered around each run,
    warm-ups included (the app's ``Line.exclusive``: no visitor's run shares the cores with a timed one, and runs go
    between them rather than wait for a round: on a slow CPU a round of four 64-token races takes 20 s)."""
    if not runs:
        return {}
    fast = bool(getattr(next(iter(runs.values()))[1], "fast", False))
    ids = _prompt_ids(lm)
    calls = {"": _timed_run("greedy", GreedyParams(fast=fast), ids, pair),
             **{label: _timed_run(name, params, ids, pair) for label, (name, params) in runs.items()}}
    for call in calls.values():
        with hold():
            call(min(tokens, 8))
    per_round: dict[str, list[tuple[float, float, float]]] = {label: [] for label in runs}
    widths: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(max(1, repeats)):
        done = {}
        for label, call in calls.items():
            with hold():
                done[label] = call(tokens)
        greedy = done[""]
        for label in runs:
            run = done[label]
            step = statistics.median(run.steps_ms or [math.nan]) / statistics.median(greedy.steps_ms or [math.nan])
            per_round[label].append((step, _ms_a_token(greedy) / _ms_a_token(run),
                                     run.tokens / max(1, run.forwards)))
            if run.positions > 0:
                widths[label].append(run.positions)
    kept = {label: [r for r in rounds if all(math.isfinite(x) and x > 0 for x in r)]
            for label, rounds in per_round.items()}
    pooled = _pooled_error([[r[1] for r in ok] for ok in kept.values()])
    out = {}
    for label, ok in kept.items():
        if ok:
            ratio, spread = _median_error([r[0] for r in ok])
            speedup, speedup_spread = _median_error([r[1] for r in ok])
            out[label] = StepRatio(ratio, spread, len(ok), speedup, max(speedup_spread, pooled),
                                   statistics.median(r[2] for r in ok), tuple(ok),
                                   positions=statistics.median(widths[label]) if widths[label] else None)
    return out


def pooled(now: StepRatio, earlier: Sequence[Sequence[Sequence[float]]]) -> StepRatio:
    """``now`` (one start's race of a strategy, with its rounds) joined with the rounds of earlier starts of the same
    race on the same machine (``earlier``: one list of (step, speed-up, tokens) rounds per start): the medians over
    every round, and an error that is the largest of three (each relative, at least ``SPREAD_FLOOR``):

    * the rounds' own standard error over all of them;
    * ``now``'s error (pooled over the labels of its rounds: ``_pooled_error``) scaled down to the rounds pooled;
    * the starts' scatter: the standard deviation of each start's median over the square root of the starts. Two
      starts of one machine differ by more than their rounds say (the guest's memory rate moves between them), and
      a verdict must not call one start's luck sure.

    ``now`` unchanged where there is nothing earlier or it has no rounds."""
    groups = [[tuple(float(x) for x in r) for r in start] for start in earlier if start]
    if not groups or not now.per_round or now.speedup is None:
        return now
    groups.append(list(now.per_round))
    rounds = [r for group in groups for r in group]
    ratio, spread = _median_error([r[0] for r in rounds])
    speedup, error = _median_error([r[1] for r in rounds])
    medians = [statistics.median(r[1] for r in group) for group in groups]
    between = statistics.stdev(medians) / math.sqrt(len(medians)) / speedup
    scaled = now.speedup_spread * math.sqrt(len(now.per_round) / len(rounds))
    return StepRatio(ratio, spread, len(rounds), speedup, max(error, between, scaled),
                     statistics.median(r[2] for r in rounds), tuple(rounds), len(groups), now.positions)


def _pooled_error(groups: list[list[float]]) -> float:
    """The races' relative standard error pooled over every label (0 where there are too few rounds): each label's
    rounds scatter around its own median by the same noise (greedy's run in that round, the machine), and three
    rounds alone say little about it. In one process on an Intel Xeon, four sets of 3 rounds put prompt lookup at
    1.00, 0.99, 1.07 and 1.03x greedy with their own standard errors from 0.02 to 0.09: a verdict on one set's own
    error ticked it at one start and left it out at the next."""
    squares, free, rounds = 0.0, 0, []
    for values in groups:
        if len(values) > 1:
            mid = statistics.median(values)
            squares += sum((v / mid - 1.0) ** 2 for v in values)
            free += len(values) - 1
            rounds.append(len(values))
    return math.sqrt(squares / free) / math.sqrt(statistics.median(rounds)) if free else 0.0


def race_costs(lm: Any, fast: bool, *, width: int, tokens: int = TOKENS, repeats: int = REPEATS,
               hold: Callable[[], ContextManager] = contextlib.nullcontext) -> dict:
    """``{1: greedy's median decode step, width: a width-position verify forward}`` in ms, in the race's mode.
    ``hold``: entered around each timed run and forward, not around the whole (``forward_cost.calibrate``)."""
    steps = greedy_steps_ms(lm, fast, tokens=tokens, repeats=repeats, hold=hold)
    curve = forward_cost(lm, width, fast=fast, measure=functools.partial(calibrate, hold=hold))
    return {1: statistics.median(steps), width: curve(width)}


def race_measure(load: Callable[[str], Any], width: int, hold: Callable[[], ContextManager] = contextlib.nullcontext
                 ) -> Callable[[Any], dict]:
    """A ``runtime/routes.Measure``: a config's :func:`race_costs` at ``width``, its compiled configs timed inside
    ``compiled.building``; the load (its kernels' timing) and each timed run and forward inside ``hold`` (the app's
    line: a visitor's run goes between them, never beside them)."""
    def measure(config: Any) -> dict:
        with hold():
            lm = load(config.preset)
        with compiled.building(lm):
            return race_costs(lm, config.compiled, width=width, hold=hold)
    return measure

