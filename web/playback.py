"""Playback: the event functions that move through a finished run held in the app's trace store (the step slider,
Play, the race's clock and its ticker, the inspector). Each takes the app and the browser's values, clamps every
number it is sent, and returns views by name; a key the store no longer holds shows ``EXPIRED``."""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import gradio as gr

from visualize.page import inspector_view, race_views, step_figures, step_html
from visualize.race import SPEEDS, clamp_ms, race_length_ms
from visualize.tokens import columns_html, number
from web.playground import PlaygroundApp

MAX_CLOCK_MS = 1e12      # a replay clock beyond any run (the anchor stays a finite number)
EXPIRED = ("<div class='dp-muted'>This trace is no longer held by the server (it keeps the most recent "
           "ones); run again or import the trace file.</div>")


def _held(app: PlaygroundApp, key: Any) -> tuple[Optional[dict], int]:
    """(document, top replay step) of this session's trace; (None, 0) when there is none or it expired."""
    return app.store.get(key) or (None, 0)


def _step(step: Any, top: int) -> int:
    """A replay step from the browser, clamped to [0, top]; 0 when it is not a number."""
    value = number(step, None)
    if value is None or value != value:
        return 0
    return int(min(max(value, 0.0), float(top)))


def replay(app: PlaygroundApp, key: Any, step: Any) -> dict:
    """The HTML views at one replay step (bounded: see visualize.tokens.MAX_FRAME_ITEMS)."""
    doc, top = _held(app, key)
    if doc is None:
        values = step_html(None, None)
        values["columns"] = EXPIRED if key else columns_html([])
        return values
    return step_html(doc, _step(step, top))


def replay_figures(app: PlaygroundApp, key: Any, step: Any, strategy: Any) -> dict:
    """The figures at one replay step: draft tree, lookahead mask, beams, sampling."""
    doc, top = _held(app, key)
    return step_figures(doc, _step(step, top) if doc else None, strategy)


def advance(app: PlaygroundApp, key: Any, step: Any) -> tuple:
    """One tick of the play button: the next replay step, stopping the timer at the end."""
    _, top = _held(app, key)
    nxt = _step(step, top) + 1
    if nxt >= top:
        return top, gr.Timer(active=False)
    return nxt, gr.Timer(active=True)


def play(app: PlaygroundApp, key: Any, step: Any) -> tuple:
    """Start playing from the current step (from 0 when at the end)."""
    _, top = _held(app, key)
    start = _step(step, top)
    return (0 if start >= top else start), gr.Timer(active=top > 0)


def _speed(value: Any) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value in SPEEDS else 1.0


def race_at(app: PlaygroundApp, key: Any, at_ms: Any, speed: Any) -> dict:
    """The wall-clock replay at ``at_ms``: every column at that time of its own run."""
    doc, _ = _held(app, key)
    if doc is None:
        return {"columns": EXPIRED if key else columns_html([]), "clock_readout": ""}
    total = race_length_ms(doc["results"])
    views = race_views(doc, clamp_ms(at_ms, total), _speed(speed))
    return {"columns": views["columns"], "clock_readout": views["clock"]}


def race_play(app: PlaygroundApp, key: Any, at_ms: Any, speed: Any) -> dict:
    """Start the wall-clock replay (from 0 when at the end): its anchor and the timer."""
    doc, _ = _held(app, key)
    total = race_length_ms(doc["results"]) if doc else 0.0
    start = clamp_ms(at_ms, total)
    start = 0.0 if start >= total else start
    return {"race_anchor": {"wall": time.monotonic(), "from": start}, "race_ticker": gr.Timer(active=total > 0),
            **race_at(app, key, start, speed), "clock": start}


def race_tick(app: PlaygroundApp, key: Any, anchor: Any, speed: Any) -> dict:
    """One frame of the wall-clock replay: real elapsed time times the speed factor since the anchor
    (``playing`` stays "race" at the end: the race keeps the columns until the visitor moves the step
    slider or plays the steps)."""
    doc, _ = _held(app, key)
    stopped = {"race_ticker": gr.Timer(active=False), "playing": None}
    if doc is None or not isinstance(anchor, dict):
        return stopped
    total = race_length_ms(doc["results"])
    wall, start = number(anchor.get("wall"), None), number(anchor.get("from"), None)
    if wall is None or start is None or not math.isfinite(wall) or not math.isfinite(start):
        return stopped
    now = clamp_ms(start + (time.monotonic() - wall) * 1e3 * _speed(speed), total)
    return {**race_at(app, key, now, speed), "clock": round(now), "race_ticker": gr.Timer(active=now < total),
            "playing": "race"}


def autoplay(app: PlaygroundApp, key: Any, speed: Any) -> dict:
    """After a run: a replayed recording plays its race in real time from the start; anything else stays."""
    if not app.store.is_replay(key):
        return {name: gr.skip() for name in ("race_anchor", "race_ticker", "columns", "clock_readout", "clock",
                                             "ticker", "playing")}
    return {**race_play(app, key, 0, speed), "ticker": gr.Timer(active=False), "playing": "race"}


def race_rebase(anchor: Any, at_ms: Any) -> Any:
    """A new speed while playing: go on from where the clock is."""
    if not isinstance(anchor, dict):
        return gr.skip()
    return {"wall": time.monotonic(), "from": clamp_ms(at_ms, MAX_CLOCK_MS)}


def inspect_position(app: PlaygroundApp, key: Any, strategy: Any, position: Any) -> Any:
    doc, _ = _held(app, key)
    return inspector_view(doc, strategy, position)
