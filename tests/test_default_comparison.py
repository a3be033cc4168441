"""The page's default comparison on this machine (web/startup.chosen_strategies over decoding/harness/pays.py):
the default strategies expected to pay on the default target's measured curve, and a line for each left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from decoding.harness.pays import verdict
from decoding.harness.steps import StepRatio
from decoding.runtime.forward_cost import ForwardCost
from web.requests import default_request
from web.settings import DEFAULT_STRATEGIES, Settings
from web.startup import chosen_strategies


def _curve(per_position: float) -> ForwardCost:
    return ForwardCost({t: 10.0 + per_position * (t - 1) for t in (1, 2, 4, 8, 16, 33)})


def test_the_default_comparison_follows_the_curve():
    cheap = chosen_strategies(Settings(), curve=_curve(0.0))
    assert cheap.strategies == DEFAULT_STRATEGIES and cheap.strategies_note == ""
    dear = chosen_strategies(Settings(), curve=_curve(10.0))
    assert dear.strategies == ("greedy",)
    lines = dear.strategies_note.splitlines()
    assert [line.split(":")[0].split(" (")[0] for line in lines] == ["prophet", "prompt_lookup", "lookahead"]
    assert all("does not pay" in line and "× one position here" in line for line in lines)
    # what the page sends untouched, and what examples are recorded as, is the machine's comparison
    assert [name for name, _ in default_request("Hi", dear).plan] == ["greedy"]
    assert [name for name, _ in default_request("Hi", cheap).plan] == list(DEFAULT_STRATEGIES)
    assert [name for name, _ in default_request("Hi").plan] == list(DEFAULT_STRATEGIES)   # no choice made


def test_without_a_curve_every_default_strategy_stays(monkeypatch):
    """Off the CPU (no curve is timed) the comparison is the fixed default; the default target is what is timed."""
    asked = []
    gpu = SimpleNamespace(device=torch.device("cuda"), is_encoder_decoder=False, state=None)
    monkeypatch.setattr(Settings, "load", lambda self, name: asked.append(name) or gpu)
    chosen = chosen_strategies(Settings(target="some-target", strategies=("greedy",), strategies_note="old"))
    assert asked == ["some-target"]
    assert chosen.strategies == DEFAULT_STRATEGIES and chosen.strategies_note == ""


def test_the_page_ticks_the_machines_comparison_and_says_why_for_the_rest():
    """The strategy picker starts on ``settings.strategies``; every strategy stays in it (one click away), and the
    line under it says why each default one left out does not pay here. A note with markup is shown as text."""
    import app
    dear = chosen_strategies(Settings(), curve=_curve(10.0))
    demo = app.build_demo(dear)
    picker = demo.inputs["strategies"]
    assert picker.value == ["greedy"]
    assert {"prophet", "prompt_lookup", "lookahead"} <= {value for _, value in picker.choices}
    notes = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "strategies-note"]
    assert len(notes) == 1 and "lookahead" in notes[0].value and "does not pay" in notes[0].value
    plain = app.build_demo(chosen_strategies(Settings(), curve=_curve(0.0)))
    assert plain.inputs["strategies"].value == list(DEFAULT_STRATEGIES)
    # nothing left out: the note says how sure each ticked verdict is, and lists nothing as left out
    (note,) = [b for b in plain.blocks.values() if getattr(b, "elem_id", None) == "strategies-note"]
    assert "Ticked by default here" in note.value and "Not ticked" not in note.value
    assert all(f"- {name}" in note.value for name in DEFAULT_STRATEGIES[1:])
    # and that they are the default example's: a visitor's own prompt may not pay for a drafter that copies
    assert "verdicts are for the default example" in note.value and "change with the prompt" in note.value
    # no choice made yet: the note is there (a later start choice fills it) but hidden and empty
    assert all(not b.visible and not b.value for b in app.build_demo(Settings()).blocks.values()
               if getattr(b, "elem_id", None) == "strategies-note")
    hostile = app.build_demo(Settings(strategies=("greedy",), strategies_note="<img src=x onerror=alert(1)>"))
    (note,) = [b for b in hostile.blocks.values() if getattr(b, "elem_id", None) == "strategies-note"]
    assert "<img" not in note.value and "&lt;img" in note.value


def _raced(speedup: float, spread: float = 0.01, tokens: float = 1.2) -> StepRatio:
    return StepRatio(1.05, 0.02, 3, speedup=speedup, speedup_spread=spread, tokens=tokens)


def test_a_raced_verdict_ticks_what_the_race_says_whatever_the_model():
    """Where the start raced a default strategy against greedy on the default example, the race is its verdict:
    on a curve whose model says nothing pays, prompt lookup and lookahead raced at 1.07x and 1.19x are ticked;
    on a flat curve whose model ticks everything, one raced at 0.90x is left out, and one at 1.01x +- 0.03 is
    too close to call. An inverted speed-up, or the model's figure kept beside the race, would fail."""
    dear = chosen_strategies(Settings(), curve=_curve(10.0),
                             steps={"prompt_lookup": _raced(1.07, tokens=1.10), "lookahead": _raced(1.19, tokens=1.33)})
    assert dear.strategies == ("greedy", "prompt_lookup", "lookahead")
    ticked = dear.ticked_note.splitlines()
    assert [line.split(":")[0].split(" (")[0] for line in ticked] == ["prompt_lookup", "lookahead"]
    assert "raced against greedy on the default example here (3 rounds)" in ticked[0]
    assert "1.10 tokens a forward" in ticked[0] and "(1.07× greedy, ±0.01 from the timings' spread)" in ticked[0]
    assert "prophet" in dear.strategies_note and "does not pay" in dear.strategies_note       # modelled: dear
    flat = chosen_strategies(Settings(), curve=_curve(0.0),
                             steps={"prompt_lookup": _raced(0.90), "lookahead": _raced(1.01, spread=0.03)})
    assert flat.strategies == ("greedy", "prophet")
    lines = flat.strategies_note.splitlines()
    assert "prompt_lookup" in lines[0] and "does not pay (0.90× greedy" in lines[0]
    assert "lookahead" in lines[1] and "too close to call" in lines[1]
    # a strategy with no model of its step is judged by its race
    suffix = verdict("suffix", _curve(0.0), step=_raced(1.1))
    assert suffix.pays and suffix.raced == 3 and verdict("suffix", _curve(0.0)).speedup is None


def test_the_prophets_race_at_its_shape_decides_its_verdict_over_its_timed_step():
    """The prophet's verdict is its race at the chosen shape (``steps["prophet"]``), not its shape's step times
    the tokens recorded on another machine; without a race the shape's timed step stands in."""
    shapes = {name: StepRatio(ratio, 0.02, 3) for name, ratio in
              dict(chain1=1.2, chain2=1.35, tree2=1.3, tree4=1.7, tree8=2.4).items()}
    stepped = chosen_strategies(Settings(), curve=_curve(0.0), steps=shapes)
    assert "prophet" in stepped.strategies and "timed 1.30× greedy's" in stepped.ticked_note
    raced = chosen_strategies(Settings(), curve=_curve(0.0), steps={**shapes, "prophet": _raced(0.95)})
    assert "prophet" not in raced.strategies and "0.95× greedy" in raced.strategies_note
    assert dict(raced.prophet_shape) == {"tree_nodes": 2}          # the shape still comes from the steps


def test_the_start_races_the_page_default_comparison_at_its_length_in_the_served_mode(monkeypatch):
    """``timed_steps``: the prophet's shapes first (short runs), then the default race at the page's default length,
    the prophet at the shape those steps choose, every run in the served mode; a target without a head races the
    others only; off the CPU, or without a curve, nothing is timed."""
    from web import startup
    from web.requests import DEFAULT_MAX_NEW
    calls = []

    def step_ratios(lm, runs, pair, *, tokens, repeats, hold):
        calls.append((tokens, {label: (name, params) for label, (name, params) in runs.items()}))
        if "prophet" in runs or "prompt_lookup" in runs:
            return {label: _raced(1.1) for label in runs}
        return {name: StepRatio(ratio, 0.02, 3) for name, ratio in
                dict(chain1=1.2, chain2=1.35, tree2=1.3, tree4=1.7, tree8=2.4).items()}
    cpu = SimpleNamespace(device=torch.device("cpu"), name="smollm2-135m-instruct")
    monkeypatch.setattr(startup, "step_ratios", step_ratios)
    monkeypatch.setattr(startup, "prophet_for", lambda lm: "head")
    monkeypatch.setattr(startup, "has_prophet", lambda name: True)
    monkeypatch.setattr(Settings, "load", lambda self, name: cpu)
    got = startup.timed_steps(Settings(compiled=True), _curve(0.0))
    (shape_tokens, shapes), (race_tokens, race) = calls
    assert shape_tokens == startup.SHAPE_TOKENS and len(shapes) == 5
    assert race_tokens == DEFAULT_MAX_NEW == startup.RACE_TOKENS
    assert list(race) == ["prophet", "prompt_lookup", "lookahead"]
    assert race["prophet"][1].tree_nodes == 2 and all(params.fast for _, params in race.values())
    assert got["prophet"].speedup == 1.1 and got["tree2"].ratio == 1.3
    calls.clear()
    monkeypatch.setattr(startup, "has_prophet", lambda name: False)
    startup.timed_steps(Settings(), _curve(0.0))
    assert [list(runs) for _, runs in calls] == [["prompt_lookup", "lookahead"]]
    assert not any(params.fast for _, params in calls[0][1].values())
    calls.clear()
    assert startup.timed_steps(Settings(), None) is None and calls == []
    monkeypatch.setattr(Settings, "load", lambda self, name: SimpleNamespace(device=torch.device("cuda"), name="x"))
    assert startup.timed_steps(Settings(), _curve(0.0)) is None and calls == []


def test_prompt_lookups_shipped_count_is_the_default_examples_and_pays_only_where_a_wide_forward_is_cheap():
    """The default example is a summary that copies much of its text: prompt lookup drafts 4.44 positions a step for
    3.35 tokens a forward. Where a wide forward costs what a narrow one does the model alone ticks it; where each
    position costs a full one-position forward it does not pay. A count left at the chat question's 1.05 tokens
    would not tick it on the flat curve."""
    flat, dear = _curve(0.0), _curve(10.0)
    v = verdict("prompt_lookup", flat)
    assert v.tokens == pytest.approx(3.353) and v.positions == pytest.approx(5.44)
    assert v.pays and v.speedup > 2.5
    assert not verdict("prompt_lookup", dear).pays
    assert "prompt_lookup" in chosen_strategies(Settings(), curve=flat).strategies
