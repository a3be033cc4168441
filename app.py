"""Decoding Playground: the Gradio app. Wiring only; decoding lives in decoding/, views in visualize/.

    python app.py [--host 127.0.0.1] [--port 7860] [--allow-any-model] [--memory-budget-gb G]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
import threading
import typing
from typing import Any

import gradio as gr
import yaml

from decoding.bench import _num as sweep_value
from decoding.bench import parse_sweep
from decoding.models import ModelLoadError, default_target, load_model, load_presets, set_memory_budget
from decoding.params import check_max_new_tokens
from decoding.prophet import PROPHET, has_prophet, make_pair
from decoding.runner import encode_prompt, environment, run_comparison
from decoding.strategies import registry
from visualize.charts import (forward_timeline, has_prediction, leviathan_chart, source_counts, speed_chart,
                              sweep_figure, time_breakdown)
from visualize.jacobi import has_iterations, jacobi_heatmap
from visualize.lookahead import has_steps, lookahead_figure, lookahead_step_html
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
LIMITS = {"max_new_tokens": 512, "prompt_tokens": 2048, "strategies": 6, "time_limit_s": 180.0,
          "sweep_points": 12}
SETTINGS = {"allow_any_model": False}
# the default comparison: speculative drafts with the bundled model's trained prophet head
DEFAULT_STRATEGIES = ["greedy", "speculative", "prompt_lookup", "lookahead"]
SWEEP_DEFAULTS = {"lookahead": "window=3,5,8;ngram=3,4", "speculative": "draft_tokens=1,2,4,8",
                  "prophet": "draft_tokens=1,2,3,4,6", "prompt_lookup": "draft_tokens=2,4,8,16",
                  "jacobi": "block_size=2,4,8,16"}
PROMPTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "prompts.yaml")
STOP_FLAGS: dict[str, threading.Event] = {}   # insertion-ordered: oldest first
STOP_LOCK = threading.Lock()


def example_prompts() -> dict[str, list[str]]:
    with open(PROMPTS_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _field_kind(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and args else hint


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def param_fields() -> list[tuple[str, str]]:
    """(strategy, field) for every strategy parameter, in UI order."""
    return [(s.name, f.name) for s in registry().values() for f in dataclasses.fields(s.params_cls)]


def _param_component(strategy: Any, field: dataclasses.Field) -> gr.components.Component:
    kind = _field_kind(strategy.params_cls, field.name)
    choices = getattr(strategy.params_cls, "CHOICES", {}).get(field.name)
    label = field.name
    if choices:
        return gr.Dropdown(choices=list(choices), value=field.default, label=label, allow_custom_value=True)
    if kind is bool and field.name == "fast":
        # on a GPU the fast path is what makes a small model fast: on by default there
        return gr.Checkbox(value=bool(field.default or _cuda()), label=label,
                           info="static KV cache; CUDA-graph replay on a GPU")
    if kind is bool:
        return gr.Checkbox(value=field.default, label=label)
    if kind is int:
        # no precision=0: Gradio would round 2.5 and crash on NaN before our validator names the field
        return gr.Number(value=field.default, step=1, label=label)
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
            next((jacobi_heatmap(r) for r in results if has_iterations(r)), None),
            lookahead_view(doc, top), next((lookahead_figure(r) for r in results if has_steps(r)), None),
            time_breakdown(results) if results else None,
            leviathan_chart(results) if any(has_prediction(r) for r in results) else None)


def lookahead_view(doc: dict | None, step: int | None) -> str:
    """The lookahead window and verification branch at the replay step (first lookahead column)."""
    result = next((r for r in (doc or {}).get("results", []) if has_steps(r)), None)
    if result is None:
        return "<div class='dp-la'>Run the lookahead strategy to see its 2D window and verified n-grams.</div>"
    return lookahead_step_html(result, step)


@dataclasses.dataclass
class Prepared:
    """A validated request: the model pair, the prompt ids and the run limits."""
    pair: Any
    prompt_ids: list[int]
    max_new: int
    seed: int
    model: str
    note: str


def prepare(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
            needs_assistant: bool, progress: Any = None) -> Prepared:
    """The validation boundary shared by runs and sweeps; raises ValueError / ModelLoadError."""
    presets = load_presets()
    model = check_model_name(model, "model", presets)
    if assistant in (None, "", "none"):
        assistant = None
    elif assistant != PROPHET:
        assistant = check_model_name(assistant, "assistant", presets)
    max_new = check_max_new_tokens(max_new_tokens, LIMITS["max_new_tokens"])
    if not isinstance(seed, (int, float)) or isinstance(seed, bool) or seed != seed or not 0 <= seed < 2**31 \
            or not float(seed).is_integer():
        raise ValueError("seed must be an integer in [0, 2147483647]")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must not be empty")
    if progress is not None:
        progress(0, desc=f"loading {model}")
    target = load_model(model)
    pair = make_pair(target, assistant, load_model)
    note = " (speculative drafts with the target's trained prophet head)" if assistant == PROPHET else ""
    if needs_assistant and assistant is None:
        pair = dataclasses.replace(pair, assistant=target)
        note = " (no assistant chosen: the target drafts for itself, a correctness demo)"
    prompt_ids = encode_prompt(target.tokenizer, prompt, chat=bool(chat) and target.chat)
    if len(prompt_ids) > LIMITS["prompt_tokens"]:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the limit is {LIMITS['prompt_tokens']}")
    return Prepared(pair, prompt_ids, max_new, int(seed), model, note)


def _session_flag(request: Any) -> threading.Event:
    """This browser session's Stop flag (bounded: the oldest sessions' flags are forgotten)."""
    key = getattr(request, "session_hash", None) or "local"
    with STOP_LOCK:
        flag = STOP_FLAGS.pop(key, None) or threading.Event()
        STOP_FLAGS[key] = flag
        while len(STOP_FLAGS) > 4096:
            STOP_FLAGS.pop(next(iter(STOP_FLAGS)))
    return flag


def _stop_flag(request: Any) -> threading.Event:
    stop = _session_flag(request)
    stop.clear()
    return stop


@gpu
def run_playground(model: str, assistant: str, strategies: list[str], prompt: str, chat: bool,
                   max_new_tokens: float, seed: float, params: dict,
                   progress: gr.Progress = gr.Progress(), request: gr.Request = None) -> tuple:
    """Run the selected strategies side by side; returns the replay outputs."""
    stop = _stop_flag(request)   # cleared first: a Stop pressed while the model loads still counts
    try:
        plan = build_plan(strategies, params or {})
        needs = any(registry()[n].needs_assistant for n, _ in plan)
        prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs, progress)
    except (ValueError, ModelLoadError) as exc:
        raise gr.Error(str(exc)) from None
    total = len(plan) + (0 if any(n == "greedy" for n, _ in plan) else 1)
    max_new = prep.max_new

    def on_progress(index: int, name: str, done: int) -> None:
        progress((index + done / max_new) / total, desc=f"{name}: {done}/{max_new} tokens")

    results = run_comparison(prep.prompt_ids, prep.pair, plan, max_new_tokens=max_new, seed=prep.seed,
                             on_progress=on_progress, should_stop=stop.is_set,
                             time_limit_s=LIMITS["time_limit_s"])
    doc = {"environment": environment(prep.pair, prep.seed), "prompt": prompt, "chat": bool(chat),
           "prompt_ids": prep.prompt_ids, "max_new_tokens": max_new,
           "results": [r.to_dict() for r in results]}
    failed = [r for r in results if r.error]
    message = f"Ran {len(results)} strategies on {prep.model}{prep.note}."
    if failed:
        message += " " + "; ".join(f"{r.strategy}: {r.error}" for r in failed)
    return _outputs(doc, message)


def parse_sweep_spec(strategy: Any, spec: Any) -> tuple[list[str], list[tuple], list[tuple[str, Any]]]:
    """``"window=3,5;ngram=3,4"`` for ``strategy`` -> (keys, value tuples, validated plan)."""
    reg = registry()
    if strategy not in reg:
        raise ValueError(f"sweep strategy: unknown strategy {strategy!r}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("sweep values: write KEY=V1,V2[;KEY=V1,V2], e.g. draft_tokens=2,4,8")
    if len(spec) > 500:
        raise ValueError("sweep values: at most 500 characters")
    _, keys, combos = parse_sweep(f"{strategy}:{spec}")
    if len(keys) > 2:
        raise ValueError("sweep values: sweep at most two parameters")
    if not 1 <= len(combos) <= LIMITS["sweep_points"]:
        raise ValueError(f"sweep values: {len(combos)} combinations; the limit is {LIMITS['sweep_points']}")
    plan = []
    for combo in combos:
        try:
            plan.append((strategy, reg[strategy].parse({k: sweep_value(v) for k, v in zip(keys, combo)})))
        except ValueError as exc:
            raise ValueError(f"sweep values: {exc}") from None
    return keys, combos, plan


@gpu
def run_sweep(model: str, assistant: str, prompt: str, chat: bool, max_new_tokens: float, seed: float,
              strategy: str, spec: str, progress: gr.Progress = gr.Progress(), request: gr.Request = None) -> tuple:
    """Run one strategy over a parameter grid against one greedy reference; returns (figure, message)."""
    stop = _stop_flag(request)   # cleared first: a Stop pressed while the model loads still counts
    try:
        keys, combos, plan = parse_sweep_spec(strategy, spec)
        needs = registry()[strategy].needs_assistant
        prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs, progress)
    except (ValueError, ModelLoadError) as exc:
        raise gr.Error(str(exc)) from None

    def on_progress(index: int, name: str, done: int) -> None:
        progress((index + done / prep.max_new) / (len(plan) + 1), desc=f"sweep point {index}: {done} tokens")

    results = run_comparison(prep.prompt_ids, prep.pair, plan, max_new_tokens=prep.max_new, seed=prep.seed,
                             on_progress=on_progress, should_stop=stop.is_set,
                             time_limit_s=LIMITS["time_limit_s"])
    runs = [r for r in results if not r.reference]
    points = [{"values": [sweep_value(v) for v in combo], "speedup": r.speedup or 0.0,
               "tokens_per_target_forward": round(len(r.token_ids) / max(r.target_forwards, 1), 3)}
              for combo, r in zip(combos, runs) if not r.error]
    errors = [f"{dict(zip(keys, c))}: {r.error}" for c, r in zip(combos, runs) if r.error]
    message = f"Swept {len(points)} settings of {strategy} on {prep.model}{prep.note}."
    if errors:
        message += " Failed: " + "; ".join(errors)
    return sweep_figure({"strategy": strategy, "keys": keys, "points": points}), message


def advance(doc: dict | None, step: float) -> tuple:
    """One tick of the play button: the next replay step, stopping the timer at the end."""
    top = max((max_step(r) for r in (doc or {}).get("results", [])), default=0)
    nxt = int(step or 0) + 1
    if nxt >= top:
        return top, gr.Timer(active=False)
    return nxt, gr.Timer(active=True)


def play(doc: dict | None, step: float) -> tuple:
    """Start playing from the current step (from 0 when at the end)."""
    top = max((max_step(r) for r in (doc or {}).get("results", [])), default=0)
    start = 0 if int(step or 0) >= top else int(step or 0)
    return start, gr.Timer(active=top > 0)


def stop_run(request: gr.Request = None) -> str:  # noqa: D103 - sets this session's Stop flag
    _session_flag(request).set()
    return "Stopping after the current step…"


def replay(doc: dict | None, step: float) -> tuple[str, str]:
    results = (doc or {}).get("results", [])
    return columns_html(results, int(step or 0)), lookahead_view(doc, int(step or 0))


def inspect_position(doc: dict | None, strategy: str | None, position: float) -> Any:
    result = next((r for r in (doc or {}).get("results", []) if r["strategy"] == strategy), None)
    if result is None:
        return None
    positions = inspectable_positions(result)
    if not positions:
        return None
    ok = isinstance(position, (int, float)) and not isinstance(position, bool) and math.isfinite(position)
    pos = int(position) if ok else 0
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
                model = gr.Dropdown(list(presets), value=default_target(), label="Target model",
                                    allow_custom_value=True)   # our validator names the parameter
                assistant = gr.Dropdown(
                    [("prophet head (trained for the target)", PROPHET), "none"] + list(presets),
                    value=PROPHET if has_prophet(default_target()) else "none", label="Assistant (draft) model",
                    allow_custom_value=True)
                with gr.Row():
                    chat = gr.Checkbox(value=True, label="Chat template")
                    seed = gr.Number(value=0, step=1, label="Seed")
                max_new = gr.Number(value=64, step=1, label=f"max_new_tokens (1–{LIMITS['max_new_tokens']})")
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
        with gr.Row():
            step = gr.Slider(0, 1, value=0, step=1, label="Replay step (target forward passes)", scale=8)
            play_btn = gr.Button("▶ Play", scale=1, min_width=80)
        ticker = gr.Timer(0.4, active=False)
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
                    inspect_pos = gr.Number(value=1, step=1, label="Output position")
                inspect_plot = gr.Plot(label="p_target vs q_draft")
        with gr.Row():
            download = gr.File(label="Trace (JSON download)", elem_id="trace-download")
            upload = gr.File(label="Import a trace to replay it without a model", file_types=[".json"],
                             type="filepath", elem_id="trace-upload")

        with gr.Row():
            breakdown = gr.Plot(label="Why (no) speedup")
            leviathan = gr.Plot(label="Predicted vs measured speedup")
        heatmap = gr.Plot(label="Jacobi iterations")
        with gr.Row():
            window = gr.HTML(lookahead_view(None, None), elem_id="lookahead-window")
            la_plot = gr.Plot(label="Lookahead: tokens per target forward")
        outputs = [state, step, columns, speed, timeline, sources, download, status, histogram, inspect_strategy,
                   heatmap, window, la_plot, breakdown, leviathan]
        keys = list(param_inputs)
        with gr.Accordion("Sweep: one strategy over a parameter range", open=False):
            with gr.Row():
                sweep_strategy = gr.Dropdown([n for n in SWEEP_DEFAULTS if n in reg], value="lookahead",
                                             label="Sweep strategy")
                sweep_spec = gr.Textbox(SWEEP_DEFAULTS["lookahead"], label="Values (KEY=V1,V2[;KEY=V1,V2])")
                sweep_btn = gr.Button("Run sweep")
            sweep_status = gr.Markdown("")
            sweep_plot = gr.Plot(label="Sweep")

        # Gradio injects request and progress only into positional parameters before *values
        def _run(request: gr.Request, progress=gr.Progress(), *values):
            fixed, params = values[:7], dict(zip(keys, values[7:]))
            return run_playground(*fixed, params, progress=progress, request=request)

        run_event = run_btn.click(_run, [model, assistant, strategies, prompt, chat, max_new, seed,
                                         *param_inputs.values()], outputs, api_name="run")
        stop_btn.click(stop_run, None, status, api_name="stop", queue=False)
        step.change(replay, [state, step], [columns, window], api_name="replay", queue=False)
        play_btn.click(play, [state, step], [step, ticker], queue=False)
        ticker.tick(advance, [state, step], [step, ticker], queue=False)
        upload.upload(import_file, upload, outputs, api_name="import_trace")
        sweep_strategy.change(lambda n: SWEEP_DEFAULTS.get(n, ""), sweep_strategy, sweep_spec, queue=False)
        sweep_btn.click(run_sweep, [model, assistant, prompt, chat, max_new, seed, sweep_strategy, sweep_spec],
                        [sweep_plot, sweep_status], api_name="sweep")
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
