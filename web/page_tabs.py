"""The views under the race, one tab per question: speed, drafts, Jacobi and lookahead, beam and sampling, the
sweep (web/page_sweep.py) and the trace (web/page_import.py)."""

from __future__ import annotations

import gradio as gr

from web.page_import import build_import
from web.page_parts import Views, help_line, plot_pair
from web.page_sweep import build_sweep


def build_tabs(ui: Views) -> None:
    """The views, one tab per question."""
    with gr.Tabs():
        with gr.Tab("Speed", elem_id="tab-speed"):
            plot_pair(ui, ("speed", dict(label="Speed", elem_id="speed-chart")),
                      ("sources", dict(label="Token sources")))
            help_line("timeline")
            ui["timeline"] = gr.Plot(label="Forward passes")
            plot_pair(ui, ("breakdown", dict(label="Why (no) speedup")),
                      ("leviathan", dict(label="Predicted vs measured speedup")))
        with gr.Tab("Drafts", elem_id="tab-drafts"):
            with gr.Row():
                ui["inspect_strategy"] = gr.Dropdown([], label="Strategy (inspector and draft tree)")
                ui["inspect_pos"] = gr.Number(value=1, step=1, label="Output position (inspector)")
            plot_pair(ui, ("histogram", dict(label="Accepted length per step")),
                      ("inspector", dict(label="p_target vs q_draft")))
            help_line("tree")
            ui["tree"] = gr.Plot(label="Draft tree at the replay step", elem_id="draft-tree")
            help_line("drafts")
            ui["drafts"] = gr.HTML("", elem_id="draft-sources")
            help_line("crosstok")
            ui["crosstok"] = gr.HTML("", elem_id="crosstok")
        with gr.Tab("Jacobi & lookahead", elem_id="tab-jacobi"):
            help_line("jacobi")
            ui["jacobi"] = gr.HTML("", elem_id="jacobi-view")
            help_line("lookahead_window")
            ui["lookahead_window"] = gr.HTML("", elem_id="lookahead-window")
            plot_pair(ui, ("lookahead_mask", dict(label="Lookahead attention mask", elem_id="lookahead-mask")),
                      ("lookahead_chart", dict(label="Lookahead: tokens per target forward")))
        with gr.Tab("Beam & sampling", elem_id="tab-beam"):
            help_line("beam")
            ui["beam"] = gr.Plot(label="Beam search", elem_id="beam-tree")
            help_line("sampling")
            ui["sampling"] = gr.Plot(label="Sampling filters", elem_id="sampling-view")
        with gr.Tab("Sweep", elem_id="tab-sweep"):
            build_sweep(ui)
        with gr.Tab("Trace", elem_id="tab-trace"):
            build_import(ui)
