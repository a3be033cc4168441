"""The Sweep tab: one strategy's parameter swept over values (``/sweep``), made and wired by name."""

from __future__ import annotations

import gradio as gr

from web.handlers import run_sweep
from web.page_names import SWEEP_INPUTS
from web.page_parts import PAGE, Inputs, Views, help_line
from web.app_object import PlaygroundApp
from web.validation import SWEEP_DEFAULTS


def build_sweep(ui: Views) -> None:
    help_line("sweep")
    with gr.Row():
        ui["sweep_strategy"] = gr.Dropdown(list(SWEEP_DEFAULTS), value="lookahead", label="Sweep strategy")
        ui["sweep_spec"] = gr.Textbox(SWEEP_DEFAULTS["lookahead"], label="Values (KEY=V1,V2[;KEY=V1,V2])")
        ui["sweep_btn"] = gr.Button("Run sweep")
    ui["sweep_status"] = gr.Markdown("")
    ui["sweep_plot"] = gr.Plot(label="Sweep")


def wire_sweep(ui: Views, state: PlaygroundApp, inputs: Inputs, heavy: dict):
    """The sweep, admitted and waiting in the compute line like a run (``heavy``); its event."""
    async def _sweep(request: gr.Request, progress=gr.Progress(), *values):
        v = Inputs.named(SWEEP_INPUTS, values)
        async for item in run_sweep(
                state, model=v["model"], assistant=v["assistant"], prompt=v["prompt"], chat=v["chat"],
                max_new_tokens=v["max_new_tokens"], seed=v["seed"], strategy=v["sweep_strategy"],
                spec=v["sweep_spec"], progress=progress, request=request):
            yield item

    return ui["sweep_btn"].click(_sweep, inputs.list(SWEEP_INPUTS), [ui["sweep_plot"], ui["sweep_status"]],
                                 api_name="sweep", **heavy)


def wire_sweep_defaults(ui: Views) -> None:
    """Picking a strategy fills in its usual values."""
    ui["sweep_strategy"].change(lambda n: SWEEP_DEFAULTS.get(n, ""), ui["sweep_strategy"], ui["sweep_spec"],
                                queue=False, **PAGE)
