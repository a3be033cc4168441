"""The page's default comparison on this machine (web/service.chosen_strategies over decoding/harness/pays.py):
the default strategies expected to pay on the default target's measured curve, and a line for each left out."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from decoding.runtime.forward_cost import ForwardCost
from web import service
from web.service import DEFAULT_STRATEGIES, Settings, chosen_strategies, default_request


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
    gpu = SimpleNamespace(device=torch.device("cuda"), is_encoder_decoder=False, extras={})
    monkeypatch.setattr(Settings, "load", lambda self, name: asked.append(name) or gpu)
    chosen = chosen_strategies(Settings(target="some-target", strategies=("greedy",), strategies_note="old"))
    assert asked == ["some-target"]
    assert chosen.strategies == DEFAULT_STRATEGIES and chosen.strategies_note == ""
