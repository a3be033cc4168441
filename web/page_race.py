"""The race: its columns and both replays (by target forward passes, and by each strategy's own wall clock),
made and wired by name. Replays are unqueued and bounded; the inspector on the Drafts tab follows the step."""

from __future__ import annotations

import gradio as gr

from visualize.race import SPEEDS
from visualize.tokens import columns_html
from web.page_names import STEP_FIGURES, STEP_VIEWS
from web.page_parts import FRAME, NAMED, PAGE, Views, help_line
from web.playback import (RACE_TICK_S, advance, autoplay, inspect_position, play, race_at, race_play, race_rebase,
                          race_tick, replay, replay_figures)
from web.app_object import PlaygroundApp

# what starting the wall-clock replay (a click, or a replayed run's autoplay) redraws
RACE_START = ("race_anchor", "race_ticker", "columns", "clock_readout", "clock", "ticker", "playing")


def build_race(ui: Views) -> None:
    """The race: the status line, the columns and both replays' controls."""
    ui["status"] = gr.Markdown("", elem_id="status")
    help_line("race")
    ui["columns"] = gr.HTML(columns_html([]), elem_id="columns")
    with gr.Row(equal_height=True):
        ui["step"] = gr.Slider(0, 1, value=0, step=1, label="Replay step (target forward passes)", scale=6)
        ui["play"] = gr.Button("▶ Play steps", scale=1, min_width=110)
    with gr.Row(equal_height=True):
        ui["clock"] = gr.Slider(0, 1, value=0, step=1, label="Replay clock (ms of each strategy's own run)",
                                scale=4, elem_id="race-clock")
        ui["race_speed"] = gr.Dropdown([(f"{s:g}×", s) for s in SPEEDS], value=1.0, label="Speed", scale=1,
                                       min_width=90, elem_id="race-speed")
        ui["race"] = gr.Button("▶ Play in real time", scale=1, min_width=150, elem_id="race-play")
    ui["clock_readout"] = gr.HTML("", elem_id="race-readout")


def build_replay_state(ui: Views) -> None:
    """What the replays keep per visitor: the trace's key, the wall-clock anchor, who plays, and their timers."""
    ui["key"] = gr.State(None)              # a key into the app's trace store, never the document itself
    ui["race_anchor"] = gr.State(None)      # where the wall-clock replay started: {"wall", "from"}
    ui["playing"] = gr.State(None)          # which replay plays now: "steps", "race" or None
    ui["ticker"] = gr.Timer(0.4, active=False)
    ui["race_ticker"] = gr.Timer(RACE_TICK_S, active=False)


def wire_steps(ui: Views, state: PlaygroundApp) -> None:
    """The step replay. "playing" names who owns the columns: the wall-clock race keeps them after it ends (a
    step change left over from the step replay, delivered late on a busy server, must not redraw them); the
    visitor moving the step slider, or ▶ Play steps, gives them back to the step replay."""
    step_views, step_figs = ui.list(STEP_VIEWS), ui.list(STEP_FIGURES)

    def _replay(k, s, p=None):
        values = replay(state, k, s)
        if p == "race":
            values.pop("columns")
        return ui.pack(values)
    ui["step"].change(_replay, [ui["key"], ui["step"], ui["playing"]], step_views, api_name="replay", **FRAME,
                      **NAMED)
    ui["step"].input(lambda k, s: ui.pack({**replay(state, k, s), "playing": None}), [ui["key"], ui["step"]],
                     [*step_views, ui["playing"]], **FRAME, **PAGE)
    ui["step"].change(lambda k, s, n: ui.pack(replay_figures(state, k, s, n)),
                      [ui["key"], ui["step"], ui["inspect_strategy"]], step_figs, api_name="replay_figures",
                      trigger_mode="always_last", **FRAME, **NAMED)
    # one replay plays at a time (both redraw the columns): each play button stops the other's timer and
    # names itself in "playing", and a tick of the other replay (one already in flight) stops its timer
    ui["play"].click(lambda k, s: (*play(state, k, s), gr.Timer(active=False), "steps"), [ui["key"], ui["step"]],
                     [ui["step"], ui["ticker"], ui["race_ticker"], ui["playing"]], **FRAME, **PAGE)
    ui["ticker"].tick(lambda k, s, p: advance(state, k, s) if p == "steps" else (gr.skip(), gr.Timer(active=False)),
                      [ui["key"], ui["step"], ui["playing"]], [ui["step"], ui["ticker"]], **FRAME, **PAGE)


def wire_clock(ui: Views, state: PlaygroundApp, run_event) -> None:
    """The wall-clock replay; ``run_event``'s replayed runs (a recording of the identical request) play it at once."""
    ui["clock"].input(lambda k, t, v: ui.pack(race_at(state, k, t, v)), [ui["key"], ui["clock"], ui["race_speed"]],
                      ui.list(("columns", "clock_readout")), api_name="race_at", trigger_mode="always_last",
                      **FRAME, **NAMED)
    ui["race"].click(lambda k, t, v: ui.pack({**race_play(state, k, t, v), "ticker": gr.Timer(active=False),
                                              "playing": "race"}),
                     [ui["key"], ui["clock"], ui["race_speed"]], ui.list(RACE_START), **FRAME, **PAGE)
    ui["race_ticker"].tick(lambda k, a, v, p: ui.pack(race_tick(state, k, a, v) if p == "race"
                                                      else {"race_ticker": gr.Timer(active=False)}),
                           [ui["key"], ui["race_anchor"], ui["race_speed"], ui["playing"]],
                           ui.list(("columns", "clock_readout", "clock", "race_ticker", "playing")), **FRAME, **PAGE)
    run_event.then(lambda k, v: ui.pack(autoplay(state, k, v)), [ui["key"], ui["race_speed"]],
                   ui.list(RACE_START), **FRAME, **PAGE)
    ui["race_speed"].change(race_rebase, [ui["race_anchor"], ui["clock"]], ui["race_anchor"], **FRAME, **PAGE)


def wire_inspector(ui: Views, state: PlaygroundApp) -> None:
    """The Drafts tab's inspector (a strategy and an output position) and its draft tree at the replay step."""
    for trigger in (ui["inspect_strategy"].change, ui["inspect_pos"].change):
        trigger(lambda k, s, p: inspect_position(state, k, s, p),
                [ui["key"], ui["inspect_strategy"], ui["inspect_pos"]], ui["inspector"], **FRAME, **PAGE)
    ui["inspect_strategy"].change(lambda k, s, n: ui.pack({"tree": replay_figures(state, k, s, n)["tree"]}),
                                  [ui["key"], ui["step"], ui["inspect_strategy"]], ui.list(("tree",)), **FRAME,
                                  **PAGE)
