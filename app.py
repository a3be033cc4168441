"""Decoding Playground: the Gradio app. Wiring only; decoding lives in decoding/, views in visualize/.

    python app.py [--host 127.0.0.1] [--port 7860] [--allow-any-model] [--memory-budget-gb G]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import threading
import typing
from typing import Any

import gradio as gr
import yaml

from decoding.models import ModelLoadError, default_target, load_model, load_presets, set_memory_budget
from decoding.params import check_max_new_tokens
from decoding.result import ModelPair
from decoding.runner import encode_prompt, environment, run_comparison
from decoding.strategies import registry
from visualize.charts import forward_timeline, source_counts, speed_chart
from visualize.jacobi import has_iterations, jacobi_heatmap
from visualize.speculative import accepted_length_histogram, has_drafts, inspectable_positions, inspector
from visualize.tokens import columns_html, max_step
from visualize.traces import export_trace, import_trace

try:  # Hugging Face Spaces ZeroGPU: request a GPU for the run handler when available
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

# --------------------------------------------------------------------------- limits (one place)
LIMITS = {"max_new_tokens": 512, "prompt_tokens": 2048, "strategies": 6, "time_limit_s": 180.0}
SETTINGS = {"allow_any_model": False}
DEFAULT_STRATEGIES = ["greedy", "sample", "beam", "prompt_lookup"]
PROMPTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "prompts.yaml")
STOP_FLAGS: dict[str, threading.Event] = {}


def example_prompts() -> dict[str, list[str]]:
    with open(PROMPTS_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _field_kind(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and args else hint


def param_fields() -> list[tuple[str, str]]:
    """(strategy, field) for every strategy parameter, in UI order."""
    return [(s.name, f.name) for s in registry().values() for f in dataclasses.fields(s.params_cls)]


def _param_component(strategy: Any, field: dataclasses.Field) -> gr.components.Component:
    kind = _field_kind(strategy.params_cls, field.name)
    choices = getattr(strategy.params_cls, "CHOICES", {}).get(field.name)
    label = field.name
    if choices:
        return gr.Dropdown(choices=list(choices), value=field.default, label=label)
    if kind is bool:
        return gr.Checkbox(value=field.default, label=label)
    if kind is int:
        return gr.Number(value=field.default, precision=0, label=label)
    if kind is float:
        return gr.Number(value=field.default, label=label)
    return gr.Textbox(value="" if field.default is None else str(field.default), label=label)


# --------------------------------------------------------------------------- validation
def check_model_name(name: Any, what: str, presets: dict) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what}: choose a model")
    name = name.strip()
    if name not in presets and not SETTINGS["allow_any_model"]:
        raise ValueError(f"{what}: {name!r} is not one of the presets ({', '.join(presets)}); "
                         f"the operator can allow any Hub model with --allow-any-model")
    if os.path.sep in name and (name.startswith((".", os.path.sep, "~")) or os.path.exists(name)):
        raise ValueError(f"{what}: local paths are not accepted from the web UI")
    return name


def build_plan(strategies: Any, values: dict[tuple[str, str], Any]) -> list[tuple[str, Any]]:
    """Validate the strategy selection and parameters; returns [(name, params)]."""
    if not strategies:
        raise ValueError("strategies: pick at least one")
    if not isinstance(strategies, list) or len(strategies) > LIMITS["strategies"]:
        raise ValueError(f"strategies: pick at most {LIMITS['strategies']}")
    reg = registry()
    plan = []
    for name in strategies:
        if name not in reg:
            raise ValueError(f"strategies: unknown strategy {name!r}")
        raw = {f: v for (s, f), v in values.items() if s == name and v is not None and v != ""}
        try:
            plan.append((name, reg[name].parse(raw)))
        except ValueError as exc:
            raise ValueError(f"{reg[name].label or name}: {exc}") from None
    return plan


# --------------------------------------------------------------------------- handlers
def _outputs(doc: dict | None, message: str) -> tuple:
    results = doc["results"] if doc else []
    top = max((max_step(r) for r in results), default=0)
    trace_path = None
    if doc:
        fd, trace_path = tempfile.mkstemp(prefix="decoding-trace-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(export_trace(doc))
    drafted = [r for r in results if has_drafts(r)]
    choices = [r["strategy"] for r in drafted if inspectable_positions(r)]
    return (doc, gr.update(minimum=0, maximum=max(top, 1), value=top),
            columns_html(results, top), speed_chart(results) if results else None,
            forward_timeline(results) if results else None, source_counts(results) if results else None,
            trace_path, message, accepted_length_histogram(drafted) if drafted else None,
            gr.update(choices=choices, value=choices[0] if choices else None),
            next((jacobi_heatmap(r) for r in results if has_iterations(r)), None))


@gpu
def run_playground(model: str, assistant: str, strategies: list[str], prompt: str, chat: bool,
                   max_new_tokens: float, seed: float, params: dict,
                   progress: gr.Progress = gr.Progress(), request: gr.Request = None) -> tuple:
    """Run the selected strategies side by side; returns the replay outputs."""
    try:
        presets = load_presets()
        model = check_model_name(model, "model", presets)
        assistant = None if assistant in (None, "", "none") else check_model_name(assistant, "assistant", presets)
        max_new = check_max_new_tokens(max_new_tokens, LIMITS["max_new_tokens"])
        if not isinstance(seed, (int, float)) or seed != seed or not 0 <= seed < 2**31:
            raise ValueError("seed must be an integer in [0, 2147483647]")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must not be empty")
        plan = build_plan(strategies, params or {})
        progress(0, desc=f"loading {model}")
        target = load_model(model)
        helper = load_model(assistant) if assistant else None
        needs = [n for n, _ in plan if registry()[n].needs_assistant]
        note = ""
        if needs and helper is None:
            helper, note = target, " (no assistant chosen: the target drafts for itself, a correctness demo)"
        pair = ModelPair(target, helper)
        prompt_ids = encode_prompt(target.tokenizer, prompt, chat=bool(chat) and target.chat)
        if len(prompt_ids) > LIMITS["prompt_tokens"]:
            raise ValueError(f"prompt is {len(prompt_ids)} tokens; the limit is {LIMITS['prompt_tokens']}")
    except (ValueError, ModelLoadError) as exc:
        raise gr.Error(str(exc)) from None

    key = getattr(request, "session_hash", None) or "local"
    stop = STOP_FLAGS.setdefault(key, threading.Event())
    stop.clear()
    total = len(plan) + (0 if any(n == "greedy" for n, _ in plan) else 1)

    def on_progress(index: int, name: str, done: int) -> None:
        progress((index + done / max_new) / total, desc=f"{name}: {done}/{max_new} tokens")

    results = run_comparison(prompt_ids, pair, plan, max_new_tokens=max_new, seed=int(seed),
                             on_progress=on_progress, should_stop=stop.is_set,
                             time_limit_s=LIMITS["time_limit_s"])
    doc = {"environment": environment(pair, int(seed)), "prompt": prompt, "chat": bool(chat),
           "prompt_ids": prompt_ids, "max_new_tokens": max_new,
           "results": [r.to_dict() for r in results]}
    failed = [r for r in results if r.error]
    message = f"Ran {len(results)} strategies on {model}{note}."
    if failed:
        message += " " + "; ".join(f"{r.strategy}: {r.error}" for r in failed)
    return _outputs(doc, message)


def stop_run(request: gr.Request = None) -> str:
    key = getattr(request, "session_hash", None) or "local"
    STOP_FLAGS.setdefault(key, threading.Event()).set()
    return "Stopping after the current step…"


def replay(doc: dict | None, step: float) -> str:
    results = (doc or {}).get("results", [])
    return columns_html(results, int(step or 0))


def inspect_position(doc: dict | None, strategy: str | None, position: float) -> Any:
    result = next((r for r in (doc or {}).get("results", []) if r["strategy"] == strategy), None)
    if result is None:
        return None
    positions = inspectable_positions(result)
    if not positions:
        return None
    pos = int(position or 0)
    if pos not in positions:  # snap to the nearest verified position
        pos = min(positions, key=lambda p: abs(p - pos))
    return inspector(result, pos)


def import_file(path: str | None) -> tuple:
    if not path:
        raise gr.Error("trace: choose a JSON file exported from this app")
    try:
        with open(path, "rb") as fh:
            data = fh.read(21 * 2**20)
        doc = import_trace(data)
    except ValueError as exc:
        raise gr.Error(f"trace: {exc}") from None
    return _outputs(doc, f"Imported a trace with {len(doc['results'])} strategies (no model needed).")


# --------------------------------------------------------------------------- layout
def build_demo() -> gr.Blocks:
    presets = load_presets()
    reg = registry()
    prompts = example_prompts()
    with gr.Blocks(title="Decoding Playground") as demo:
        gr.Markdown("# Decoding Playground\nRun decoding strategies on the same prompt and replay them "
                    "token by token. Time is counted in target forward passes.")
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(label="Prompt", lines=4, value=prompts["chat"][0])
                with gr.Row():
                    category = gr.Dropdown(list(prompts), value="chat", label="Example category")
                    example = gr.Dropdown(prompts["chat"], value=prompts["chat"][0], label="Example prompt",
                                          allow_custom_value=True)
            with gr.Column(scale=1):
                model = gr.Dropdown(list(presets), value=default_target(), label="Target model")
                assistant = gr.Dropdown(["none"] + list(presets), value="none", label="Assistant (draft) model")
                with gr.Row():
                    chat = gr.Checkbox(value=True, label="Chat template")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                max_new = gr.Number(value=64, precision=0, label=f"max_new_tokens (1–{LIMITS['max_new_tokens']})")
        strategies = gr.CheckboxGroup([(s.label or s.name, s.name) for s in reg.values()],
                                      value=[n for n in DEFAULT_STRATEGIES if n in reg],
                                      label="Strategies (greedy is always run as the reference)")
        param_inputs: dict[tuple[str, str], Any] = {}
        with gr.Accordion("Strategy parameters", open=False):
            with gr.Row():
                for s in reg.values():
                    fields = dataclasses.fields(s.params_cls)
                    if not fields:
                        continue
                    with gr.Column(min_width=180):
                        gr.Markdown(f"**{s.label or s.name}**")
                        for f in fields:
                            param_inputs[(s.name, f.name)] = _param_component(s, f)
        with gr.Row():
            run_btn = gr.Button("Run", variant="primary")
            stop_btn = gr.Button("Stop", variant="stop")
        status = gr.Markdown("")
        state = gr.State(None)
        step = gr.Slider(0, 1, value=0, step=1, label="Replay step (target forward passes)")
        columns = gr.HTML(columns_html([]), elem_id="columns")
        with gr.Row():
            speed = gr.Plot(label="Speed")
            sources = gr.Plot(label="Token sources")
        timeline = gr.Plot(label="Forward passes")
        with gr.Row():
            histogram = gr.Plot(label="Accepted length per step")
            with gr.Column():
                with gr.Row():
                    inspect_strategy = gr.Dropdown([], label="Inspect strategy")
                    inspect_pos = gr.Number(value=1, precision=0, label="Output position")
                inspect_plot = gr.Plot(label="p_target vs q_draft")
        with gr.Row():
            download = gr.File(label="Trace (JSON download)")
            upload = gr.File(label="Import a trace to replay it without a model", file_types=[".json"],
                             type="filepath")

        heatmap = gr.Plot(label="Jacobi iterations")
        outputs = [state, step, columns, speed, timeline, sources, download, status, histogram, inspect_strategy,
                   heatmap]
        keys = list(param_inputs)

        def _run(model_v, assistant_v, strategies_v, prompt_v, chat_v, max_new_v, seed_v, *values,
                 progress=gr.Progress(), request: gr.Request = None):
            return run_playground(model_v, assistant_v, strategies_v, prompt_v, chat_v, max_new_v, seed_v,
                                  dict(zip(keys, values)), progress=progress, request=request)

        run_event = run_btn.click(_run, [model, assistant, strategies, prompt, chat, max_new, seed,
                                         *param_inputs.values()], outputs, api_name="run")
        stop_btn.click(stop_run, None, status, api_name="stop", queue=False)
        step.change(replay, [state, step], columns, api_name="replay", queue=False)
        upload.upload(import_file, upload, outputs, api_name="import_trace")
        for trigger in (inspect_strategy.change, inspect_pos.change):
            trigger(inspect_position, [state, inspect_strategy, inspect_pos], inspect_plot, queue=False)
        category.change(lambda c: gr.update(choices=prompts[c], value=prompts[c][0]), category, example,
                        queue=False)
        example.change(lambda e: e, example, prompt, queue=False)
        demo.run_event = run_event
    demo.queue(default_concurrency_limit=1, max_size=32)
    return demo


def main() -> None:
    ap = argparse.ArgumentParser(description="Decoding Playground web app")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--allow-any-model", action="store_true",
                    help="accept any Hugging Face Hub id in the model pickers (default: presets only)")
    ap.add_argument("--memory-budget-gb", type=float, default=None,
                    help="evict least recently used models beyond this much memory")
    args = ap.parse_args()
    SETTINGS["allow_any_model"] = args.allow_any_model
    set_memory_budget(args.memory_budget_gb)
    build_demo().launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
