"""What every part of the page is built with: its inputs and views by name, and the how-to-read lines above them.
Each feature (web/page_form.py, page_race.py, page_share.py, page_tabs.py, page_sweep.py, page_import.py,
page_start.py, page_model_races.py) puts its components into these by name and wires its events by name."""

from __future__ import annotations

import gradio as gr

from visualize.guide import HOW_TO_READ
from web.handlers import admit
from web.app_object import PlaygroundApp

# The API page shows one endpoint, /race (web/api.py): named parameters, the CLI's JSON back. The page's own
# events are left off it: those wired with NAMED stay callable by name (scripts, tests, a client's Stop), those
# with PAGE are the page's alone (their parameters are the page's components, in the page's order).
NAMED, PAGE = dict(api_visibility="undocumented"), dict(api_visibility="private")
# the events the page keeps to itself: unlisted, no progress shown, answered at once
LIGHT = dict(queue=False, show_progress="hidden", **PAGE)
# unqueued handlers do bounded work (a replay frame draws at most MAX_FRAME_ITEMS tokens) and clamp their raw
# inputs themselves; they show no progress: Gradio would dim the columns and put a timer on them while each frame
# (ten a second in the wall-clock replay) is in flight
FRAME = dict(queue=False, preprocess=False, show_progress="hidden")


class Inputs(dict):
    """Input name -> component. An event takes ``list(names)``; its handler reads ``named(names, values)``, so
    no handler counts positions, and where a component sits on the page changes nothing."""

    def list(self, names: tuple) -> list:
        return [self[name] for name in names]

    @staticmethod
    def named(names: tuple, values: tuple) -> dict:
        if len(values) != len(names):
            raise gr.Error(f"expected {len(names)} values ({', '.join(names[:7])}, ...), got {len(values)}")
        return dict(zip(names, values))


class Views(dict):
    """View name -> component. Handlers return ``{view name: value}``; ``pack`` turns that into Gradio's
    ``{component: value}`` and refuses a name with no component, so no value lands in another's slot."""

    def pack(self, values: dict) -> dict:
        return {self[name]: value for name, value in values.items()}

    def list(self, names: tuple) -> list:
        return [self[name] for name in names if name in self]


def help_line(name: str) -> None:
    gr.Markdown(HOW_TO_READ[name], elem_classes=["dp-help"])


def plot_pair(ui: Views, *plots: tuple[str, dict]) -> None:
    """Plots side by side, each under its how-to-read line: ``(view name, gr.Plot keyword arguments)``."""
    with gr.Row():
        for name, kwargs in plots:
            with gr.Column():
                help_line(name)
                ui[name] = gr.Plot(**kwargs)


def admitter(state: PlaygroundApp):
    """The queue validator of ``state``'s runs, sweeps, imports and exports: a Stop ticket, a few per session."""
    def _admit(request: gr.Request, *values):           # Gradio passes the request by its annotation
        return admit(state, request, *values)
    return _admit
