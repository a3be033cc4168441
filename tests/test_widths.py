"""Widths from the measured forward-cost curve (decoding/runtime/widths.py) and the 'pays' verdict
(decoding/harness/pays.py): the choice follows the curve, the user's value always wins, auto stays lossless."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from decoding.events import WidthChosen
from decoding.harness.pays import PROPHET, Expectation, default_comparison, verdict, verdicts
from decoding.harness.runner import shown_params
from decoding.params import GreedyParams, JacobiParams, LookaheadParams
from decoding.runtime.forward_cost import ForwardCost
from decoding.runtime.models import ModelState
from decoding.runtime.pair import ModelPair
from decoding.runtime.widths import (BLOCKS, CURVE_WIDTH, FALLBACK, STEP, WINDOWS, WidthChoice, choose_block,
                                     choose_window, jacobi_block, jacobi_forward_ms, jacobi_tokens,
                                     lookahead_positions, lookahead_tokens, lookahead_window)
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.tracer import Tracer
from tiny_models import ARCHS, tiny_causal

WIDTHS = (1, 2, 4, 8, 16, 33)


def curve(per_position: float, one: float = 10.0) -> ForwardCost:
    """c(T) = one + per_position * (T - 1) ms at the measured widths: 0 is flat, larger is steeper."""
    return ForwardCost({t: one + per_position * (t - 1) for t in WIDTHS})


FLAT, CHEAP, DEAR = curve(0.0), curve(0.05), curve(2.0)


# --------------------------------------------------------------------------- the choice follows the curve

def test_cheap_wide_forwards_choose_a_wider_window_and_block_than_dear_ones():
    # an inverted ratio (c / E instead of E / c) or a curve read backwards picks the other way round
    assert choose_window(CHEAP).value > choose_window(DEAR).value
    assert choose_block(CHEAP, "sliding").value > choose_block(DEAR, "sliding").value
    assert choose_block(CHEAP, "hybrid").value > choose_block(DEAR, "hybrid").value


def test_a_flat_curve_chooses_the_widest_and_a_steep_one_the_narrowest():
    assert choose_window(FLAT).value == max(WINDOWS)
    assert choose_block(FLAT, "hybrid").value == max(BLOCKS) and choose_block(FLAT, "sliding").value == max(BLOCKS)
    steep = ForwardCost({1: 1.0, 64: 64.0})              # c(T) = T: every extra position costs a whole forward
    assert choose_window(steep).value == min(WINDOWS) and choose_block(steep, "sliding").value == min(BLOCKS)


@pytest.mark.parametrize("cost", [CHEAP, curve(0.5), DEAR, ForwardCost({1: 5.0, 9: 6.0, 10: 9.0, 33: 12.0})])
def test_the_choice_has_the_most_expected_tokens_per_ms(cost):
    """Every other window (block) is worth at most the chosen one, by the stated model E / c(T)."""
    w = choose_window(cost, ngram=4, guess_set=4)
    step = STEP * cost(1)                           # the loop's own work a step, the same at every width
    value = {x: lookahead_tokens(x, 4) / (cost(lookahead_positions(x, 4, 4)) + step) for x in WINDOWS}
    assert value[w.value] == pytest.approx(max(value.values()))
    assert w.predicted_speedup == pytest.approx(value[w.value] * cost(1))
    assert w.cost_ratio == pytest.approx(cost(w.positions) / cost(1))
    b = choose_block(cost, "hybrid")
    block_value = {n: jacobi_tokens(n, "hybrid") / (jacobi_forward_ms(n, "hybrid", cost)[1] + step) for n in BLOCKS}
    assert block_value[b.value] == pytest.approx(max(block_value.values()))


def test_only_widths_the_curve_covers_are_chosen():
    # beyond its widest measured width a curve is flat: a window it does not cover would look free
    assert choose_window(ForwardCost({1: 10.0, 12: 10.0})).value == 3       # W = 3: 12 positions, W = 4: 15
    assert choose_window(ForwardCost({1: 10.0, 9: 10.0})).value == 2
    assert choose_block(ForwardCost({1: 10.0, 6: 10.0}), "sliding").value == 6
    assert choose_window(ForwardCost({1: 10.0}), ngram=8).value == min(WINDOWS)      # the narrowest stays


def test_the_stated_models():
    # lookahead: fitted to the recorded sweep (1.12 / 1.21 / 1.27 / 1.34 at W = 1 / 2 / 3 / 5, N = 4)
    assert [round(lookahead_tokens(w, 4), 2) for w in (1, 2, 3, 5)] == [1.13, 1.21, 1.26, 1.34]
    assert lookahead_positions(2, 4, 4) == 1 + 2 + 3 * 2 and lookahead_positions(2, 2, 1) == 1 + 1 + 2
    assert lookahead_tokens(3, 3) < lookahead_tokens(3, 4) == lookahead_tokens(3, 6)
    # Jacobi: a block of 1 is greedy; hybrid's inputs shrink n..1 within a block, sliding feeds n every time
    assert jacobi_tokens(1, "hybrid") == 1.0 and jacobi_tokens(8, "sliding") > jacobi_tokens(8, "hybrid") > 1.0
    assert jacobi_forward_ms(4, "hybrid", DEAR) == (2.5, pytest.approx((10 + 12 + 14 + 16) / 4))
    assert jacobi_forward_ms(4, "sliding", DEAR) == (4.0, pytest.approx(16.0))


# --------------------------------------------------------------------------- a run's width

def _lm(device: str = "cpu", encoder_decoder: bool = False, curve_: ForwardCost | None = None):
    """A stand-in model: what lookahead_window / jacobi_block read (its curve kept on its state, as measured)."""
    state = ModelState(forward_cost={False: curve_} if curve_ is not None else {})
    return SimpleNamespace(device=torch.device(device), is_encoder_decoder=encoder_decoder, state=state)


def test_a_user_value_is_never_overridden():
    for cost in (FLAT, DEAR):                      # auto would choose 8 and 1 windows here
        lm = _lm(curve_=cost)
        got = lookahead_window(lm, LookaheadParams(window=5))
        assert (got.value, got.source, got.shown) == (5, "user", "window=5")
        got = jacobi_block(lm, JacobiParams(block_size=5))
        assert (got.value, got.source, got.shown) == (5, "user", "block_size=5")
    # an explicit value never even asks for a curve (no curve here, and none could be timed)
    bare = SimpleNamespace(device=torch.device("cpu"), is_encoder_decoder=False, state=None)
    assert lookahead_window(bare, LookaheadParams(window=3)).value == 3
    assert jacobi_block(bare, JacobiParams(block_size=3)).value == 3


def test_auto_reads_the_models_curve_and_shows_itself():
    wide, narrow = lookahead_window(_lm(curve_=FLAT), LookaheadParams()), lookahead_window(_lm(curve_=DEAR), LookaheadParams())
    assert (wide.value, wide.source, wide.shown) == (max(WINDOWS), "curve", f"window=auto→{max(WINDOWS)}")
    assert narrow.value < wide.value and narrow.auto
    assert jacobi_block(_lm(curve_=FLAT), JacobiParams()).shown == f"block_size=auto→{max(BLOCKS)}"
    rec = wide.record()
    assert rec["shown"] == wide.shown and rec["source"] == "curve" and rec["predicted_speedup"] > 1


def test_auto_without_a_curve_falls_back():
    for lm in (_lm("cuda"), _lm(encoder_decoder=True)):
        assert lookahead_window(lm, LookaheadParams()) == WidthChoice("window", FALLBACK["window"], "fallback")
        assert jacobi_block(lm, JacobiParams()) == WidthChoice("block_size", FALLBACK["block_size"], "fallback")
    # PJ (variant jacobi) has no block: nothing to choose, nothing timed
    assert jacobi_block(_lm(), JacobiParams(variant="jacobi")).source == "fallback"


@pytest.mark.parametrize("bad,msg", [({"window": -1}, "window must be in [0, 32]"),
                                     ({"window": 1.5}, "window must be an integer")])
def test_window_is_validated(bad, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        LookaheadParams(**bad)


def test_a_width_choice_is_validated():
    with pytest.raises(ValueError, match="source"):
        WidthChoice("window", 2, "guess")
    with pytest.raises(ValueError, match="window must be a positive integer"):
        WidthChoice("window", 0, "user")


# --------------------------------------------------------------------------- lossless whatever the width

def _with_curve(lm, cost: ForwardCost):
    """Give a loaded model a measured curve (what forward_cost keeps on it), so the test picks the width."""
    lm.state.forward_cost[False] = ForwardCost({**cost.points, CURVE_WIDTH: cost(CURVE_WIDTH)})
    return lm


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_widths_give_greedys_tokens(arch):
    ids = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    for cost, window, block in ((FLAT, max(WINDOWS), max(BLOCKS)), (DEAR, min(WINDOWS), min(BLOCKS))):
        lm = _with_curve(tiny_causal(arch, seed=3, scale=4.0), cost)
        ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=28).token_ids
        res = lookahead(ids, ModelPair(lm), LookaheadParams(), max_new_tokens=28)
        assert res.token_ids == ref
        assert res.stats["window"] == window and res.stats["width_choice"]["shown"] == f"window=auto→{window}"
        for variant in ("hybrid", "sliding", "gs_jacobi"):
            out = jacobi(ids, ModelPair(lm), JacobiParams(variant=variant), max_new_tokens=28)
            assert out.token_ids == ref, variant
            assert out.stats["width_choice"]["source"] == "curve"
            assert out.stats["block_size"] == block, variant
        assert set(lm.state.forward_cost) == {False}                             # the injected curve, not re-timed


def test_a_traced_run_records_its_width_and_shown_params_resolve_auto():
    lm = _with_curve(tiny_causal("llama", seed=1, scale=4.0), FLAT)
    tracer = Tracer()
    res = lookahead([5, 6, 7, 5, 6], ModelPair(lm), LookaheadParams(), max_new_tokens=8, tracer=tracer)
    first = tracer.events[0]
    assert isinstance(first, WidthChosen) and (first.name, first.value, first.source) == ("window", 8, "curve")
    assert first.predicted_speedup == res.stats["width_choice"]["predicted_speedup"] > 1
    assert shown_params(LookaheadParams(), ModelPair(lm))["window"] == f"auto→{max(WINDOWS)}"
    assert shown_params(LookaheadParams(window=3), ModelPair(lm))["window"] == 3
    assert shown_params(JacobiParams(), ModelPair(lm))["block_size"] == f"auto→{max(BLOCKS)}"
    tracer = Tracer()
    jacobi([5, 6, 7], ModelPair(lm), JacobiParams(block_size=4), max_new_tokens=6, tracer=tracer)
    assert tracer.events[0] == WidthChosen(step=0, name="block_size", value=4, source="user")


# --------------------------------------------------------------------------- does it pay here?

DEFAULT = ("greedy", "prophet", "prompt_lookup", "lookahead")


def test_the_verdict_flips_when_the_curve_flips():
    assert verdict("lookahead", FLAT).pays and not verdict("lookahead", DEAR).pays
    assert verdict("prophet", FLAT).pays and not verdict("prophet", curve(5.0)).pays
    sliding = JacobiParams(variant="sliding")
    assert verdict("jacobi", FLAT, sliding).pays and not verdict("jacobi", DEAR, sliding).pays
    assert not verdict("jacobi", FLAT).pays          # hybrid: ~1 token per forward, which never pays its loop
    assert verdict("greedy", DEAR).pays and verdict("greedy", DEAR).speedup == pytest.approx(1.0)


def test_the_verdict_is_the_stated_formula_and_its_line_says_why():
    v = verdict("prophet", DEAR)
    ratio = DEAR(PROPHET.positions) / DEAR(1) + PROPHET.drafting + STEP
    assert v.cost_ratio == pytest.approx(ratio) and v.speedup == pytest.approx(PROPHET.tokens / ratio)
    la = verdict("lookahead", DEAR, LookaheadParams(window=3))       # the user's window is judged, not auto's
    t = lookahead_positions(3, 4, 4)
    forward = DEAR(t) / DEAR(1)
    assert la.width.shown == "window=3" and la.positions == t
    assert la.speedup == pytest.approx(lookahead_tokens(3, 4) / (forward + STEP))
    assert la.reason.startswith(f"lookahead (at window=3): a {t:.0f}-position forward costs {forward:.2f}× one "
                                f"position here; with its loop it needs ≥ {forward + STEP:.2f} tokens per "
                                f"forward and makes ~{lookahead_tokens(3, 4):.2f}: does not pay")
    # the auto window's verdict predicts what the run's own width choice predicts (one model for both)
    auto = verdict("lookahead", curve(0.3))
    assert auto.speedup == pytest.approx(choose_window(curve(0.3)).predicted_speedup)
    assert verdict("beam", DEAR).speedup is None and verdict("beam", DEAR).pays     # no model: not judged


def test_default_comparison_keeps_what_pays_and_says_why_for_the_rest(copying_example):
    # a default example with text to copy (prompt lookup's count before min_ngram), so that FLAT ticks it
    cheap = default_comparison(FLAT, DEFAULT)
    assert cheap.strategies == DEFAULT and cheap.left_out == () and cheap.note == ""
    dear = default_comparison(curve(5.0), DEFAULT)
    assert dear.strategies == ("greedy",) and dear.left_out == DEFAULT[1:]
    assert [line.split(":")[0].split(" (")[0] for line in dear.notes] == list(DEFAULT[1:])
    assert all("does not pay" in line for line in dear.notes)
    assert [v.strategy for v in verdicts(FLAT, DEFAULT)] == list(DEFAULT)


def test_an_expectation_is_validated():
    with pytest.raises(ValueError, match="tokens"):
        Expectation(tokens=0.5, positions=2)
    with pytest.raises(ValueError, match="positions"):
        Expectation(tokens=1.5, positions=0)


def test_a_width_event_survives_a_trace_export_and_import():
    from test_visualize import _result
    from visualize.traces import export_trace, import_trace
    from decoding.events import event_to_dict
    event = event_to_dict(WidthChosen(step=0, name="window", value=3, source="curve", tokens_per_forward=1.26,
                                      cost_ratio=1.09, predicted_speedup=1.1))
    base = _result()
    back = import_trace(export_trace({"results": [_result(events=[event] + base["events"])]}))
    assert back["results"][0]["events"][0] == event
    for bad, msg in (({"source": "guess"}, "source must be one of user, curve, fallback"),
                     ({"name": "width"}, "name must be one of window, block_size")):
        with pytest.raises(ValueError, match=msg):
            import_trace(export_trace({"results": [_result(events=[{**event, **bad}] + base["events"])]}))


def test_a_curve_that_pays_per_path_narrows_lookahead_and_can_flip_its_verdict():
    """Row-exact attention (bfloat16 weights) lays each root-to-leaf path out apart: a lookahead window of W
    columns is W + 1 paths. A curve that measured a cost per path must narrow the window and lower its verdict;
    one without it (0 per path) must not change either."""
    from decoding.harness.pays import verdict
    from decoding.runtime.forward_cost import ForwardCost
    from decoding.runtime.widths import choose_window
    points = {t: 10.0 + 0.02 * (t - 1) for t in (1, 2, 4, 8, 16, 33)}
    flat, per_path = ForwardCost(points), ForwardCost(points, per_path_ms=1.5)
    assert flat.tree(9, 8) == flat(9) and per_path.tree(9, 8) == per_path(9) + 6 * 1.5
    assert per_path.tree(9, 1) == per_path(9)                   # fewer paths than the probe's: no discount
    assert choose_window(per_path).value < choose_window(flat).value
    assert verdict("lookahead", per_path).speedup < verdict("lookahead", flat).speedup
    assert verdict("prompt_lookup", per_path).speedup == verdict("prompt_lookup", flat).speedup   # a chain
    with pytest.raises(ValueError, match="per_path_ms"):
        ForwardCost(points, per_path_ms=-1.0)


def test_calibration_measures_the_cost_of_a_path_only_where_paths_cost(monkeypatch):
    """The star probe (the root and 8 leaves, 8 paths) against the 2-path probe of the same width: a model whose
    rows cost per path gets a positive per_path_ms; the timer here makes paths cost 2 ms each."""
    from decoding.runtime import forward_cost as fc
    lm = tiny_causal("llama")
    calls = {"paths": None}
    real_forward = fc.tree_forward

    def counting(session, root, tree, hidden=True):
        calls["paths"] = sum(1 for i in range(len(tree.tokens)) if i not in set(tree.parents))
        return real_forward(session, root, tree, hidden=hidden)
    monkeypatch.setattr(fc, "tree_forward", counting)

    def timer(fn):
        fn()
        return 10.0 + 2.0 * max(0, calls["paths"] - 2)
    curve = fc.calibrate(lm, 9, timer=timer, repeats=1)
    assert curve.per_path_ms == pytest.approx(2.0)
    assert fc.calibrate(lm, 9, timer=lambda fn: (fn(), 10.0)[1], repeats=1).per_path_ms == 0.0
