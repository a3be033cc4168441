"""Under the race: its Share link and its export as an animation (issue 40), made and wired by name.
``?race=<id>`` opens that race when the page loads; a Run or an import clears the previous race's link; the export
waits in the app's compute line like a run (``/export_race``)."""

from __future__ import annotations

import gradio as gr

from web.handlers import export_race as export_animation, open_shared
from web.page_names import RUN_VIEWS
from web.page_parts import LIGHT, Views, admitter
from web.app_object import PlaygroundApp
from web.share import QUERY, share_views


def build_share(ui: Views) -> None:
    ui["share"] = gr.HTML("", elem_id="share")
    ui["race_id"] = gr.Textbox("", visible=False, label="race_id", elem_id="race-id")   # what the export reads
    with gr.Row(equal_height=True):
        ui["export_format"] = gr.Radio([("GIF", "gif"), ("MP4", "mp4")], value="gif", label="Animation format",
                                       scale=1, elem_id="export-format")
        ui["export_mode"] = gr.Radio([("real time", "time"), ("target forward passes", "steps")], value="time",
                                     label="Replay by", scale=2, elem_id="export-mode")
        ui["export_btn"] = gr.Button("Export the race as an animation", scale=1, elem_id="export-btn")
        ui["export_file"] = gr.File(label="Animation", scale=2, elem_id="export-file")


def wire_run_clears_link(ui: Views, run_button) -> None:
    """A Run clears the previous race's link. Wired before the Run itself: an unqueued event wired after a queued
    one on the same click waits for it."""
    run_button.click(lambda: ui.pack({"share": "", "race_id": ""}), None, ui.list(("share", "race_id")), **LIGHT)


def wire_share(ui: Views, demo: gr.Blocks, state: PlaygroundApp) -> None:
    """The shared race opened on load, the link cleared by an import, and the export (``/export_race``)."""
    def _open(request: gr.Request):
        values = open_shared(state, dict(getattr(request, "query_params", None) or {}).get(QUERY))
        return ui.pack(values or {"share": gr.skip()})       # no ?race=: the page as it is

    demo.load(_open, None, ui.list(RUN_VIEWS), **LIGHT)
    ui["upload"].upload(lambda: ui.pack(share_views(None)), None, ui.list(("share", "race_id")), **LIGHT)

    async def export_race(race_id: str, format: str = "gif", mode: str = "time", request: gr.Request = None):
        """A finished race (its id: the end of its Share link, ...?race=<id>) as an animated GIF or an MP4 of its
        columns filling up, with the strategy names, the page's colours and legend, and the final figures.

        Args:
            race_id: the race's id (16 characters, from its Share link).
            format: "gif" or "mp4".
            mode: "time" (real time, each strategy on its own measured clock) or "steps" (target forward passes).
        """
        return await export_animation(state, race_id, format, mode, request=request)

    ui["export_btn"].click(export_race, ui.list(("race_id", "export_format", "export_mode")), ui["export_file"],
                           api_name="export_race", validator=admitter(state), preprocess=False,
                           concurrency_id="generate", concurrency_limit=state.limits.line_capacity)
