"""The prophet's step shape from this machine's curve (decoding/harness/pays.choose_prophet_shape): the 8-node tree
where a wide verify forward is cheap, a smaller tree or a short chain where it is not; the page's prophet fields
start on the chosen shape, examples are recorded with it, and the prophet's verdict judges it."""

from __future__ import annotations

import dataclasses
import statistics
from types import SimpleNamespace

import pytest

from decoding.harness.pays import PROPHET, PROPHET_SHAPES, SHAPE_FIELDS, choose_prophet_shape, shape_of, verdict
from decoding.harness.steps import StepRatio
from decoding.runtime.forward_cost import ForwardCost
from decoding.strategies import registry
from web.page_start import start_views, strategies_note
from web.requests import default_request, ui_default
from web.settings import Settings
from web.startup import chosen_strategies

WIDTHS = (1, 2, 4, 8, 16, 33)


def _curve(slope: float, spread: float = 0.0) -> ForwardCost:
    """c(T) = 10 ms * (1 + slope * (T - 1)); ``spread``: each width's measured relative spread."""
    return ForwardCost({t: 10.0 * (1 + slope * (t - 1)) for t in WIDTHS},
                       spread={t: spread for t in WIDTHS} if spread else {})


def _shape(name: str):
    return next(s for s in PROPHET_SHAPES if s.name == name)


@pytest.mark.parametrize("slope, name", [(0.0, "tree8"), (0.01, "tree8"), (0.1, "tree2"), (0.15, "tree2"),
                                         (0.9, "chain1")])
def test_the_shape_follows_the_cost_of_a_wide_forward(slope, name):
    """Flat: the widest tree (most tokens a forward); steeper: narrower steps. Choosing the slowest shape, or
    judging by tokens alone, or by the cost alone, each fails one of these rows."""
    choice = choose_prophet_shape(_curve(slope))
    assert choice.shape.name == name
    # judged on prompts the project did not write (the shape serves every prompt), with its drafting and the step
    e, c = choice.shape.expectation, _curve(slope)
    T = choice.shape.unseen_positions
    assert choice.predicted == pytest.approx(choice.shape.unseen_tokens / (c(T) / c(1) + e.drafting + 0.05))
    assert choice.predicted >= choice.default_predicted
    if name != "tree8":     # the choice is worth making: it beats the default on the same curve
        assert choice.predicted > 1.05 * choice.default_predicted
        assert "too much" in choice.reason and f"{choice.default_predicted:.2f}" in choice.reason


def test_every_shape_is_the_best_on_some_curve_and_a_near_tie_goes_to_the_narrower():
    """The table is ordered narrowest first and no shape is dominated on every slope; within the curve's noise
    the narrower shape wins (a wider one must pay by more than the noise)."""
    positions = [s.expectation.positions for s in PROPHET_SHAPES]
    assert positions == sorted(positions) and PROPHET_SHAPES[-1].expectation is PROPHET
    seen = {choose_prophet_shape(_curve(k / 100)).shape.name for k in range(0, 80)}
    assert seen >= {"tree8", "tree4", "tree2", "chain1"}
    # at 4.5 % a position the shapes are within a few percent of each other: a sure curve -> the best one (the
    # 8-node tree), a curve whose widths are each known to 5 % -> a narrower one within that noise of it
    sure, noisy = choose_prophet_shape(_curve(0.045)), choose_prophet_shape(_curve(0.045, spread=0.05))
    assert sure.shape.name == "tree8"
    assert noisy.shape.expectation.positions < sure.shape.expectation.positions
    assert noisy.predicted * 1.25 >= sure.predicted         # within the noise: 5 % at both ends of two ratios


def test_params_name_their_shape_and_the_verdict_judges_it():
    parse = registry()["prophet"].parse
    for shape in PROPHET_SHAPES:
        assert shape_of(shape.parsed()) is shape
        assert shape_of(dataclasses.replace(shape.parsed(), fast=True)) is shape      # the mode is not the shape
    assert shape_of(None) is PROPHET_SHAPES[-1] and shape_of(parse({})) is PROPHET_SHAPES[-1]
    assert shape_of(parse({"tree_nodes": 5})) is None and shape_of(parse({"tree": "false"})) is None
    steep = _curve(0.2)
    tree2 = verdict("prophet", steep, _shape("tree2").parsed())
    default = verdict("prophet", steep)
    assert tree2.positions == _shape("tree2").expectation.positions and tree2.tokens == 4.385
    assert default.positions == PROPHET.positions and tree2.speedup > default.speedup
    # parameters of no recorded shape are judged as the default tree, as before shapes were chosen
    assert verdict("prophet", steep, parse({"tree_nodes": 5})).speedup == default.speedup


def _steps(**ratios) -> dict:
    return {name: StepRatio(ratio, 0.02, 3) for name, ratio in ratios.items()}


TIMED = dict(chain1=1.2, chain2=1.35, tree2=1.3, tree4=1.7, tree8=2.4)   # a slow-memory CPU: the head costs


def test_timed_steps_replace_the_curves_model_of_the_step():
    """Where every shape's step was timed here, the shape with the most tokens per timed step wins, whatever the
    curve says (a flat curve's model picks the 8-node tree), and its prediction is E over the timed ratio: an
    inverted ratio, or the model's STEP added again, would fail; a shape left untimed leaves the model in charge."""
    flat = _curve(0.0)
    choice = choose_prophet_shape(flat, steps=_steps(**TIMED))
    assert choice.shape.name == "tree2" and choice.step.ratio == 1.3
    assert choice.predicted == pytest.approx(2.29 / 1.3) and choice.default_predicted == pytest.approx(3.00 / 2.4)
    assert "timed on this machine" in choice.reason and "1.30× greedy's" in choice.reason
    assert choice.reason.endswith("chain1 1.20×, tree2 1.30×, chain2 1.35×, tree4 1.70×, tree8 2.40×")
    partial = {k: v for k, v in _steps(**TIMED).items() if k != "chain1"}
    assert choose_prophet_shape(flat, steps=partial).shape.name == "tree8"
    assert choose_prophet_shape(flat, steps=partial).step is None
    # a near tie within the timings' spread goes to the narrower shape, as on a curve
    # (the chain of 1 timed slower than TIMED's here: with its copy branch it would sit within that noise too)
    tie = {name: StepRatio(ratio, 0.08, 3) for name, ratio in
           dict(TIMED, chain1=1.5, tree4=2.60 / (2.29 / 1.3) * 0.97).items()}
    assert choose_prophet_shape(flat, steps=tie).shape.name == "tree2"


def test_a_step_timed_on_the_default_example_is_moved_to_the_positions_unseen_prompts_verify():
    """The shapes' steps are timed on the default example, whose copy branch makes every tree verify more positions
    than on prompts the project did not write (the served int8 forward: the 8-node tree 14.7 there, about 11 on them).
    On a curve that jumps between those widths the timed step overstates the wide shapes: the choice moves each
    step's verify forward along the curve to the shape's unseen positions. Steps as one Zen 5 start timed them (the
    shapes' positions counted on the served config): unmoved, the 4-node tree is within the noise of the 8-node one
    and wins as the narrower; moved, the 8-node tree wins clearly. Ignoring the positions, or moving the step the
    wrong way, would fail."""
    cost = ForwardCost({1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 12: 10.5, 16: 14.0, 33: 20.0})
    timed = dict(chain1=(1.56, 7.57), tree2=(1.77, 8.43), chain2=(1.74, 8.57), tree4=(1.89, 10.67), tree8=(1.99, 14.67))
    plain = {name: StepRatio(ratio, 0.05, 3) for name, (ratio, _) in timed.items()}
    assert choose_prophet_shape(cost, steps=plain).shape.name == "tree4"
    counted = {name: StepRatio(ratio, 0.05, 3, positions=at) for name, (ratio, at) in timed.items()}
    choice = choose_prophet_shape(cost, steps=counted)
    tree8 = _shape("tree8")
    moved = (1.99 * 10.0 + cost(tree8.unseen_positions) - cost(14.67)) / 10.0
    assert choice.shape.name == "tree8" and choice.moved == pytest.approx(moved) and moved < 1.99
    assert choice.predicted == pytest.approx(tree8.unseen_tokens / moved)
    assert "1.99× greedy's here over 14.7 positions on the default example" in choice.reason
    assert f"{moved:.2f}× over the 11.1 it verifies" in choice.reason
    # a step is never moved below the verify forward at the unseen positions alone
    tiny = {**counted, "tree8": StepRatio(0.5, 0.05, 3, positions=14.67)}
    floor = choose_prophet_shape(cost, steps=tiny)
    assert floor.shape.name == "tree8" and floor.moved == pytest.approx(cost(tree8.unseen_positions) / 10.0)


def test_a_timed_step_decides_the_prophets_verdict_and_says_so():
    """The prophet's verdict on the default example divides its tokens there by its timed step: a step timed at
    more than those tokens is left out even on a flat curve, where the model would tick it."""
    flat, tree2 = _curve(0.0), _shape("tree2")
    slow = verdict("prophet", flat, tree2.parsed(), StepRatio(4.8, 0.02, 3))
    assert slow.speedup == pytest.approx(4.385 / 4.8) and not slow.pays and slow.timed
    assert "timed 4.80× greedy's here" in slow.reason and "timings' spread" in slow.reason
    fast = verdict("prophet", flat, tree2.parsed(), StepRatio(1.2, 0.02, 3))
    assert fast.pays and fast.margin == pytest.approx(fast.speedup * 0.02)
    assert verdict("prophet", flat, tree2.parsed()).pays            # the model, untimed
    # the start: every step timed 3.5x slower than TIMED; the 2-node tree is still the best shape (2.29 / 4.55
    # on unseen prompts), and its 4.385 tokens on the default example do not pay for a step of 4.55
    chosen = chosen_strategies(Settings(), curve=flat, steps=_steps(**{k: 3.5 * v for k, v in TIMED.items()}))
    assert dict(chosen.prophet_shape) == {"tree_nodes": 2}
    assert "prophet" not in chosen.strategies and "timed 4.55× greedy's" in chosen.strategies_note


def test_the_shapes_are_timed_in_the_served_mode_and_only_by_the_start(monkeypatch):
    """The start times the shapes in the served mode (``timed_steps``, given its settings) and hands them to the
    choice; the choice itself, on a measured curve or an injected one, never times anything."""
    from web import startup
    timed = []

    def steps(settings, curve, hold=None):
        timed.append(settings.compiled)
        return _steps(**TIMED)
    monkeypatch.setattr(startup, "timed_steps", steps)
    monkeypatch.setattr(startup, "machine_curve", lambda lm, fast=False: _curve(0.0))
    monkeypatch.setattr(Settings, "load", lambda self, name: None)
    served = Settings(compiled=True)
    chosen = chosen_strategies(served, steps=startup.timed_steps(served, _curve(0.0)))
    assert timed == [True] and dict(chosen.prophet_shape) == {"tree_nodes": 2}
    chosen_strategies(Settings(compiled=True))                  # the curve measured: still nothing timed
    chosen_strategies(Settings(), curve=_curve(0.0))
    assert timed == [True]


def test_step_ratios_divide_each_run_by_greedy_in_its_round(monkeypatch):
    """Each round times greedy and every run in turn; a run's ratio is the median over rounds of its median step
    over greedy's in that round (a machine that slows between rounds slows both), its spread the rounds' standard
    error relative to it. The same rounds race it: its speed-up is greedy's wall time a token over its own (the
    median of the rounds'; an inverted ratio, or wall times not divided by tokens, would fail), and its tokens a
    forward are counted."""
    from decoding.harness import steps as steps_mod
    T = steps_mod.Timed
    rounds = {"": iter([T([10, 10, 11], 300, 24, 24), T([20, 20], 600, 24, 24), T([10], 330, 24, 24)]),
              "a": iter([T([20, 21, 20], 200, 24, 10), T([44, 44], 500, 24, 12), T([25], 150, 20, 8)])}
    warm = []

    def timed_run(name, params, ids, pair):
        key = "" if name == "greedy" else "a"

        def run(tokens):
            if tokens <= 8:
                warm.append(key)
                return T([], 1.0, 1, 1)
            return next(rounds[key])
        return run
    monkeypatch.setattr(steps_mod, "_timed_run", timed_run)
    monkeypatch.setattr(steps_mod, "_prompt_ids", lambda lm: [1, 2, 3])
    got = steps_mod.step_ratios(None, {"a": ("prophet", SimpleNamespace(fast=True))}, None, tokens=24, repeats=3)
    assert sorted(warm) == ["", "a"]
    assert got["a"].ratio == pytest.approx(2.2) and got["a"].rounds == 3          # ratios 2.0, 2.2, 2.5
    assert got["a"].spread == pytest.approx(statistics.stdev([2.0, 2.2, 2.5]) / 3 ** 0.5 / 2.2)
    # races: 300/200 = 1.5, 600/500 = 1.2, (330/24) / (150/20) = 1.833...; tokens a forward 2.4, 2.0, 2.5
    speedups = [1.5, 1.2, (330 / 24) / (150 / 20)]
    assert got["a"].speedup == pytest.approx(1.5) and got["a"].tokens == pytest.approx(2.4)
    assert got["a"].positions is None                       # the runs did not count their positions
    own = statistics.stdev(speedups) / 3 ** 0.5 / 1.5
    assert own <= got["a"].speedup_spread <= own * 1.01     # alone, its own rounds are the pooled ones


def test_the_races_noise_is_pooled_over_every_strategy_raced_in_the_same_rounds(monkeypatch):
    """Three rounds that happen to agree do not make a race sure: a strategy whose rounds agreed takes the noise the
    other strategies' rounds show beside it (pooled deviations from each one's median), one whose own rounds scatter
    more keeps its own. Judging each on its own error alone would fail."""
    from decoding.harness import steps as steps_mod
    T = steps_mod.Timed
    walls = {"": iter([100.0] * 3), "a": iter([100.0] * 3), "b": iter([100.0, 100 / 1.2, 100 / 0.8])}

    def timed_run(name, params, ids, pair):
        key = "" if name == "greedy" else params

        def run(tokens):
            return T([10.0], 1.0, 1, 1) if tokens <= 8 else T([10.0], next(walls[key]), 10, 10)
        return run
    monkeypatch.setattr(steps_mod, "_timed_run", timed_run)
    monkeypatch.setattr(steps_mod, "_prompt_ids", lambda lm: [1])
    got = steps_mod.step_ratios(None, {"a": ("x", "a"), "b": ("x", "b")}, None, tokens=24, repeats=3)
    assert got["a"].speedup == pytest.approx(1.0) and got["b"].speedup == pytest.approx(1.0)
    pooled = (0.08 / 4) ** 0.5 / 3 ** 0.5                  # b's deviations 0, 0.2, -0.2; 2 + 2 degrees of freedom
    assert got["a"].speedup_spread == pytest.approx(pooled)
    assert got["b"].speedup_spread == pytest.approx(statistics.stdev([1.0, 1.2, 0.8]) / 3 ** 0.5)
    assert got["a"].spread == got["b"].spread == pytest.approx(0.02)     # the steps' noise is each one's own


def test_step_ratios_time_a_real_prophet_step_against_greedy():
    """On a tiny model with a random head: every shape gets a ratio from every round, and a shape that verifies
    more positions and drafts more is not timed cheaper than a chain of one by a wide margin."""
    from decoding.harness.steps import step_ratios
    from decoding.runtime.pair import ModelPair
    from test_prophet import random_prophet
    from tiny_models import tiny_causal
    lm = tiny_causal("llama", seed=0)
    pair = ModelPair(lm, prophet=random_prophet(lm))
    runs = {s.name: ("prophet", s.parsed()) for s in PROPHET_SHAPES if s.name in ("chain1", "tree8")}
    got = step_ratios(lm, runs, pair, tokens=12, repeats=2)
    assert set(got) == {"chain1", "tree8"} and all(r.rounds == 2 and r.ratio > 0 for r in got.values())


def test_the_start_chooses_the_shape_and_the_page_and_its_examples_start_on_it():
    steep = chosen_strategies(Settings(), curve=_curve(0.1))
    assert steep.prophet_shape == (("tree_nodes", 2),) and "a tree of 2 nodes" in steep.prophet_note
    assert ui_default("prophet", "tree_nodes", steep) == 2 and ui_default("prophet", "tree_nodes") == 0
    assert ui_default("prophet", "draft_tokens", steep) == 6                  # fields the shape leaves alone
    request = default_request("Hi", steep)           # what the page sends untouched, what examples record
    prophet = dict(request.plan)["prophet"]
    assert prophet.tree_nodes == 2 and shape_of(prophet).name == "tree2"
    flat = chosen_strategies(Settings(), curve=_curve(0.0))
    assert flat.prophet_shape == () and shape_of(dict(default_request("Hi", flat).plan)["prophet"]).name == "tree8"
    # the verdict on the steep curve was made on the shape the page runs, not on the default tree
    assert "prophet" in steep.strategies or "13-position" not in steep.strategies_note
    chains = chosen_strategies(Settings(), curve=_curve(0.9))
    assert dict(chains.prophet_shape) == {"tree": False, "draft_tokens": 1}
    assert ui_default("prophet", "tree", chains) is False and ui_default("prophet", "draft_tokens", chains) == 1


def test_a_page_opened_after_the_choice_shows_the_shape_and_says_why():
    built = Settings()
    steep = chosen_strategies(built, curve=_curve(0.1))
    views = start_views(steep, built)
    assert {f: views[(f, "prophet")] for f in SHAPE_FIELDS} == {"draft_tokens": 6, "tree": True, "tree_nodes": 2}
    note = views["strategies_note"]
    assert note["visible"] and "a tree of 2 nodes" in note["value"]
    # a later choice back to the default tree (a curve timed again) puts every field back
    back = start_views(dataclasses.replace(steep, prophet_shape=(), prophet_note="x"), steep)
    assert {f: back[(f, "prophet")] for f in SHAPE_FIELDS} == {"draft_tokens": 6, "tree": True, "tree_nodes": 0}
    assert start_views(steep, steep) == {}
    # the note is text: markup in it is escaped
    hostile = dataclasses.replace(steep, prophet_note="<img src=x onerror=alert(1)>")
    assert "<img" not in strategies_note(hostile) and "&lt;img" in strategies_note(hostile)
    assert strategies_note(dataclasses.replace(steep, prophet_shape=())) == strategies_note(
        dataclasses.replace(steep, prophet_shape=(), prophet_note=""))      # the default tree needs no line


def test_the_page_built_after_the_choice_starts_its_prophet_fields_there():
    import app
    from web.page_names import param_input
    demo = app.build_demo(chosen_strategies(Settings(), curve=_curve(0.1)))
    assert demo.inputs[param_input("prophet", "tree_nodes")].value == 2
    plain = app.build_demo(Settings())
    assert plain.inputs[param_input("prophet", "tree_nodes")].value == 0


def test_race_takes_the_machines_shape_unless_the_caller_shapes_the_step():
    """/race fills what the caller leaves out with the page's defaults, the start's shape included; a caller who
    sets any parameter of the step's shape gets the library's shape with it, not a mix (tree_nodes=8 on a machine
    whose start chose a chain would otherwise draft a chain)."""
    from decoding.harness.pays import SHAPE_PARAMS
    from web.requests import param_values
    chains = chosen_strategies(Settings(), curve=_curve(0.9))
    machine = param_values(["greedy", "prophet"], {}, chains)
    assert (machine[("prophet", "tree")], machine[("prophet", "draft_tokens")]) == (False, 1)
    own = param_values(["greedy", "prophet"], {"prophet": {"tree_nodes": 8}}, chains)
    assert (own[("prophet", "tree")], own[("prophet", "tree_nodes")], own[("prophet", "draft_tokens")]) == (True, 8, 6)
    other = param_values(["greedy", "prophet"], {"prophet": {"confidence_threshold": 0.2}}, chains)
    assert (other[("prophet", "tree")], other[("prophet", "confidence_threshold")]) == (False, 0.2)
    assert set(SHAPE_FIELDS) <= set(SHAPE_PARAMS)
    # and /race's own description (the API page) says so, naming every parameter that shapes the step
    from web.api import race_endpoint
    doc = " ".join(race_endpoint(None).__doc__.split())
    said = doc[doc.index("The prophet's step shape"):][:200]
    assert "start chose" in said and all(name in said for name in SHAPE_PARAMS), said


def test_a_page_built_before_the_choice_shows_the_shape_on_load():
    """The page is built while the start still times (library defaults); the start then chooses a 2-node tree: the
    page's load event sends the prophet's fields the new values, each to its own field (not by position)."""
    import app
    from web.page_names import param_input
    demo = app.build_demo(Settings())
    demo.playground.settings = chosen_strategies(Settings(), curve=_curve(0.1))
    (load,) = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "_load"]
    sent = dict(zip((o._id for o in load.outputs), load.fn()))
    got = {f: sent[demo.inputs[param_input("prophet", f)]._id] for f in SHAPE_FIELDS}
    assert got == {"draft_tokens": 6, "tree": True, "tree_nodes": 2}


def test_a_timed_run_counts_the_positions_its_decode_forwards_verified(monkeypatch):
    """What moves a shape's step along the curve: the mean positions of its target forwards, the prefill left out
    (a 90-token prompt's prefill would count as a 90-position verify), its draft calls too; the rounds' median."""
    from decoding.events import ForwardPass
    from decoding.harness import steps as steps_mod
    events = [ForwardPass(0, "target", 90, 5.0, "prefill"), ForwardPass(1, "draft", 3, 0.5, "draft"),
              ForwardPass(1, "target", 12, 8.0, "verify"), ForwardPass(2, "target", 8, 7.0, "verify")]
    assert steps_mod._decode_positions(events) == pytest.approx(10.0)
    assert steps_mod._decode_positions(events[:2]) == 0.0
    T = steps_mod.Timed
    widths = {"": iter([1.0] * 4), "a": iter([10.0, 14.0, 11.0, 99.0])}

    def timed_run(name, params, ids, pair):
        key = "" if name == "greedy" else "a"
        return lambda tokens: T([10.0], 100.0, 10, 10, next(widths[key]) if tokens > 8 else 0.0)
    monkeypatch.setattr(steps_mod, "_timed_run", timed_run)
    monkeypatch.setattr(steps_mod, "_prompt_ids", lambda lm: [1])
    got = steps_mod.step_ratios(None, {"a": ("prophet", SimpleNamespace(fast=True))}, None, tokens=24, repeats=3)
    assert got["a"].positions == pytest.approx(11.0)        # the warm-up's 0 and the unused 99 are not counted
