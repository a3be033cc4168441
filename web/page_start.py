"""The start's choices on the page (web/startup.py makes them after the page was built): a page opened after them
shows them on load (``start_views``); one opened before has its notes updated by a timer until the start is done."""

from __future__ import annotations

import html

import gradio as gr

from decoding.harness.pays import SHAPE_FIELDS
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from web.page_names import param_input
from web.page_parts import LIGHT, Inputs
from web.app_object import PlaygroundApp
from web.requests import ui_default
from web.settings import Settings
from web.validation import param_fields


def strategies_note(settings: Settings) -> str:
    """The prophet's step where the start changed it from the library's default, the default strategies ticked here
    and how sure, and those left out and why (escaped); empty (and the note hidden) when there is none of them."""
    parts = []
    if settings.prophet_shape and settings.prophet_note:
        parts.append(html.escape(settings.prophet_note) + " (its fields below start there; any shape stays one "
                                                            "change away)")
    for lines, title in ((settings.ticked_note, "Ticked by default here"),
                         (settings.strategies_note, "Not ticked by default here (each stays one click away)")):
        if lines:
            parts.append(f"{title}:\n\n" + "\n".join(f"- {html.escape(line)}" for line in lines.splitlines()))
    if settings.ticked_note or settings.strategies_note:
        parts.append(PROMPT_CAVEAT)
    return "\n\n".join(parts)


# the verdicts are the default example's (harness/examples): what a drafter copies depends on the prompt
PROMPT_CAVEAT = ("These verdicts are for the default example. They change with the prompt: prompt lookup and "
                 "lookahead pay where the answer repeats words of the prompt or of itself (a summary, a fix to "
                 "code), and on a free-form chat answer they can run slower than greedy; the race shows which.")


def inputs_fast(inputs: Inputs) -> dict:
    """The strategies' ``fast`` checkboxes: (strategy, "fast") -> component."""
    return {(s, f): inputs[param_input(s, f)] for s, f in param_fields() if f == "fast"
            and param_input(s, f) in inputs}


def start_views(settings: Settings, built: Settings) -> dict:
    """What a page built with ``built`` must change to show ``settings`` (the start's choices, made after the page
    was built: web/startup.py): the default target and its assistant, the default strategies, ``fast`` where the
    forward now runs compiled, and the notes. Nothing when nothing changed (a page that was built with them)."""
    if settings == built:
        return {}
    target = settings.default_target()
    note = strategies_note(settings)
    views = {"target_note": gr.update(value=html.escape(settings.target_note), visible=bool(settings.target_note)),
             "compiled_note": gr.update(value=html.escape(settings.compiled_note),
                                        visible=bool(settings.compiled_note)),
             "strategies_note": gr.update(value=note, visible=bool(note))}
    if (target, settings.strategies, settings.compiled) != (built.default_target(), built.strategies, built.compiled):
        views.update(model=target, assistant=PROPHET if has_prophet(target) else "none",
                     strategies=[n for n in settings.strategies if n in registry()])
        views.update({("fast", s): ui_default(s, "fast", settings) for s, f in param_fields() if f == "fast"})
    if settings.prophet_shape != built.prophet_shape:
        views.update({(f, "prophet"): ui_default("prophet", f, settings) for f in SHAPE_FIELDS})
    return views


def inputs_shape(inputs: Inputs) -> dict:
    """The prophet's fields a step shape sets: ("prophet", field) -> component."""
    return {("prophet", f): inputs[param_input("prophet", f)] for f in SHAPE_FIELDS
            if param_input("prophet", f) in inputs}


def wire_start(demo: gr.Blocks, state: PlaygroundApp, built: Settings, views: dict, fields: dict) -> None:
    """A page opened after the start's choices were made shows them (``start_views``); one opened before them
    has its notes updated by a timer until the start is done (its form is the visitor's by then). ``fields``:
    the parameter fields the start's choices set, (strategy, field) -> component (``inputs_fast``,
    ``inputs_shape``)."""
    components = {**views, **{(f, s): c for (s, f), c in fields.items()}}
    names = list(components)

    def _load():
        got = start_views(state.settings, built)
        return [got.get(name, gr.skip()) for name in names]

    notes = [n for n in names if isinstance(n, str) and n.endswith("_note")]
    ticker = gr.Timer(3.0, active=state.startup is not None and not state.startup.done.is_set())

    def _tick():
        got = start_views(state.settings, built)
        done = state.startup is None or state.startup.done.is_set()
        return [got.get(name, gr.skip()) for name in notes] + [gr.Timer(active=not done)]

    demo.load(_load, None, [components[n] for n in names], **LIGHT)
    ticker.tick(_tick, None, [components[n] for n in notes] + [ticker], **LIGHT)
