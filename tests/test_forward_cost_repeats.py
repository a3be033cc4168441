"""The curve's adaptive repeats and its spread (decoding/runtime/forward_cost.py): a width whose fastest two
timings disagree is timed again (up to a cap), a settled one is not, and each width's spread is kept on the
curve. The timer is injected and the verify forward is a no-op: no wall-clock time is asserted on."""

from __future__ import annotations

import itertools

import pytest

from decoding.runtime import forward_cost as fc
from decoding.runtime.forward_cost import AGREE, EXTRA_COST, MAX_REPEATS, REPEATS, SPREAD_FLOOR, ForwardCost
from tiny_models import tiny_causal


def _scripted(monkeypatch, script: dict):
    """A timer whose times come from ``script`` (probe width -> an iterable of ms, ``"star"`` for the star
    probe; 10 ms where none is given), and the count of times each probe was timed."""
    current = {"key": None}

    def recording(session, root, tree, hidden=True):            # the forward itself is not run
        star = len(tree.tokens) > 2 and all(p == -1 for p in tree.parents)
        current["key"] = "star" if star else len(tree.tokens) + 1
    monkeypatch.setattr(fc, "tree_forward", recording)
    streams = {k: iter(v) for k, v in script.items()}
    counts: dict = {}

    def timer(fn):
        fn()
        key = current["key"]
        counts[key] = counts.get(key, 0) + 1
        return next(streams.get(key, itertools.repeat(10.0)), 10.0)
    return timer, counts


def test_a_width_whose_fastest_two_disagree_is_timed_again_and_a_settled_one_is_not(monkeypatch):
    """Kills repeats that stop at REPEATS whatever the spread (the flipping verdicts of issue 47), and repeats
    that time every width to the cap (a slow start)."""
    wide = [20.0 - i for i in range(100)]                          # never two within AGREE: up to the cap
    late = [10.0, 12.0, 14.0, 10.1]                                # settles at its fourth timing
    timer, counts = _scripted(monkeypatch, {6: wide, 4: late})
    curve = fc.calibrate(tiny_causal("llama"), 9, timer=timer)
    assert counts[6] == MAX_REPEATS and curve.samples[6] == MAX_REPEATS
    assert counts[4] == 4 and curve.samples[4] == 4
    for t in (1, 2, 3, 9):
        assert counts[t] == REPEATS, t                             # settled at once: no extra pass
    assert counts["star"] == REPEATS
    assert curve.points[6] == 11.0 and curve.points[4] == 10.0     # each keeps its fastest
    assert curve.spread[6] == pytest.approx(1 / 11)                # (12 - 11) / 11: the gap of its fastest two
    assert curve.spread[4] == pytest.approx(SPREAD_FLOOR)          # 1 %: floored
    assert curve.spread[1] == SPREAD_FLOOR
    assert curve.spread_known and curve.record()["max_spread"] == pytest.approx(1 / 11, abs=1e-4)


def test_a_busy_start_stops_its_extra_passes_at_the_budget(monkeypatch):
    """Every width unsettled (a busy machine): the extra passes stop once they have timed as many ms as the first
    REPEATS passes (EXTRA_COST), before the cap; what a width got is still its fastest and its spread."""
    noisy = {t: [10.0 * (1 + 0.1 * ((i * 7 + t) % 5)) for i in range(100)] for t in (1, 2, 3, 4, 6, 9)}
    timer, counts = _scripted(monkeypatch, noisy)
    curve = fc.calibrate(tiny_causal("llama"), 9, timer=timer)
    timed = [n for key, n in counts.items() if key != "star"]
    assert REPEATS < min(timed) and max(timed) < MAX_REPEATS       # more than the fixed passes, less than the cap
    first = sum(sum(noisy[t][:REPEATS]) for t in noisy)
    extra = sum(sum(noisy[t][REPEATS:counts[t]]) for t in noisy)
    assert EXTRA_COST * first <= extra <= EXTRA_COST * first + 6 * 15.0     # within one pass past the budget
    assert all(curve.spread[t] >= 0.1 - 1e-9 for t in noisy)       # the wide spread is reported, not hidden


def test_the_star_probe_is_repeated_like_a_width(monkeypatch):
    timer, counts = _scripted(monkeypatch, {"star": [40.0, 30.0, 50.0, 22.0, 21.9]})
    curve = fc.calibrate(tiny_causal("llama"), 9, timer=timer)
    assert counts["star"] == 5                                   # 22 and 21.9 agree: stop
    assert curve.per_path_ms == pytest.approx((21.9 - 10.0) / (fc.STAR - 1 - fc.PROBE_PATHS))


def test_the_cap_and_a_fixed_count_are_the_callers(monkeypatch):
    wide = [20.0 - i for i in range(100)]
    timer, counts = _scripted(monkeypatch, {2: wide})
    fc.calibrate(tiny_causal("llama"), 4, timer=timer, max_repeats=5)
    assert counts[2] == 5 and counts[1] == REPEATS
    timer, counts = _scripted(monkeypatch, {2: wide})
    curve = fc.calibrate(tiny_causal("llama"), 4, timer=timer, repeats=2)   # a fixed count, as before
    assert counts[2] == counts[1] == 2 and curve.samples == {1: 2, 2: 2, 3: 2, 4: 2}
    timer, counts = _scripted(monkeypatch, {2: wide})
    once = fc.calibrate(tiny_causal("llama"), 4, timer=timer, repeats=1)
    assert counts[2] == 1 and once.spread == {} and not once.spread_known      # one timing: spread unknown


def test_repeat_bounds():
    assert fc.repeat_bounds(None, None) == (REPEATS, MAX_REPEATS)
    assert fc.repeat_bounds(2, None) == (2, 2) and fc.repeat_bounds(2, 6) == (2, 6)
    assert fc.repeat_bounds(None, 1) == (REPEATS, REPEATS) and fc.repeat_bounds(0, None) == (1, 1)
    assert 0 < SPREAD_FLOOR < AGREE < 0.1


def test_the_spread_is_read_between_widths_and_validated():
    curve = ForwardCost({1: 10.0, 4: 11.0, 9: 14.0}, spread={1: 0.02, 4: 0.08, 9: 0.03})
    assert curve.spread_at(1) == 0.02 and curve.spread_at(4) == 0.08 and curve.spread_at(9) == 0.03
    assert curve.spread_at(2.5) == 0.08 and curve.spread_at(6) == 0.08        # the less sure end
    assert curve.spread_at(0) == 0.02 and curve.spread_at(40) == 0.03          # beyond the ends: the end's
    assert ForwardCost({1: 10.0}).spread_at(3) == 0.0 and not ForwardCost({1: 10.0}).spread_known
    for bad in ({1: -0.1}, {1: float("inf")}, {2: 0.1}):
        with pytest.raises(ValueError, match="spread"):
            ForwardCost({1: 10.0, 4: 11.0}, spread=bad)
