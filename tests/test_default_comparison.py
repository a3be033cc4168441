"""The page's default comparison on this machine (web/startup.chosen_strategies over decoding/harness/pays.py):
the default strategies expected to pay on the default target's measured curve, and a line for each left out."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from decoding.runtime.forward_cost import ForwardCost
from web.requests import default_request
from web.settings import DEFAULT_STRATEGIES, Settings
from web.startup import chosen_strategies


def _curve(per_position: float) -> ForwardCost:
    return ForwardCost({t: 10.0 + per_position * (t - 1) for t in (1, 2, 4, 8, 16, 33)})


def test_the_default_comparison_follows_the_curve():
    cheap = chosen_strategies(Settings(), curve=_curve(0.0))
    assert cheap.strategies == DEFAULT_STRATEGIES and cheap.strategies_note == ""
    dear = chosen_strategies(Settings(), curve=_curve(5.0))
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
    dear = chosen_strategies(Settings(), curve=_curve(5.0))
    demo = app.build_demo(dear)
    picker = demo.inputs["strategies"]
    assert picker.value == ["greedy"]
    assert {"prophet", "prompt_lookup", "lookahead"} <= {value for _, value in picker.choices}
    notes = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "strategies-note"]
    assert len(notes) == 1 and "lookahead" in notes[0].value and "does not pay" in notes[0].value
    plain = app.build_demo(chosen_strategies(Settings(), curve=_curve(0.0)))
    assert plain.inputs["strategies"].value == list(DEFAULT_STRATEGIES)
    # nothing left out: the note is there (a later start choice may fill it) but hidden and empty
    assert all(not b.visible and not b.value for b in plain.blocks.values()
               if getattr(b, "elem_id", None) == "strategies-note")
    hostile = app.build_demo(Settings(strategies=("greedy",), strategies_note="<img src=x onerror=alert(1)>"))
    (note,) = [b for b in hostile.blocks.values() if getattr(b, "elem_id", None) == "strategies-note"]
    assert "<img" not in note.value and "&lt;img" in note.value
