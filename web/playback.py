"""Playback: the event functions that move through a finished run held in the app's trace store (the step slider,
Play, the race's clock and its ticker, the inspector). Each takes the app and the browser's values, clamps every
number it is sent, and returns views by name; a key the store no longer holds shows ``EXPIRED``."""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from typing import Any, Optional

import gradio as gr

from visualize.page import drafted, inspector_view, race_views, step_figures, step_html, survey
from visualize.race import SPEEDS, clamp_ms, clock_html, race_frame, race_length_ms
from visualize.tokens import columns_html, number
from web import compute
from web.memory import held_bytes
from web.app_object import PlaygroundApp
from web.recordings import Recording

RACE_TICK_S = 0.1        # the wall-clock replay's frame interval (its cadence: one frame a tick)
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


def race_at(app: PlaygroundApp, key: Any, at_ms: Any, speed: Any, cadence: bool = False) -> dict:
    """The wall-clock replay at ``at_ms``: every column at that time of its own run. With ``cadence`` (the
    replay's ticks), at the last tick's time on the animation's cadence (:func:`on_cadence`), and a recording's
    frame is drawn once for every visitor who replays it (``TraceStore.frame``)."""
    doc, _ = _held(app, key)
    if doc is None:
        return {"columns": EXPIRED if key else columns_html([]), "clock_readout": ""}
    results, factor = doc["results"], _speed(speed)
    total = race_length_ms(results)
    at = clamp_ms(at_ms, total)
    if not cadence:
        views = race_views(doc, at, factor)
        return {"columns": views["columns"], "clock_readout": views["clock"]}
    at = on_cadence(at, total, factor)
    columns = app.store.frame(key, at, lambda: race_frame(results, at))
    return {"columns": columns, "clock_readout": clock_html(at, total, factor, results)}


def on_cadence(at_ms: float, total_ms: float, speed: float) -> float:
    """``at_ms`` down to the animation's cadence: a multiple of the race time one tick shows (``RACE_TICK_S`` x
    ``speed``), the end exact. Every visitor's tick between two such times shows the same frame, so a crowd's
    ticks share frames instead of each drawing its own; the eye sees one frame a tick either way."""
    if at_ms >= total_ms:
        return total_ms
    step = RACE_TICK_S * 1e3 * speed
    return math.floor(at_ms / step) * step


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
    return {**race_at(app, key, now, speed, cadence=True), "clock": round(now),
            "race_ticker": gr.Timer(active=now < total), "playing": "race"}


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


# --------------------------------------------------------------------------- a recorded run, replayed to a crowd
@dataclasses.dataclass(frozen=True)
class Replay:
    """What every replay of one recording sends, built once per recording however many visitors press Run on it:
    its views, the run's controls' ranges (the top step, the race's length, the inspector's strategies) and the
    document's bytes in memory (what the trace store counts for each visitor's key)."""
    views: dict
    top: int
    total: float
    choices: tuple
    doc_bytes: int
    shared: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(12))   # its frames' id


def run_controls(key: str, top: int, total: float, choices: Any, trace_path: Optional[str], message: str) -> dict:
    """The run's controls for a finished run held under ``key``: both replay sliders at their end, the download,
    the status and the inspector's strategies (every finished run, imported trace and replay sends these)."""
    choices = list(choices)
    return {"key": key, "step": gr.update(minimum=0, maximum=max(top, 1), value=top),
            "clock": gr.update(minimum=0, maximum=max(round(total), 1), value=round(total)),
            "download": trace_path, "status": message,
            "inspect_strategy": gr.update(choices=choices, value=choices[0] if choices else None)}


def recorded(app: PlaygroundApp, rec: Recording) -> Replay:
    """``rec``'s :class:`Replay`, built at its first replay (its views too when it was read from disk) and kept
    with it; visitors who press Run together wait for that one build, not one each."""
    with rec.lock:
        if rec.replay is None:
            if not rec.views:
                rec.views = compute.draw_views(rec.doc)
            seen = survey(rec.doc)
            rec.replay = Replay(rec.views, seen.top, race_length_ms(rec.doc["results"]),
                                tuple(drafted(rec.doc, seen)), held_bytes(rec.doc))
            app.recordings.remeasure(rec)
        return rec.replay


def recorded_file(app: PlaygroundApp, rec: Recording) -> str:
    """``rec``'s exported trace file: written at its first replay and shared by the next ones, written again only
    once the bounded folder dropped it."""
    with rec.lock:
        if not app.trace_files.holds(rec.trace_path):
            rec.trace_path = app.trace_files.write(rec.text)
        return rec.trace_path


def replay_outputs(app: PlaygroundApp, rec: Recording, message: str) -> dict:
    """Every run view of the recorded run ``rec`` for one visitor: what was built once (:func:`recorded`, the
    file) and a key of their own into the trace store (marked a replay: its race autoplays)."""
    replay = recorded(app, rec)
    key = app.store.put(rec.doc, replay.top, replay=True, size=replay.doc_bytes, shared=replay.shared)
    return {**run_controls(key, replay.top, replay.total, replay.choices, recorded_file(app, rec), message),
            **replay.views}
