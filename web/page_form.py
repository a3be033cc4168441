"""The form: the prompt and its examples, the models, the strategies, the Run/Stop/Clear buttons, every strategy
parameter and generation setting, each an input by name (web/page_names.py); the target picker's entries."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import gradio as gr

from decoding.harness.document import GENERATION_LABELS
from decoding.harness.examples import default_example
from decoding.processors import GenerationSettings
from decoding.runtime.models import runs_here
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from web.page_model_races import build_model_races
from web.page_names import generation_input, param_input
from web.page_parts import Inputs
from web.page_start import strategies_note
from web.requests import DEFAULT_MAX_NEW, ui_default
from web.settings import Settings
from web.validation import GENERATION_FIELDS, field_kind


def _param_component(strategy: Any, field: dataclasses.Field, settings: Settings) -> gr.components.Component:
    kind = field_kind(strategy.params_cls, field.name)
    choices = getattr(strategy.params_cls, "CHOICES", {}).get(field.name)
    label, default = field.name, ui_default(strategy.name, field.name, settings)
    if choices:
        return gr.Dropdown(choices=list(choices), value=default, label=label, allow_custom_value=True)
    if kind is bool and field.name == "fast":
        # on a GPU the fast path is what makes a small model fast: on by default there (ui_default), and on a
        # CPU where the default target's forward was compiled at start
        return gr.Checkbox(value=default, label=label,
                           info="static KV cache; CUDA-graph replay on a GPU, compiled forwards on a CPU")
    if kind is bool:
        return gr.Checkbox(value=default, label=label)
    if kind in (int, float):
        # no precision=0: Gradio would round 2.5 and crash on NaN before our validator names the field
        info = AUTO_WIDTHS.get((strategy.name, field.name))
        return gr.Number(value=default, step=1 if kind is int else None, label=label, info=info)
    return gr.Textbox(value="" if default is None else str(default), label=label)


# widths chosen from this machine's measured forward-cost curve when left at 0 (decoding/runtime/widths.py)
AUTO_WIDTHS = {("lookahead", "window"): "0 = auto (from this machine's measured forward cost)",
               ("jacobi", "block_size"): "0 = auto (from this machine's measured forward cost)",
               ("self_speculative", "exit_layer"): "0 = half the model's layers (or set skip_layers: N,M,... or auto)",
               ("hf_early_exit", "exit_layer"): "0 = half the model's layers"}



def _param_inputs(reg: dict, settings: Settings) -> dict[tuple[str, str], Any]:
    inputs: dict[tuple[str, str], Any] = {}
    with gr.Accordion("Strategy parameters", open=False):
        with gr.Row():
            for s in reg.values():
                fields = dataclasses.fields(s.params_cls)
                if not fields:
                    continue
                with gr.Column(min_width=180):
                    gr.Markdown(f"**{s.label or s.name}**")
                    for f in fields:
                        inputs[(s.name, f.name)] = _param_component(s, f, settings)
    return inputs


def _generation_inputs() -> dict[str, Any]:
    defaults = GenerationSettings()
    with gr.Accordion("Generation settings (logits processors, applied to every strategy)", open=False):
        gr.Markdown("transformers' own processors, in `generate`'s order; every lossless strategy stays "
                    "identical to greedy under the same settings.", elem_classes=["dp-help"])
        with gr.Row():
            return {name: gr.Number(value=getattr(defaults, name), label=GENERATION_LABELS[name][0],
                                    info=GENERATION_LABELS[name][1], min_width=160) for name in GENERATION_FIELDS}


_REDUCED = {"fp16": "float16 weights", "bf16": "bfloat16 weights", "int8": "int8 weights",
            "w8a8": "int8 weights and activations"}


def target_choices(presets: dict) -> list:
    """The target picker's entries: the presets that can load on this machine; a reduced-weight preset says
    that it is its own reference (BENCHMARKS.md, "Float16 weights", "Bfloat16 weights on AMX")."""
    return [(f"{name} ({_REDUCED[p.weights]}: checked against its own greedy)", name)
            if p.weights in _REDUCED else name for name, p in presets.items() if runs_here(p)]



@dataclasses.dataclass
class Form:
    """The form's components: ``inputs`` (the run's, by name), ``controls`` (category, example, run, stop, clear),
    ``notes`` (what the start chose and why), ``races`` (model race -> its example button)."""
    inputs: Inputs
    controls: dict
    notes: dict
    races: dict


def _prompt_column(prompts: dict) -> dict:
    """The prompt box and the example pickers, on the default example (``harness/examples``)."""
    first, text = default_example()
    with gr.Column(scale=3):
        prompt = gr.Textbox(label="Prompt", lines=3, value=text)
        with gr.Row():
            category = gr.Dropdown(list(prompts), value=first, label="Example category")
            example = gr.Dropdown(prompts[first], value=text, label="Example prompt", allow_custom_value=True)
    return dict(prompt=prompt, category=category, example=example)


def _model_column(settings: Settings, presets: dict) -> tuple[dict, dict]:
    """(inputs, notes) of the models' column."""
    with gr.Column(scale=2):
        with gr.Row():
            model = gr.Dropdown(target_choices(presets), value=settings.default_target(),
                                label="Target model", allow_custom_value=True)   # our validator names it
            assistant = gr.Dropdown(
                [("prophet head (trained for the target)", PROPHET), "none"] + list(presets),
                value=PROPHET if has_prophet(settings.default_target()) else "none",
                label="Assistant (Speculative, transformers assisted)", allow_custom_value=True)
        versus = gr.Dropdown(["none"] + target_choices(presets), value="none", allow_custom_value=True,
                             label="Versus: the same strategies on a second model (each against its own "
                                   "greedy)", elem_id="versus")
        # why this target and mode are the default here (measured at start), or that the start still measures
        notes = dict(target_note=gr.Markdown(html.escape(settings.target_note), elem_id="target-note",
                                             elem_classes=["dp-help"], visible=bool(settings.target_note)),
                     compiled_note=gr.Markdown(html.escape(settings.compiled_note), elem_id="compiled-note",
                                               elem_classes=["dp-help"], visible=bool(settings.compiled_note)))
        with gr.Row():
            chat = gr.Checkbox(value=True, label="Chat template", min_width=100)
            seed = gr.Number(value=0, step=1, label="Seed", min_width=80)
            max_new = gr.Number(value=DEFAULT_MAX_NEW, step=1,
                                label=f"max_new_tokens (1–{settings.limits.max_new_tokens})", min_width=120)
    return dict(model=model, assistant=assistant, versus=versus, chat=chat, seed=seed, max_new_tokens=max_new), notes


def build_form(settings: Settings, presets: dict, prompts: dict) -> Form:
    """The form, top to bottom: title, prompt and models, strategies, model races, buttons, parameters."""
    reg = registry()
    gr.Markdown("# Decoding Playground\nRun decoding strategies on the same prompt, watch them race, then "
                "replay them token by token (by target forward passes or by wall-clock time).")
    with gr.Row():
        controls = _prompt_column(prompts)
        fields, notes = _model_column(settings, presets)
    strategies = gr.CheckboxGroup([(s.label or s.name, s.name) for s in reg.values()],
                                  value=[n for n in settings.strategies if n in reg],
                                  label="Strategies (greedy is always run as the reference)")
    # default strategies left out on this machine, and why (its measured curve)
    note = strategies_note(settings)
    notes["strategies_note"] = gr.Markdown(note, elem_id="strategies-note", elem_classes=["dp-help"],
                                           visible=bool(note))
    races = build_model_races(presets)
    with gr.Row():
        controls["run"] = gr.Button("Run", variant="primary", scale=2, elem_id="run")
        controls["stop"] = gr.Button("Stop", variant="stop", scale=1)
        controls["clear"] = gr.Button("Clear history", scale=1, elem_id="clear-history")
    inputs = Inputs(model=fields["model"], assistant=fields["assistant"], strategies=strategies,
                    prompt=controls["prompt"], chat=fields["chat"], max_new_tokens=fields["max_new_tokens"],
                    seed=fields["seed"], versus=fields["versus"])
    with gr.Row():
        with gr.Column():
            inputs.update({param_input(s, f): c for (s, f), c in _param_inputs(reg, settings).items()})
        with gr.Column():
            inputs.update({generation_input(n): c for n, c in _generation_inputs().items()})
    return Form(inputs, controls, notes, races)


def wire_examples(controls: dict, prompts: dict) -> None:
    """The example pickers: a category lists its prompts, a prompt fills the prompt box."""
    page = dict(api_visibility="private")
    controls["category"].change(lambda cat: gr.update(choices=prompts.get(cat, []),
                                                      value=(prompts.get(cat) or [""])[0]),
                                controls["category"], controls["example"], queue=False, **page)
    controls["example"].change(lambda e: e, controls["example"], controls["prompt"], queue=False, **page)
