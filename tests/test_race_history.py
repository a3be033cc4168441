"""The default race across starts of one machine (web/race_history.py, harness/steps.pooled, pays.Verdict.previous).

What would break it: a verdict that rests on this start's rounds alone (the earlier starts read but not pooled), a
pooled error that ignores how far the starts' medians lie apart (three lucky rounds at one start made sure), the last
start's tick ignored where the pooled race is too close to call (a strategy flips in and out of the page between
starts), or the reverse (a clear verdict overridden by the last start's), rounds pooled across machines, kernels'
instruction sets or the prophet's shapes, the history growing without bound, and a busy start's rounds kept; and
the prophet's shape chosen on one start's timing of the shapes' steps (not pooled, or not kept for the next start).
"""

from __future__ import annotations

import json
import statistics

import pytest

from decoding.harness.pays import Verdict, verdict
from decoding.harness.steps import StepRatio, pooled
from decoding.runtime.forward_cost import ForwardCost
from web import race_history
from web.race_history import KEEP_STARTS, RaceHistory, history_for, race_key
from web.settings import Settings
from web.startup import chosen_strategies

FLAT = ForwardCost({t: 10.0 for t in (1, 2, 4, 8, 16, 33)})


def _race(*speedups: float, step: float = 1.2, tokens: float = 1.4) -> StepRatio:
    """One start's race of a strategy: its rounds' speed-ups (the figures as ``steps.step_ratios`` makes them)."""
    mid = statistics.median(speedups)
    error = statistics.stdev(speedups) / len(speedups) ** 0.5 / mid if len(speedups) > 1 else 0.0
    return StepRatio(step, 0.02, len(speedups), mid, max(0.02, error), tokens,
                     tuple((step, s, tokens) for s in speedups))


def test_pooling_takes_every_round_and_the_starts_scatter():
    """Two starts of one machine: 1.17× and 0.98× lookahead, each sure of itself (±0.02). Pooled, the median is every
    round's and the error is at least the starts' own scatter, so the pooled race is too close to call: neither
    start's luck is taken as sure."""
    first, second = _race(1.16, 1.17, 1.18), _race(0.97, 0.98, 0.99)
    both = pooled(second, [first.per_round])
    assert both.rounds == 6 and both.starts == 2
    assert both.speedup == pytest.approx(statistics.median([1.16, 1.17, 1.18, 0.97, 0.98, 0.99]))
    medians = [1.17, 0.98]
    between = statistics.stdev(medians) / 2 ** 0.5 / both.speedup
    assert both.speedup_spread == pytest.approx(between)          # larger than either start's own error
    assert verdict("lookahead", FLAT, step=second).call == Verdict.SLOWER
    assert verdict("lookahead", FLAT, step=first).call == Verdict.PAYS
    pooled_call = verdict("lookahead", FLAT, step=both)
    assert pooled_call.call == Verdict.CLOSE and pooled_call.starts == 2
    assert "6 rounds over 2 starts" in pooled_call.reason


def test_pooling_agreeing_starts_narrows_the_error_and_keeps_what_is_clear():
    """Starts that agree pool into a surer figure than one start's (its error scaled down to the rounds pooled), and
    nothing earlier leaves a race unchanged."""
    now = _race(0.95, 1.05, 1.15)
    assert pooled(now, []) is now and pooled(now, [[]]) is now
    both = pooled(now, [_race(0.96, 1.05, 1.14).per_round, _race(0.97, 1.05, 1.13).per_round])
    assert both.starts == 3 and both.rounds == 9 and both.speedup == pytest.approx(1.05)
    assert both.speedup_spread < now.speedup_spread
    assert both.ratio == pytest.approx(1.2) and both.tokens == pytest.approx(1.4)


@pytest.mark.parametrize("previous, pays", [(None, False), (True, True), (False, False)])
def test_a_call_too_close_to_make_keeps_the_last_starts(previous, pays):
    close = Verdict("lookahead", 1.02, margin=0.05, previous=previous)
    assert close.call == Verdict.CLOSE and close.pays is pays
    if previous is not None:
        assert f"{'ticked' if pays else 'left out'} as at this machine's last start" in close.reason
    # a clear call is the pooled race's, whatever the last start said
    assert Verdict("lookahead", 0.90, margin=0.05, previous=True).pays is False
    assert Verdict("lookahead", 1.10, margin=0.05, previous=False).pays is True


def test_the_history_keeps_a_machines_starts_per_parameters_and_no_more(tmp_path):
    file = tmp_path / "races.json"
    key = {"environment": "e", "cpu_flags": "f", "config": "m|compiled", "example": ["summarization", 1],
           "tokens": 64}
    history = RaceHistory(file, key)
    tree8 = {"prophet": ""}
    for i in range(KEEP_STARTS + 2):
        history.record({"prophet": _race(1.3 + 0.01 * i, 1.31 + 0.01 * i)}, tree8, ("greedy", "prophet"))
    kept = json.loads(file.read_text())["entries"][0]["strategies"]["prophet"]
    assert len(kept["starts"]) == KEEP_STARTS and kept["ticked"] is True
    assert kept["starts"][-1][0][1] == pytest.approx(1.3 + 0.01 * (KEEP_STARTS + 1))     # the newest kept
    # a new start pools with the last KEEP_STARTS - 1, at the same shape only
    judged, previous = RaceHistory(file, key).pool({"prophet": _race(1.2, 1.21)}, tree8)
    assert judged["prophet"].starts == KEEP_STARTS and previous == {"prophet": True}
    other_shape, previous = RaceHistory(file, key).pool({"prophet": _race(1.2, 1.21)}, {"prophet": '{"tree_nodes": 2}'})
    assert other_shape["prophet"].starts == 1 and previous == {}
    # another machine (its kernels' instruction set, threads, code: the key) sees none of it
    for field, value in (("cpu_flags", "g"), ("environment", "other"), ("config", "m|eager"), ("tokens", 24)):
        judged, previous = RaceHistory(file, {**key, field: value}).pool({"prophet": _race(1.2, 1.21)}, tree8)
        assert judged["prophet"].starts == 1 and previous == {}
    # a strategy the start raced at another shape starts its history anew
    history.record({"prophet": _race(1.0, 1.01)}, {"prophet": '{"tree_nodes": 2}'}, ("greedy",))
    kept = json.loads(file.read_text())["entries"][0]["strategies"]["prophet"]
    assert len(kept["starts"]) == 1 and kept["ticked"] is False
    # one the start did not race (its run failed) keeps what it had
    history.record({"lookahead": _race(1.3, 1.31)}, {}, ("greedy", "lookahead"))
    history.record({"prophet": _race(1.0, 1.02)}, {"prophet": '{"tree_nodes": 2}'}, ("greedy",))
    kept = json.loads(file.read_text())["entries"][0]["strategies"]
    assert len(kept["prophet"]["starts"]) == 2 and len(kept["lookahead"]["starts"]) == 1
    assert kept["lookahead"]["ticked"] is True


def test_the_key_names_the_cpus_kernels_and_the_served_config(monkeypatch):
    monkeypatch.setattr(race_history, "environment_digest", lambda: "env")
    monkeypatch.setattr(race_history, "cpu_fingerprint", lambda: "flags")
    assert race_key("m|compiled", 64) == {"environment": "env", "cpu_flags": "flags", "config": "m|compiled",
                                          "example": ["summarization", 1], "tokens": 64}
    assert history_for(None, "m|compiled", 64) is None


def test_a_strategy_stays_on_the_page_across_starts_whose_races_straddle_the_line(tmp_path):
    """The app's choice over two starts (``chosen_strategies`` with a history): lookahead races 1.17× at the first
    (ticked) and 0.98× at the second. Alone the second would leave it out; pooled, the race is too close to call
    and it stays ticked, and its line says so. Starts that keep falling below the line take it out: after two at
    0.80× the pooled race is clear of it."""
    file = tmp_path / "routes.json"

    def start(*speedups: float) -> Settings:
        history = history_for(file, "m|compiled", 64)
        return chosen_strategies(Settings(), curve=FLAT, steps={"lookahead": _race(*speedups)}, history=history)
    assert "lookahead" in start(1.16, 1.17, 1.18).strategies
    alone = chosen_strategies(Settings(), curve=FLAT, steps={"lookahead": _race(0.97, 0.98, 0.99)})
    assert "lookahead" not in alone.strategies
    second = start(0.97, 0.98, 0.99)
    assert "lookahead" in second.strategies
    assert "over 2 starts" in second.ticked_note and "ticked as at this machine's last start" in second.ticked_note
    assert "lookahead" in start(0.79, 0.80, 0.81).strategies              # 9 rounds: still too close
    fourth = start(0.79, 0.80, 0.81)
    assert "lookahead" not in fourth.strategies and "does not pay" in fourth.strategies_note
    assert "12 rounds over 4 starts" in fourth.strategies_note


@pytest.mark.parametrize("text", ["{", '{"version": 1, "entries": 3}', '{"version": 1, "entries": [3, null]}',
                                  "KEYED", "STARTS"])
def test_a_damaged_history_loses_its_starts_never_the_choice(tmp_path, text):
    """A file cut short or edited by hand: the start still chooses (on its own rounds) and writes a good file."""
    file, key = tmp_path / "races.json", {"k": 1}
    bad_starts = [[[1.0, "x", 1.0]], [[1.0, -2.0, 1.0]], "no", [[1.0, float("nan"), 1.0]], [[True, 1.0, 1.0]]]
    good = [[1.2, 1.5, 1.4], [1.2, 1.5, 1.4]]
    doc = {"KEYED": {"version": 1, "entries": [{"key": key, "strategies": "no"}]},
           "STARTS": {"version": 1, "entries": [{"key": key, "strategies": {"prophet": {
               "params": "", "ticked": True, "starts": [*bad_starts, good]}}}]}}.get(text)
    file.write_text(json.dumps(doc) if doc is not None else text)
    judged, previous = RaceHistory(file, key).pool({"prophet": _race(1.2, 1.3)}, {})
    if text == "STARTS":            # the one good start is pooled, the damaged ones are not
        assert judged["prophet"].starts == 2 and judged["prophet"].rounds == 4 and previous == {"prophet": True}
    else:
        assert judged["prophet"].starts == 1 and previous == {}
    RaceHistory(file, key).record({"prophet": _race(1.2, 1.3)}, {}, ("greedy", "prophet"))
    kept = json.loads(file.read_text())["entries"][-1]["strategies"]["prophet"]["starts"]
    assert len(kept) == (2 if text == "STARTS" else 1)


def _shape_steps(tree8: float) -> dict[str, StepRatio]:
    """One start's timed steps of every prophet shape (3 rounds each, as ``startup.shape_steps`` times them): the
    4-node tree the most tokens per step unless the 8-node tree's step is timed low (``tree8``)."""
    ratios = dict(chain1=1.5, tree2=1.75, chain2=1.75, tree4=1.8, tree8=tree8)
    return {name: StepRatio(r, 0.02, 3, 1.3, 0.02, 2.0, ((r, 1.3, 2.0),) * 3) for name, r in ratios.items()}


def test_the_prophets_shape_rests_on_the_last_starts_timings_not_on_one_starts_luck(tmp_path):
    """Three starts time the 8-node tree's step at 2.4 greedy steps and choose the 4-node tree; a fourth times it at
    1.7 (a lucky sample of a memory rate that moves between starts), which alone would choose the 8-node tree.
    Pooled with the three before it, the fourth keeps the 4-node tree and its line says over how many starts. The
    shapes' timings are kept beside the default race's rounds, neither overwriting the other."""
    file = tmp_path / "routes.json"
    race = {"prophet": _race(1.3, 1.31, 1.32)}

    def start(tree8: float) -> Settings:
        return chosen_strategies(Settings(), curve=FLAT, steps={**_shape_steps(tree8), **race},
                                 history=history_for(file, "m|compiled", 64))
    for _ in range(3):
        assert dict(start(2.4).prophet_shape) == {"tree_nodes": 4}
    alone = chosen_strategies(Settings(), curve=FLAT, steps={**_shape_steps(1.7), **race})
    assert dict(alone.prophet_shape) == {}                                              # the 8-node tree (default)
    fourth = start(1.7)
    assert dict(fourth.prophet_shape) == {"tree_nodes": 4}
    assert "(4 starts pooled)" in fourth.prophet_note
    kept = json.loads((tmp_path / "races.json").read_text())["entries"][0]["strategies"]
    tree8 = kept[race_history.SHAPE + "tree8"]["starts"]
    assert len(tree8) == 4 and tree8[-1][0][0] == 1.7                                   # the newest start last
    assert race_history.SHAPE + "prophet" not in kept and "prophet" in kept           # the race's rounds, apart
