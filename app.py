"""Decoding Playground: the Gradio app. Wiring only: requests are validated and bounded in
decoding/service.py and decoding/guards.py, decoding lives in decoding/, views in visualize/.

    python app.py [--host 127.0.0.1] [--port 7860] [--allow-any-model] [--memory-budget-gb G]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import html
import math
import os
import time
import uuid
from typing import Any, Iterator

import gradio as gr
import yaml
from starlette.middleware import Middleware

from decoding.bench import _num as sweep_value
from decoding.guards import BodyLimit, TraceFiles, TraceStore
from decoding.models import (DEFAULT_MEMORY_BUDGET_GB, ModelLoadError, default_target, load_presets,
                             set_memory_budget)
from decoding.prophet import PROPHET, has_prophet
from decoding.runner import environment, run_comparison
from decoding.service import (LIMITS, SESSION_FALLBACK, SETTINGS, Jobs, Prepared, build_plan,  # noqa: F401
                              check_model_name, field_kind, needs_assistant, param_fields, parse_sweep_spec,
                              prepare, public_message, redact_all, redact_paths)
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

# the default comparison: speculative drafts with the bundled model's trained prophet head
DEFAULT_STRATEGIES = ["greedy", "speculative", "prompt_lookup", "lookahead"]
SWEEP_DEFAULTS = {"lookahead": "window=3,5,8;ngram=3,4", "speculative": "draft_tokens=1,2,4,8",
                  "prophet": "draft_tokens=1,2,3,4,6", "prompt_lookup": "draft_tokens=2,4,8,16",
                  "jacobi": "block_size=2,4,8,16"}
PROMPTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "prompts.yaml")
MEMORY_BUDGET_ENV = "DECODING_MEMORY_BUDGET_GB"
MAX_HEATMAP_ROWS = 1024     # Jacobi iterations drawn (a real run has at most about max_new_tokens)
EXPIRED = ("<div class='dp-muted'>This trace is no longer held by the server (it keeps the most recent "
           "ones); run again or import the trace file.</div>")

# Every store a request can add to is bounded (decoding/service.py, decoding/guards.py).
JOBS = Jobs(LIMITS["jobs_per_session"], capacity=4 * LIMITS["queue_size"],
            queued_ttl_s=LIMITS["time_limit_s"] * (LIMITS["queue_size"] + 1), count_s=LIMITS["time_limit_s"])
TRACE_FILES = TraceFiles(LIMITS["trace_files"])
STORE = TraceStore(LIMITS["trace_store_bytes"])


def example_prompts() -> dict[str, list[str]]:
    with open(PROMPTS_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _param_component(strategy: Any, field: dataclasses.Field) -> gr.components.Component:
    kind = field_kind(strategy.params_cls, field.name)
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


# --------------------------------------------------------------------------- jobs
def _session(request: Any) -> str:
    return getattr(request, "session_hash", None) or SESSION_FALLBACK


def _admission_session(request: Any) -> str:
    """A raw API call names no session when it is queued: it is its own session (nothing to group it with)."""
    return getattr(request, "session_hash", None) or f"anonymous-{uuid.uuid4().hex}"


def _request_state(request: Any) -> Any:
    """The HTTP request's state: the queue admission and the job itself see the same one."""
    return getattr(getattr(request, "request", None), "state", None)


def admit(request: gr.Request, *inputs: Any) -> list:
    """Queue admission (Gradio's validator runs it before a job waits): a Stop ticket, a few per session.

    A validator answers one ``gr.validate`` per input; a refusal is reported on the first.
    """
    fine = [gr.validate(True, "") for _ in inputs[1:]]
    try:
        ticket = JOBS.admit(_admission_session(request))
    except ValueError as exc:
        return [gr.validate(False, str(exc))] + fine
    state = _request_state(request)
    if state is not None:
        state.decoding_ticket = ticket
    return [gr.validate(True, "")] + fine


@contextlib.contextmanager
def job(request: Any) -> Iterator[Any]:
    """This job's Stop flag for as long as it runs (set already if Stop was pressed while it waited)."""
    key, flag = JOBS.start(getattr(_request_state(request), "decoding_ticket", None), _session(request))
    try:
        yield flag
    finally:
        JOBS.finish(key)


def stop_run(request: gr.Request = None) -> tuple[str, Any]:
    """Set this session's Stop flags. Returns the status and, when only queued jobs were stopped,
    a new value for the hidden component whose change cancels them in the browser."""
    running, waiting = JOBS.stop(_session(request))
    if running:
        return "Stopping after the current step…", gr.skip()
    if waiting:
        return "Stopped the queued job before it started.", time.time()
    return "Nothing to stop.", gr.skip()


# --------------------------------------------------------------------------- handlers
def _error(exc: BaseException, prefix: str = "") -> gr.Error:
    """A message for the browser: no server paths, and markup shown as text (Gradio renders it as HTML)."""
    return gr.Error(html.escape(prefix + public_message(exc), quote=False))


def _heatmap(results: list[dict]) -> Any:
    result = next((r for r in results if has_iterations(r)), None)
    if result is None:
        return None
    its = [e for e in result["events"] if e.get("type") == "JacobiIteration"][:MAX_HEATMAP_ROWS]
    return jacobi_heatmap(dict(result, events=its))


def _outputs(doc: dict, message: str, size: int, trace_path: str | None) -> tuple:
    results = doc["results"]
    top = max((max_step(r) for r in results), default=0)
    key = STORE.put(doc, size, top)
    drafted = [r for r in results if has_drafts(r)]
    choices = [r["strategy"] for r in drafted if inspectable_positions(r)]
    return (key, gr.update(minimum=0, maximum=max(top, 1), value=top),
            columns_html(results, top), speed_chart(results) if results else None,
            forward_timeline(results) if results else None, source_counts(results) if results else None,
            trace_path, message, accepted_length_histogram(drafted) if drafted else None,
            gr.update(choices=choices, value=choices[0] if choices else None), _heatmap(results),
            lookahead_view(doc, top), next((lookahead_figure(r) for r in results if has_steps(r)), None),
            time_breakdown(results) if results else None,
            leviathan_chart(results) if any(has_prediction(r) for r in results) else None)


def _unchanged(message: str) -> tuple:
    """The run outputs left as they are, with a new status line (index 7)."""
    return (gr.skip(),) * 7 + (message,) + (gr.skip(),) * 7


def _held(key: Any) -> tuple[dict | None, int]:
    """(document, top replay step) of this session's trace; (None, 0) when there is none or it expired."""
    return STORE.get(key) or (None, 0)


def _step(step: Any, top: int) -> int:
    ok = isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step)
    return min(max(int(step), 0), top) if ok else 0


def lookahead_view(doc: dict | None, step: int | None) -> str:
    """The lookahead window and verification branch at the replay step (first lookahead column)."""
    result = next((r for r in (doc or {}).get("results", []) if has_steps(r)), None)
    if result is None:
        return "<div class='dp-la'>Run the lookahead strategy to see its 2D window and verified n-grams.</div>"
    return lookahead_step_html(result, step)


@gpu
def run_playground(model: str, assistant: str, strategies: list[str], prompt: str, chat: bool,
                   max_new_tokens: float, seed: float, params: dict,
                   progress: gr.Progress = gr.Progress(), request: gr.Request = None) -> tuple:
    """Run the selected strategies side by side; returns the replay outputs."""
    with job(request) as stop:
        if stop.is_set():
            return _unchanged("Stopped before the run started.")
        try:
            plan = build_plan(strategies, params or {})
            prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), progress)
        except (ValueError, ModelLoadError) as exc:
            raise _error(exc) from None
        total = len(plan) + (0 if any(n == "greedy" for n, _ in plan) else 1)
        max_new = prep.max_new

        def on_progress(index: int, name: str, done: int) -> None:
            progress((index + done / max_new) / total, desc=f"{name}: {done}/{max_new} tokens")

        results = run_comparison(prep.prompt_ids, prep.pair, plan, max_new_tokens=max_new, seed=prep.seed,
                                 on_progress=on_progress, should_stop=stop.is_set,
                                 time_limit_s=LIMITS["time_limit_s"])
    rows = [r.to_dict() for r in results]
    for row in rows:
        row["error"] = row["error"] and redact_paths(row["error"])
    doc = {"environment": redact_all(environment(prep.pair, prep.seed)), "prompt": prompt, "chat": chat,
           "prompt_ids": prep.prompt_ids, "max_new_tokens": max_new, "results": rows}
    failed = [r for r in rows if r["error"]]
    message = f"Ran {len(rows)} strategies on {prep.model}{prep.note}."
    if failed:
        message += " " + "; ".join(f"{r['strategy']}: {r['error']}" for r in failed)
    text = export_trace(doc)
    return _outputs(doc, message, len(text), TRACE_FILES.write(text))


@gpu
def run_sweep(model: str, assistant: str, prompt: str, chat: bool, max_new_tokens: float, seed: float,
              strategy: str, spec: str, progress: gr.Progress = gr.Progress(), request: gr.Request = None) -> tuple:
    """Run one strategy over a parameter grid against one greedy reference; returns (figure, message)."""
    with job(request) as stop:
        if stop.is_set():
            return gr.skip(), "Stopped before the sweep started."
        try:
            keys, combos, plan = parse_sweep_spec(strategy, spec)
            prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), progress)
        except (ValueError, ModelLoadError) as exc:
            raise _error(exc) from None

        def on_progress(index: int, name: str, done: int) -> None:
            progress((index + done / prep.max_new) / (len(plan) + 1), desc=f"sweep point {index}: {done} tokens")

        results = run_comparison(prep.prompt_ids, prep.pair, plan, max_new_tokens=prep.max_new, seed=prep.seed,
                                 on_progress=on_progress, should_stop=stop.is_set,
                                 time_limit_s=LIMITS["time_limit_s"])
    runs = [r for r in results if not r.reference]
    points = [{"values": [sweep_value(v) for v in combo], "speedup": r.speedup or 0.0,
               "tokens_per_target_forward": round(len(r.token_ids) / max(r.target_forwards, 1), 3)}
              for combo, r in zip(combos, runs) if not r.error]
    errors = [f"{dict(zip(keys, c))}: {redact_paths(r.error)}" for c, r in zip(combos, runs) if r.error]
    message = f"Swept {len(points)} settings of {strategy} on {prep.model}{prep.note}."
    if errors:
        message += " Failed: " + "; ".join(errors)
    return sweep_figure({"strategy": strategy, "keys": keys, "points": points}), message


def advance(key: Any, step: Any) -> tuple:
    """One tick of the play button: the next replay step, stopping the timer at the end."""
    _, top = _held(key)
    nxt = _step(step, top) + 1
    if nxt >= top:
        return top, gr.Timer(active=False)
    return nxt, gr.Timer(active=True)


def play(key: Any, step: Any) -> tuple:
    """Start playing from the current step (from 0 when at the end)."""
    _, top = _held(key)
    start = _step(step, top)
    return (0 if start >= top else start), gr.Timer(active=top > 0)


def replay(key: Any, step: Any) -> tuple[str, str]:
    """The columns and the lookahead view at one replay step (bounded: see visualize.tokens.MAX_FRAME_ITEMS)."""
    doc, top = _held(key)
    if doc is None:
        return (EXPIRED if key else columns_html([])), lookahead_view(None, None)
    at = _step(step, top)
    return columns_html(doc["results"], at), lookahead_view(doc, at)


def inspect_position(key: Any, strategy: Any, position: Any) -> Any:
    doc, _ = _held(key)
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


def import_file(path: Any, request: gr.Request = None) -> tuple:
    """Replay an uploaded trace (no model needed). The file is not exported again: its owner has it."""
    with job(request):
        if not isinstance(path, str) or not path:
            raise gr.Error("trace: choose a JSON file exported from this app")
        limit = LIMITS["upload_bytes"]
        try:
            size = os.path.getsize(path)
            if size > limit:   # Gradio refuses larger uploads; this guards direct calls
                raise ValueError(f"trace file is {size / 2**20:.1f} MB; the limit is {limit / 2**20:g} MB")
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
            doc = import_trace(data, max_bytes=limit)
        except (OSError, ValueError) as exc:
            raise _error(exc, "trace: ") from None
    return _outputs(doc, f"Imported a trace with {len(doc['results'])} strategies (no model needed).",
                    len(data), None)


# --------------------------------------------------------------------------- layout
class Playground(gr.Blocks):
    """The app's Blocks: ``launch`` caps uploads and request bodies unless told otherwise."""

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("max_file_size", LIMITS["upload_bytes"])
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        # uploads get the file limit plus room for the multipart wrapping; everything else a small one
        limit = Middleware(BodyLimit, default=LIMITS["request_bytes"],
                           larger={"/upload": LIMITS["upload_bytes"] + 2**20})
        app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), limit]
        return super().launch(*args, app_kwargs=app_kwargs, **kwargs)


def build_demo() -> gr.Blocks:
    presets = load_presets()
    reg = registry()
    prompts = example_prompts()
    with Playground(title="Decoding Playground", delete_cache=LIMITS["cache_cleanup_s"]) as demo:
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
        state = gr.State(None)          # a key into STORE, never the document itself
        cancel_queued = gr.Number(visible=False)
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

        # Runs and sweeps share one worker (one model in memory at a time); each job is admitted
        # (a Stop ticket, a bounded number per session) before it waits in the queue. Their inputs
        # reach decoding/service.py as sent (preprocess=False), so it names every bad field itself.
        heavy = dict(concurrency_id="generate", concurrency_limit=1, validator=admit, preprocess=False)
        run_event = run_btn.click(_run, [model, assistant, strategies, prompt, chat, max_new, seed,
                                         *param_inputs.values()], outputs, api_name="run", **heavy)
        sweep_event = sweep_btn.click(run_sweep, [model, assistant, prompt, chat, max_new, seed, sweep_strategy,
                                                  sweep_spec], [sweep_plot, sweep_status], api_name="sweep", **heavy)
        # Stop sets this session's flags (a running job keeps its partial trace); a job still waiting in
        # the queue is also taken out of it, through the hidden value's change and Gradio's cancels=.
        stop_btn.click(stop_run, None, [status, cancel_queued], api_name="stop", queue=False)
        cancel_queued.change(None, None, None, cancels=[run_event, sweep_event])
        # unqueued handlers do bounded work (a replay frame draws at most MAX_FRAME_ITEMS tokens) and
        # clamp their raw inputs themselves
        light = dict(queue=False, preprocess=False)
        step.change(replay, [state, step], [columns, window], api_name="replay", **light)
        play_btn.click(play, [state, step], [step, ticker], **light)
        ticker.tick(advance, [state, step], [step, ticker], **light)
        upload.upload(import_file, upload, outputs, api_name="import_trace", concurrency_id="import",
                      concurrency_limit=1, validator=admit)
        sweep_strategy.change(lambda n: SWEEP_DEFAULTS.get(n, ""), sweep_strategy, sweep_spec, queue=False)
        for trigger in (inspect_strategy.change, inspect_pos.change):
            trigger(inspect_position, [state, inspect_strategy, inspect_pos], inspect_plot, **light)
        category.change(lambda c: gr.update(choices=prompts.get(c, []), value=(prompts.get(c) or [""])[0]),
                        category, example, queue=False)
        example.change(lambda e: e, example, prompt, queue=False)
        demo.run_event = run_event
    demo.queue(default_concurrency_limit=1, max_size=LIMITS["queue_size"])
    return demo


def main() -> None:
    ap = argparse.ArgumentParser(description="Decoding Playground web app")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--allow-any-model", action="store_true",
                    help="accept any Hugging Face Hub id in the model pickers (default: presets only)")
    ap.add_argument("--memory-budget-gb", type=float,
                    default=os.environ.get(MEMORY_BUDGET_ENV, str(DEFAULT_MEMORY_BUDGET_GB)),
                    help=f"evict least recently used models beyond this much memory (default "
                         f"{DEFAULT_MEMORY_BUDGET_GB:g}, or ${MEMORY_BUDGET_ENV}; 0 = no cap)")
    args = ap.parse_args()
    SETTINGS["allow_any_model"] = args.allow_any_model
    set_memory_budget(args.memory_budget_gb or None)
    build_demo().launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
