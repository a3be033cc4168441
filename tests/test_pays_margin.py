"""Verdicts that hold (issue 47 item 5): decoding/harness/pays.py ticks a strategy only when its predicted
speed-up clears 1 by the margin the curve's measured spread gives, calls one inside that band "too close to
call" (left out, and its line says so), and says in every line how sure it is; runtime/widths.py's auto
widths prefer the narrower width unless a wider one wins by more than the noise. Two curves that differ only
by noise within their measured spread must not flip a verdict or an auto width."""

from __future__ import annotations

import math
import random
import re

import pytest

from decoding.harness.pays import Verdict, default_comparison, verdict, verdicts
from decoding.params import JacobiParams, LookaheadParams
from decoding.runtime.forward_cost import ForwardCost
from decoding.runtime.widths import (STEP, choose_block, choose_window, lookahead_positions, lookahead_tokens,
                                     ratio_spread)

WIDTHS = (1, 2, 4, 6, 9, 12, 15, 18, 21, 24, 27, 33)
DEFAULT = ("greedy", "prophet", "prompt_lookup", "lookahead")

# these curves sit prompt lookup's break-even where its model put it when they were written: the margin's logic
# is under test, not the count
pytestmark = pytest.mark.usefixtures("copying_example")


def _curve(ratio, scale=None, spread=None) -> ForwardCost:
    """c(T) = 10 ms * ratio(T) at WIDTHS, each width times ``scale[T]`` (noise), with a relative ``spread``
    at every width (None: a curve that says nothing about how sure it is)."""
    scale = scale or {}
    return ForwardCost({t: 10.0 * ratio(t) * scale.get(t, 1.0) for t in WIDTHS},
                       spread={t: spread for t in WIDTHS} if spread is not None else {})


def _bare(curve: ForwardCost) -> ForwardCost:
    """The same curve without its spread: what the verdicts saw before the margin."""
    return ForwardCost(curve.points, per_path_ms=curve.per_path_ms)


def _edge(t: float) -> float:
    """c(2.7) / c(1) = 1.05: prompt lookup (1.10 tokens a forward of 2.7 positions) right at greedy's speed."""
    return 1 + 0.05 / 1.7 * (t - 1) if t <= 4 else 1 + 0.05 / 1.7 * 3 + 0.5 * (t - 4)


def _linear(per_position: float):
    return lambda t: 1 + per_position * (t - 1)


# --------------------------------------------------------------------------- a verdict does not flip on noise

def test_two_curves_within_their_spread_give_prompt_lookup_the_same_verdict():
    """The EPYC of issue 47: the same quiet machine, two starts, c(T) 2 % apart where prompt lookup's forward
    sits. Without the margin one start ticks it and the other does not; with it both call it too close."""
    fast_start = _curve(_edge, {2: 0.98, 4: 0.98}, spread=0.03)
    slow_start = _curve(_edge, {2: 1.02, 4: 1.02}, spread=0.03)
    bare = [verdict("prompt_lookup", _bare(c)) for c in (fast_start, slow_start)]
    assert [v.pays for v in bare] == [True, False]                      # the bug: noise flips the tick
    judged = [verdict("prompt_lookup", c) for c in (fast_start, slow_start)]
    assert [v.call for v in judged] == [Verdict.CLOSE, Verdict.CLOSE]
    assert [v.pays for v in judged] == [False, False]                  # the rule: too close is not ticked
    for v in judged:
        assert abs(v.speedup - 1) < v.margin
    kept = [default_comparison(c, DEFAULT) for c in (fast_start, slow_start)]
    assert kept[0].strategies == kept[1].strategies and all("prompt_lookup" in k.left_out for k in kept)
    assert [default_comparison(_bare(c), DEFAULT).strategies for c in (fast_start, slow_start)] == [
        ("greedy", "prompt_lookup"), ("greedy",)]                      # the page's ticks flipped before


@pytest.mark.parametrize("strategy,params", [
    ("prompt_lookup", None), ("prophet", None), ("lookahead", LookaheadParams(window=3)),
    ("jacobi", JacobiParams(variant="sliding", block_size=8)), ("jacobi", JacobiParams(block_size=6))])
def test_no_two_starts_within_the_spread_call_pays_and_does_not_pay(strategy, params):
    """Random machines (a curve around the break-even point) and two starts each, every width off by at most
    half its measured spread: never "pays" at one start and "does not pay" at the other. Without the margin
    the same starts contradict each other (checked, so that this test can fail)."""
    rng = random.Random(47)
    contradictions, bare_contradictions = 0, 0
    for _ in range(300):
        # around each one's break-even: the prophet's on the default example (a summary it copies) is near 0.26
        per_position = rng.uniform(0.0, 0.5 if strategy == "prophet" else 0.25)
        s = rng.choice([0.02, 0.04, 0.08])
        starts = [_curve(_linear(per_position), {t: 1 + rng.uniform(-s / 2, s / 2) for t in WIDTHS}, s)
                  for _ in range(2)]
        calls = {verdict(strategy, c, params).call for c in starts}
        contradictions += {Verdict.PAYS, Verdict.SLOWER} <= calls
        bare_calls = {verdict(strategy, _bare(c), params).call for c in starts}
        bare_contradictions += {Verdict.PAYS, Verdict.SLOWER} <= bare_calls
    assert bare_contradictions > 0
    assert contradictions == 0


# --------------------------------------------------------------------------- the margin's direction

def test_the_margin_keeps_out_what_is_slower_and_ticks_only_what_clears_it():
    """An inverted margin (ticked when speedup + margin >= 1, or left out when speedup - margin >= 1) ticks a
    slower strategy or drops a clearly faster one."""
    noisy = 0.04
    slower = _curve(_linear(0.25), spread=noisy)          # prompt lookup: 1.10 / (1.425 + 0.05) = 0.75
    v = verdict("prompt_lookup", slower)
    assert v.speedup + v.margin < 1 and v.call == Verdict.SLOWER and not v.pays
    just_under = _curve(_edge, {2: 1.02, 4: 1.02}, spread=noisy)    # 0.98 ± 0.07: inside the band
    v = verdict("prompt_lookup", just_under)
    assert v.speedup < 1 < v.speedup + v.margin and v.call == Verdict.CLOSE and not v.pays
    just_over = _curve(_edge, {2: 0.98, 4: 0.98}, spread=noisy)     # 1.02 ± 0.07: inside the band, not ticked
    v = verdict("prompt_lookup", just_over)
    assert v.speedup - v.margin < 1 < v.speedup and v.call == Verdict.CLOSE and not v.pays
    flat = _curve(_linear(0.0), spread=noisy)                       # prophet: 2.21 / 1.30 = 1.70
    v = verdict("prophet", flat)
    assert v.speedup - v.margin >= 1 and v.call == Verdict.PAYS and v.pays
    kept = default_comparison(slower, DEFAULT)
    assert "prompt_lookup" in kept.left_out and "prompt_lookup" not in kept.strategies
    assert "greedy" in default_comparison(_curve(_linear(5.0), spread=0.5), DEFAULT).strategies


def test_the_margin_is_the_stated_first_order_band():
    curve = _curve(_linear(0.1), spread=0.05)
    v = verdict("prompt_lookup", curve)
    forward = curve(2.7) / curve(1)
    r = ratio_spread(curve, 2.7)
    assert r == pytest.approx(0.10)                                # c(2.7)'s spread and c(1)'s
    assert v.margin == pytest.approx(v.speedup * forward * r / (forward + STEP))
    assert verdict("greedy", curve).margin == 0 and verdict("greedy", curve).pays
    wider = _curve(_linear(0.1), spread=0.10)
    assert verdict("prompt_lookup", wider).margin > v.margin       # less sure curve, wider band
    assert verdict("prompt_lookup", wider).speedup == pytest.approx(v.speedup)   # the same central value
    # a curve without a spread: no margin, the sign of speedup - 1 decides (1 itself pays)
    bare = verdict("prompt_lookup", _bare(curve))
    assert bare.margin is None and bare.pays == (bare.speedup >= 1)
    assert Verdict("x", 1.0, margin=None).pays and not Verdict("x", 1.0, margin=0.01).pays


# --------------------------------------------------------------------------- the line says how sure

def test_every_line_says_how_sure_its_verdict_is():
    """Kills a line without the certainty (the page's note under the strategy picker)."""
    curve = _curve(_linear(2.0), spread=0.05)
    comparison = default_comparison(curve, DEFAULT)
    assert comparison.strategies == ("greedy",) and len(comparison.notes) == 3
    for v, line in zip([x for x in verdicts(curve, DEFAULT) if x.strategy != "greedy"], comparison.notes):
        assert line == v.reason
        assert f"(predicted {v.speedup:.2f}× greedy, ±{v.margin:.2f} from the curve's spread)" in line
        assert v.margin > 0.005                                    # a real band, not ±0.00
        assert re.search(r": does not pay \(predicted \d\.\d\d× greedy, ±\d\.\d\d from the curve's spread\)$",
                         line), line
    close = verdict("prompt_lookup", _curve(_edge, spread=0.03))
    assert ": too close to call, left out (predicted 1.00× greedy, ±0.06 from the curve's spread)" in close.reason
    unknown = verdict("prompt_lookup", _curve(_linear(2.0)))
    assert unknown.reason.endswith("does not pay (predicted 0.25× greedy, the curve has no measured spread)")
    # the existing shape stays: what its forward costs, what it needs, what it makes, then the verdict
    assert close.reason.startswith("prompt_lookup: a 3-position forward costs 1.05× one position here; with its "
                                   "loop it needs ≥ 1.10 tokens per forward and makes ~1.10: ")


# --------------------------------------------------------------------------- auto widths do not flip on noise

def _plateau_ratio():
    """c(T) / c(1) where lookahead's windows 1, 2 and 3 (6, 9 and 12 positions) are worth the same, and wider
    ones clearly less: the auto window sits on a plateau that noise tips either way."""
    e1, a = lookahead_tokens(1, 4), 1.15
    at = {6: a, **{lookahead_positions(w, 4, 4): (a + STEP) * lookahead_tokens(w, 4) / e1 - STEP for w in (2, 3)}}

    def ratio(t):
        if t <= 6:
            return 1 + (a - 1) * (t - 1) / 5
        return at.get(t, at[12] + 0.3 * (t - 12))
    return ratio


def test_two_curves_within_their_spread_choose_the_same_auto_window():
    """Issue 47: lookahead auto→1 at one start, auto→3 at the next. Without the noise rule these two starts
    (1.5 % apart, spread 3 %) choose 3 and 1; with it, both the narrowest within the noise: 1."""
    ratio = _plateau_ratio()
    one_start = _curve(ratio, {12: 0.985}, spread=0.03)
    next_start = _curve(ratio, {12: 1.015, 6: 0.985}, spread=0.03)
    assert [choose_window(_bare(c)).value for c in (one_start, next_start)] == [3, 1]      # the bug
    assert [choose_window(c).value for c in (one_start, next_start)] == [1, 1]
    assert [verdict("lookahead", c).width.shown for c in (one_start, next_start)] == ["window=auto→1"] * 2
    # a wider window that wins by more than the noise is still chosen: the narrowest within it of the best
    flat = _curve(_linear(0.0), spread=0.03)
    value = {w: lookahead_tokens(w, 4) / (1 + STEP) for w in range(1, 9)}            # c(T) = c(1) everywhere
    noise = 2 * 0.03 / (1 + STEP)                          # each forward's spread; the loop's STEP is sure
    within = min(w for w in value if value[w] * (1 + noise) >= max(value.values()))
    assert 1 < within < 8 and choose_window(flat).value == within
    assert choose_window(_bare(flat)).value == 8


def test_the_auto_block_prefers_the_narrower_within_the_noise():
    for s in (0.03, 0.2):
        flat = _curve(_linear(0.0), spread=s)
        value = {n: (1 + 0.047 * math.log2(n)) / (1 + STEP) for n in range(2, 17)}     # sliding, c(T) = c(1)
        within = min(n for n in value if value[n] * (1 + 2 * s / (1 + STEP)) >= max(value.values()))
        assert choose_block(flat, "sliding").value == within < 16
        assert choose_block(_bare(flat), "sliding").value == 16
    # hybrid: its forwards shrink n..1, a flat curve's mean forward is c(1), and its spread each width's
    assert choose_block(_curve(_linear(0.0), spread=0.03), "hybrid").value < choose_block(
        _curve(_linear(0.0)), "hybrid").value == 16
