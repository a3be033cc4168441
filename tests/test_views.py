"""The views added for the live race and the organized page (issue 17): wall-clock race replay, beam tree,
sampling filters, lookahead mask, page guide. Pure functions on hand-built results; the sampling filter and
the mask are also checked against the decoding code they draw."""

from __future__ import annotations

import re

import pytest
import torch

from visualize.beams import beam_figure, beam_tree
from visualize.guide import HOW_TO_READ
from visualize.masks import KINDS, kinds, mask_figure, paths_tree, step_layout
from visualize.page import chart_views, race_views, step_figures, step_html
from visualize.race import (
    clamp_ms,
    clock_html,
    finish_order,
    live_columns_html,
    live_status,
    race_frame,
    race_length_ms,
)
from visualize.filters import filter_at, sampling_figure
from visualize.tokens import columns_html, event_times

EVIL = "<img src=x onerror=alert(1)>"


def committed(tokens, times, *, strategy, label=None, per_step=1, wall_s=None, vocab=None):
    """A result whose token ``i`` was committed at ``times[i]`` ms (``per_step`` tokens per target forward)."""
    events, stamps = [], []
    for i, (tok, t) in enumerate(zip(tokens, times)):
        step = i // per_step + 1
        events.append({"type": "ForwardPass", "step": step, "model": "target", "positions": 1, "ms": 1.0,
                       "kind": "decode"})
        stamps.append(t)
        events.append({"type": "TokenCommitted", "step": step, "position": i, "token": tok,
                       "source": "greedy" if per_step == 1 else "accepted", "prob": None})
        stamps.append(t)
    return {"strategy": strategy, "label": label or strategy, "params": {}, "token_ids": list(tokens),
            "pieces": [], "vocab": vocab or {str(t): f"w{t}" for t in tokens}, "events": events,
            "times_ms": stamps, "wall_s": (wall_s if wall_s is not None else times[-1] / 1e3), "error": None,
            "stats": {}}


def _tokens_per_column(frame: str) -> list[list[str]]:
    cols = frame.split("<div class='dp-col")[1:]
    return [re.findall(r"<span class='dp-tok[^']*'[^>]*>([^<]*)</span>", c) for c in cols]


SLOW = committed([1, 2, 3, 4, 5, 6], [100, 200, 300, 400, 500, 600], strategy="greedy", label="Greedy")
FAST = committed([1, 2, 3, 4, 5, 6], [50, 60, 120, 130, 190, 200], strategy="prophet", label="Prophet",
                 per_step=2)


# --------------------------------------------------------------------------- the wall-clock race
@pytest.mark.parametrize("at", [0, 49.9, 50, 60, 119, 120, 250, 399.99, 400, 600, 10_000])
def test_race_frame_shows_exactly_the_tokens_committed_by_t(at):
    frame = race_frame([SLOW, FAST], at)
    shown = _tokens_per_column(frame)
    for col, result in zip(shown, (SLOW, FAST)):
        times = [t for e, t in zip(result["events"], result["times_ms"]) if e["type"] == "TokenCommitted"]
        expected = [f"w{tok}" for tok, t in zip(result["token_ids"], times) if t <= at]
        assert [s.strip() for s in col] == expected, (at, result["strategy"])


def test_fastest_column_finishes_first_and_the_clock_says_so():
    results = [SLOW, FAST]
    assert race_length_ms(results) == pytest.approx(600)
    assert [name for name, _ in finish_order(results)] == ["Prophet", "Greedy"]
    frame = race_frame(results, 250)
    cols = frame.split("<div class='dp-col")[1:]
    assert "finished" not in cols[0] and "dp-finished" in "<div class='dp-col" + cols[1]
    clock = clock_html(250, 600, 2.0, results)
    assert "t = 0.25 s" in clock and "of 0.60 s" in clock and "2×" in clock
    assert "Prophet" in clock and "Greedy" not in clock
    assert "Greedy" in clock_html(600, 600, 1.0, results)
    views = race_views({"results": results}, 10_000, 1.0)        # clamped to the race's end
    assert "data-ms='600'" in views["clock"] and views["columns"].count("class='dp-col dp-finished'") == 2


def test_a_fractional_run_length_ends_on_a_whole_slider_value_and_play_at_the_end_restarts():
    """The clock slider holds whole ms: the race's end must be one of its values (else the slowest column
    never shows finished, and ▶ after a run 'replays' from just short of the end: the race jumps to its end)."""
    from web import playback
    slow = dict(SLOW, wall_s=0.6004)                 # 600.4 ms: round() would put the slider at 600 < end
    fast = dict(FAST, wall_s=0.2)
    results = [slow, fast]
    total = race_length_ms(results)
    assert total == 601 and total == round(total)
    end = race_views({"results": results}, round(total), 1.0)
    assert end["columns"].count("class='dp-col dp-finished'") == 2
    from web.app_object import PlaygroundApp
    state = PlaygroundApp()
    key = state.store.put({"results": results}, 6)
    for clock_at_end in (round(total), total, 10_000):
        started = playback.race_play(state, key, clock_at_end, 4.0)
        assert started["clock"] == 0 and started["race_anchor"]["from"] == 0, clock_at_end
        assert started["columns"].count("class='dp-col dp-finished'") == 0
    mid = playback.race_play(state, key, 300, 4.0)          # from the middle it goes on from there
    assert mid["clock"] == 300 and mid["race_anchor"]["from"] == 300
    # the last frame stops the timer and the race keeps the columns ("playing" stays "race"): a step
    # replay frame delivered late must not redraw them; before the end the timer runs on
    end_frame = playback.race_tick(state, key, {"wall": 0.0, "from": 0.0}, 4.0)
    assert end_frame["playing"] == "race" and end_frame["clock"] == total
    assert end_frame["race_ticker"].active is False
    assert end_frame["columns"].count("class='dp-col dp-finished'") == 2
    import time
    running = playback.race_tick(state, key, {"wall": time.monotonic(), "from": 0.0}, 1.0)
    assert running["playing"] == "race" and running["race_ticker"].active is True and running["clock"] < total


def test_clock_values_from_the_browser_are_clamped():
    assert clamp_ms(-5, 100) == 0 and clamp_ms(1e12, 100) == 100 and clamp_ms(float("nan"), 100) == 0
    assert clamp_ms("12", 100) == 0 and clamp_ms(True, 100) == 0 and clamp_ms(42.5, 100) == 42.5


def test_event_times_fall_back_to_forward_pass_times_without_times_ms():
    old = dict(SLOW, times_ms=None)
    times = event_times(old)
    assert len(times) == len(old["events"]) and times == sorted(times) and times[-1] == pytest.approx(6.0)
    assert event_times(dict(SLOW, times_ms=[0.0])) == times        # a wrong length is not trusted


def test_live_columns_mark_the_running_strategy_and_list_waiting_ones():
    running = dict(committed([7, 8], [10, 20], strategy="lookahead", label="Lookahead"), running=True,
                   elapsed_s=0.5)
    snap = {"done": [SLOW], "running": running, "waiting": [("jacobi", "Jacobi")]}
    html = live_columns_html(snap)
    cols = html.split("<div class='dp-col")[1:]
    assert len(cols) == 3
    assert cols[1].startswith(" dp-running") and "running now" in cols[1] and cols[1].count("<span class='dp-tok") == 2
    assert cols[2].startswith(" dp-waiting") and "<span class='dp-tok" not in cols[2]
    assert "Strategy 2 of 3: Lookahead running, 2/64 tokens" in live_status(snap, 64)
    assert "warming up" in live_status({"done": [], "running": {"label": "X", "warming": True}, "waiting": []}, 8)
    assert "Loading" in live_columns_html({"done": [], "running": None, "waiting": []})


# --------------------------------------------------------------------------- beam tree
def _beam_result():
    # step 1: two beams [1], [2]; step 2: both extend [1] -> [1,3], [1,4]: [2] was pruned;
    # step 3: [1,3,5], [1,4,6]; the output is [1,4,6,7] (finished after step 3)
    steps = [((1,), (2,)), ((1, 3), (1, 4)), ((1, 4, 6), (1, 3, 5))]
    scores = [(-0.1, -0.5), (-0.6, -0.7), (-0.9, -1.2)]
    events = [{"type": "BeamStep", "step": i + 1, "tokens": [list(b) for b in s], "scores": list(sc),
               "finished": 0} for i, (s, sc) in enumerate(zip(steps, scores))]
    return {"strategy": "beam", "label": "Beam search", "token_ids": [1, 4, 6, 7], "events": events,
            "vocab": {str(t): f"w{t}" for t in range(10)}}


def test_beam_tree_has_parents_scores_and_pruned_branches():
    nodes = beam_tree(_beam_result())
    by = {(n.depth, n.token): n for n in nodes}
    assert by[(1, 2)].fate == "pruned"                                   # no beam extends [2]
    assert by[(2, 3)].fate == "alive" and by[(3, 5)].fate == "alive"    # [1,3] extended; [1,3,5] last step
    assert [by[k].fate for k in ((1, 1), (2, 4), (3, 6))] == ["output"] * 3
    assert nodes[by[(2, 3)].parent].token == 1 and nodes[by[(3, 6)].parent].token == 4
    assert by[(3, 5)].score == pytest.approx(-1.2)
    early = beam_tree(_beam_result(), step=1)                             # replay step 1: nothing pruned yet
    assert {n.fate for n in early} == {"output", "alive"} and len(early) == 2
    fig = beam_figure(_beam_result())
    names = [t.name for t in fig.data if t.name]
    assert any("pruned" in n for n in names) and any("finished" in n for n in names)


# --------------------------------------------------------------------------- sampling filters
def test_sampling_filter_renormalizes_and_zeroes_what_top_k_and_top_p_remove():
    from decoding.params import SampleParams
    from decoding.strategies.baselines import sampling_filter
    logits = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0])
    for params, kept in ((SampleParams(temperature=0.7, top_k=3), 3), (SampleParams(temperature=1.5, top_p=0.6), None)):
        e = sampling_filter(logits, 1, params, step=4, position=3)
        assert len(e.tokens) == 8 and e.chosen == 1 and e.position == 3
        raw = dict(zip(e.tokens, e.p_raw))
        warm = dict(zip(e.tokens, e.p_temperature))
        final = dict(zip(e.tokens, e.p_final))
        assert sum(e.p_raw) == pytest.approx(1, abs=1e-5) and sum(e.p_temperature) == pytest.approx(1, abs=1e-5)
        assert sum(e.p_final) == pytest.approx(1, abs=1e-5)                # renormalized
        expect = torch.softmax(logits / params.temperature, -1)
        assert [warm[i] for i in range(8)] == pytest.approx(expect.tolist(), abs=1e-5)
        assert [raw[i] for i in range(8)] == pytest.approx(torch.softmax(logits, -1).tolist(), abs=1e-5)
        survivors = [i for i in range(8) if final[i] > 0]
        assert e.kept == len(survivors) and survivors == list(range(len(survivors)))   # the most probable ones
        if kept is not None:
            assert survivors == [0, 1, 2]
        mass = sum(warm[i] for i in survivors)
        for i in survivors:                                                  # each keeps its share
            assert final[i] == pytest.approx(warm[i] / mass, abs=1e-5)
    assert sampling_filter(logits, 0, SampleParams(top_k=1), 1, 0).p_final[0] == 1.0


def test_sampling_view_picks_the_position_and_escapes_token_text():
    events = [{"type": "SamplingFilter", "step": s, "position": s - 1, "tokens": [5, 9], "p_raw": [0.6, 0.4],
               "p_temperature": [0.7, 0.3], "p_final": [1.0, 0.0], "chosen": 5, "temperature": 0.5, "top_k": 1,
               "top_p": 1.0, "kept": 1} for s in (1, 2, 3)]
    result = {"strategy": "sample", "events": events, "vocab": {"5": EVIL, "9": "ok"}}
    assert filter_at(result, step=2)["position"] == 1 and filter_at(result, position=99)["position"] == 2
    fig = sampling_figure(result, step=2)
    labels = list(fig.data[0].x)
    assert labels[0].startswith("★") and "<img" not in labels[0] and "&lt;img" in labels[0]
    assert [t.name for t in fig.data][2].startswith("after top-k") and list(fig.data[2].y) == [1.0, 0.0]
    assert "Position 1 (step 2)" in fig.layout.title.text


# --------------------------------------------------------------------------- lookahead mask
@pytest.mark.parametrize("paths,levels,width", [
    ([], 2, 3), ([(4, 5, 6)], 1, 4), ([(4, 5), (4, 7), (8, 9, 1)], 3, 5), ([(1, 2, 3), (2,), (1, 2, 9)], 4, 2)])
def test_mask_picture_is_the_forward_passes_attention_mask(paths, levels, width):
    from decoding.strategies.lookahead import step_layout as real_layout
    from decoding.tree import TokenTree
    tree = TokenTree.from_paths(paths)
    tokens, parents = paths_tree(paths)
    assert tuple(tokens) == tuple(tree.tokens) and tuple(parents) == tuple(tree.parents)
    allowed, rel, first = step_layout(1, parents, levels, width)
    want, want_rel, want_first = real_layout(1, tuple(tree.parents), levels, width)
    assert allowed == want.tolist() and rel == want_rel.tolist() and first == want_first
    codes = kinds(allowed, 1, first, width)
    assert all((c == 0) == (not a) for row, arow in zip(codes, allowed) for c, a in zip(row, arow))


def test_mask_figure_draws_the_replay_steps_mask_with_escaped_labels():
    step = {"type": "LookaheadStep", "step": 2, "position": 1, "window": [[1, 2, 3], [4, 5, 6]],
            "pool_size": 3, "candidates": [[7, 8], [7, 9]], "accepted_candidate": 0, "accepted": [7, 8],
            "pool_hits": 2}
    result = {"strategy": "lookahead", "token_ids": [7, 7, 8], "events": [step],
              "vocab": {str(t): (EVIL if t == 8 else f"w{t}") for t in range(10)}}
    fig = mask_figure(result, 2)
    heat = fig.data[0]
    n = 1 + 3 + 2 * 3                    # key, 3 branch nodes (7, 8, 9), 2x3 window
    assert len(heat.z) == n and len(heat.x) == n
    allowed, _, first = step_layout(1, paths_tree([[7, 8], [7, 9]])[1], 2, 3)
    assert [[c != 0 for c in row] for row in heat.z] == allowed
    assert not any("<img" in lab for lab in heat.x) and any("&lt;img" in lab for lab in heat.x)
    assert set(c for row in heat.z for c in row) <= set(KINDS)


# --------------------------------------------------------------------------- the page
def _doc():
    beam = _beam_result()
    beam["vocab"] = {str(t): EVIL for t in range(10)}
    hostile = committed([1, 2, 3], [10, 20, 30], strategy="greedy", label=EVIL, vocab={str(t): EVIL for t in (1, 2, 3)})
    return {"results": [hostile, dict(FAST, vocab={str(t): EVIL for t in range(10)}), beam]}


def test_every_view_of_the_page_escapes_hostile_token_text_and_labels():
    doc = _doc()
    html_views = {**step_html(doc, 1), **step_html(doc, None), **race_views(doc, 15, 1.0)}
    html_views["race"] = race_frame(doc["results"], 25)
    html_views["clock2"] = clock_html(100, 100, None, doc["results"])
    for name, value in html_views.items():
        assert "<img" not in value, name
    figs = {**chart_views(doc), **step_figures(doc, 2), **step_figures(doc, None)}
    for name, fig in figs.items():
        assert "<img" not in fig.to_json(), name


def test_every_chart_has_one_plain_line_on_how_to_read_it():
    import app
    views = {"speed", "sources", "timeline", "breakdown", "leviathan", "histogram", "inspector", "tree", "drafts",
             "jacobi", "lookahead_window", "lookahead_mask", "lookahead_chart", "beam", "sampling", "sweep", "race"}
    assert views <= set(HOW_TO_READ)
    for name, line in HOW_TO_READ.items():
        assert line.strip() and "\n" not in line and "<" not in line, name
    import gradio as gr
    demo = app.build_demo()
    shown = {getattr(b, "value", None) for b in demo.blocks.values() if isinstance(b, gr.Markdown)}
    for name in views:
        assert HOW_TO_READ[name] in shown, name        # shown under its chart on the page
    assert columns_html([]).count("dp-col") == 0
