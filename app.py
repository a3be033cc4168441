"""Decoding Playground: the Gradio app. The page and its wiring, by name, only: one app object owns every store
(web/playground.py), what each event does is in web/handlers.py (thin functions of that object), runs, sweeps and the
example recordings in web/compute.py, the /race endpoint for code in web/api.py, requests are validated, run and bounded in
web/validation.py, web/requests.py and web/guards.py, every override of Gradio's internals is in web/gradio_overrides.py,
decoding lives in decoding/, views in visualize/ (visualize/page.py says which view shows what).

    python app.py [--host 127.0.0.1] [--port 7860] [--allow-any-model] [--memory-budget-gb G]

Host and port: ``--host``/``--port`` when given, else ``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``
(what Hugging Face Spaces sets), else 127.0.0.1:7860.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import os
import threading
from typing import Any, Optional

import gradio as gr
import yaml
from starlette.middleware import Middleware

from decoding.harness.document import GENERATION_LABELS
from decoding.processors import GenerationSettings
from decoding.runtime.models import (DEFAULT_MEMORY_BUDGET_GB, budget_bytes, load_presets,
                                     runs_here)
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from visualize.guide import HOW_TO_READ
from visualize.race import SPEEDS
from visualize.tokens import columns_html
from web import gradio_overrides
from web.api import race_endpoint
from web.guards import BodyLimit
from web.playground import PlaygroundApp
from web.compute import record_examples
from web.handlers import export_race as export_animation, open_shared   # issue 40: share links, exports
from web.share import QUERY, share_views
from web.startup import Startup, routes_file
from web.handlers import (
    admit,
    clear_history,
    import_file,
    import_views,
    run_playground,
    run_sweep,
    stop_run,
)
from web.playback import (
    advance,
    autoplay,
    inspect_position,
    play,
    race_at,
    race_play,
    race_rebase,
    race_tick,
    replay,
    replay_figures,
)
from web.validation import GENERATION_FIELDS, SWEEP_DEFAULTS, check_model_name, field_kind, param_fields
from web.limits import DEFAULT_LIMITS
from web.loading import preload_default
from web.requests import DEFAULT_MAX_NEW, ui_default
from web.page_names import (RUN_VIEWS, STEP_FIGURES, STEP_VIEWS, SWEEP_INPUTS, generation_input, param_input,
                            run_inputs)
from web.settings import DEFAULT_SETTINGS, Settings, recordings_folder

PROMPTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "prompts.yaml")
MEMORY_BUDGET_ENV = "DECODING_MEMORY_BUDGET_GB"
RACE_TICK_S = 0.1     # the wall-clock replay's frame interval
PAGE_CSS = (".dp-help{color:#57606a;font-size:.9em;margin:0 0 -6px}.dp-help p{margin:2px 0}"
            ".dp-clock{padding:6px 0;font-size:.95em}#columns{min-height:120px}"
            ".dp-drafts table,.dp-drafts td{font-size:12px}.dp-la,.dp-xt,.dp-drafts{overflow-x:auto}"
            "#strategies-note{margin-bottom:10px}")

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


def example_prompts() -> dict[str, list[str]]:
    with open(PROMPTS_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


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
               ("jacobi", "block_size"): "0 = auto (from this machine's measured forward cost)"}


# --------------------------------------------------------------------------- layout
class Playground(gradio_overrides.GuardedBlocks):
    """The app's Blocks: ``launch`` caps uploads and request bodies unless told otherwise, puts this app's
    overrides of Gradio's internals on (``web/gradio_overrides.py``: cached-file sets safe for Gradio's cleaner,
    frames that cost what they change, a queue that stays alive) and answers ``GET /healthz``."""

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        limits = self.playground.limits if hasattr(self, "playground") else DEFAULT_LIMITS
        if hasattr(self, "playground"):     # exports are served from their bounded folder, never copied to Gradio's
            gr.set_static_paths([self.playground.exports.directory])
        kwargs.setdefault("max_file_size", limits.upload_bytes)
        kwargs.setdefault("state_session_capacity", limits.sessions)     # sessions' state: bounded (issue 39)
        kwargs.setdefault("css", PAGE_CSS)
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        # uploads get the file limit plus room for the multipart wrapping; everything else a small one
        limit = Middleware(BodyLimit, default=limits.request_bytes,
                           larger={"/upload": limits.upload_bytes + 2**20})
        # the queue keeps every waiting client's session and restarts if it stops; GET /healthz says how it is
        # (web/queue_guard.py: issue 25 item 4)
        gradio_overrides.install(self)
        health = Middleware(gradio_overrides.Health, blocks=self)
        app_kwargs["middleware"] = [health, *app_kwargs.get("middleware", []), limit]
        return super().launch(*args, app_kwargs=app_kwargs, **kwargs)


def _help(name: str) -> None:
    gr.Markdown(HOW_TO_READ[name], elem_classes=["dp-help"])


def _plot_pair(ui: "Views", *plots: tuple[str, dict]) -> None:
    """Plots side by side, each under its how-to-read line: ``(view name, gr.Plot keyword arguments)``."""
    with gr.Row():
        for name, kwargs in plots:
            with gr.Column():
                _help(name)
                ui[name] = gr.Plot(**kwargs)


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


def _race(ui: Views) -> None:
    """The race: the columns and both replays (steps, wall clock)."""
    ui["status"] = gr.Markdown("", elem_id="status")
    _help("race")
    ui["columns"] = gr.HTML(columns_html([]), elem_id="columns")
    with gr.Row(equal_height=True):
        ui["step"] = gr.Slider(0, 1, value=0, step=1, label="Replay step (target forward passes)", scale=6)
        ui["play"] = gr.Button("▶ Play steps", scale=1, min_width=110)
    with gr.Row(equal_height=True):
        ui["clock"] = gr.Slider(0, 1, value=0, step=1, label="Replay clock (ms of each strategy's own run)",
                                scale=4, elem_id="race-clock")
        ui["race_speed"] = gr.Dropdown([(f"{s:g}×", s) for s in SPEEDS], value=1.0, label="Speed", scale=1,
                                       min_width=90, elem_id="race-speed")
        ui["race"] = gr.Button("▶ Play in real time", scale=1, min_width=150, elem_id="race-play")
    ui["clock_readout"] = gr.HTML("", elem_id="race-readout")


def _share(ui: Views) -> None:
    """Under the race: its Share link, and its export as an animation (GIF or MP4)."""
    ui["share"] = gr.HTML("", elem_id="share")
    ui["race_id"] = gr.Textbox("", visible=False, label="race_id", elem_id="race-id")   # what the export reads
    with gr.Row(equal_height=True):
        ui["export_format"] = gr.Radio([("GIF", "gif"), ("MP4", "mp4")], value="gif", label="Animation format",
                                       scale=1, elem_id="export-format")
        ui["export_mode"] = gr.Radio([("real time", "time"), ("target forward passes", "steps")], value="time",
                                     label="Replay by", scale=2, elem_id="export-mode")
        ui["export_btn"] = gr.Button("Export the race as an animation", scale=1, elem_id="export-btn")
        ui["export_file"] = gr.File(label="Animation", scale=2, elem_id="export-file")


def _admitter(state: PlaygroundApp):
    """The queue validator of ``state``'s runs, sweeps, imports and exports: a Stop ticket, a few per session."""
    def _admit(request: gr.Request, *values):           # Gradio passes the request by its annotation
        return admit(state, request, *values)
    return _admit


def _wire_share(ui: Views, demo: gr.Blocks, state: PlaygroundApp) -> None:
    """Share links and exports (issue 40): ``?race=<id>`` opens that race when the page loads; an import clears
    the previous race's link (a Run clears it: wired in build_demo before the Run, since an unqueued event wired
    after it waits for it); the export waits in the app's compute line like a run."""
    outputs, light = ui.list(RUN_VIEWS), dict(queue=False, show_progress="hidden", api_visibility="private")

    def _open(request: gr.Request):
        values = open_shared(state, dict(getattr(request, "query_params", None) or {}).get(QUERY))
        return ui.pack(values or {"share": gr.skip()})       # no ?race=: the page as it is

    demo.load(_open, None, outputs, **light)
    cleared = ui.list(("share", "race_id"))
    ui["upload"].upload(lambda: ui.pack(share_views(None)), None, cleared, **light)

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
                           api_name="export_race", validator=_admitter(state), preprocess=False, concurrency_id="generate",
                           concurrency_limit=state.limits.line_capacity)


def _tabs(ui: Views) -> None:
    """The views, one tab per question."""
    with gr.Tabs():
        with gr.Tab("Speed", elem_id="tab-speed"):
            _plot_pair(ui, ("speed", dict(label="Speed", elem_id="speed-chart")),
                       ("sources", dict(label="Token sources")))
            _help("timeline")
            ui["timeline"] = gr.Plot(label="Forward passes")
            _plot_pair(ui, ("breakdown", dict(label="Why (no) speedup")),
                       ("leviathan", dict(label="Predicted vs measured speedup")))
        with gr.Tab("Drafts", elem_id="tab-drafts"):
            with gr.Row():
                ui["inspect_strategy"] = gr.Dropdown([], label="Strategy (inspector and draft tree)")
                ui["inspect_pos"] = gr.Number(value=1, step=1, label="Output position (inspector)")
            _plot_pair(ui, ("histogram", dict(label="Accepted length per step")),
                       ("inspector", dict(label="p_target vs q_draft")))
            _help("tree")
            ui["tree"] = gr.Plot(label="Draft tree at the replay step", elem_id="draft-tree")
            _help("drafts")
            ui["drafts"] = gr.HTML("", elem_id="draft-sources")
            _help("crosstok")
            ui["crosstok"] = gr.HTML("", elem_id="crosstok")
        with gr.Tab("Jacobi & lookahead", elem_id="tab-jacobi"):
            _help("jacobi")
            ui["jacobi"] = gr.HTML("", elem_id="jacobi-view")
            _help("lookahead_window")
            ui["lookahead_window"] = gr.HTML("", elem_id="lookahead-window")
            _plot_pair(ui, ("lookahead_mask", dict(label="Lookahead attention mask", elem_id="lookahead-mask")),
                       ("lookahead_chart", dict(label="Lookahead: tokens per target forward")))
        with gr.Tab("Beam & sampling", elem_id="tab-beam"):
            _help("beam")
            ui["beam"] = gr.Plot(label="Beam search", elem_id="beam-tree")
            _help("sampling")
            ui["sampling"] = gr.Plot(label="Sampling filters", elem_id="sampling-view")
        with gr.Tab("Sweep", elem_id="tab-sweep"):
            _help("sweep")
            with gr.Row():
                ui["sweep_strategy"] = gr.Dropdown(list(SWEEP_DEFAULTS), value="lookahead", label="Sweep strategy")
                ui["sweep_spec"] = gr.Textbox(SWEEP_DEFAULTS["lookahead"], label="Values (KEY=V1,V2[;KEY=V1,V2])")
                ui["sweep_btn"] = gr.Button("Run sweep")
            ui["sweep_status"] = gr.Markdown("")
            ui["sweep_plot"] = gr.Plot(label="Sweep")
        with gr.Tab("Trace", elem_id="tab-trace"):
            _help("trace")
            with gr.Row():
                ui["download"] = gr.File(label="Trace (JSON download)", elem_id="trace-download")
                ui["upload"] = gr.File(label="Import a trace to replay it without a model", file_types=[".json"],
                                       type="filepath", elem_id="trace-upload")


_REDUCED = {"fp16": "float16", "bf16": "bfloat16", "int8": "int8"}


def target_choices(presets: dict) -> list:
    """The target picker's entries: the presets that can load on this machine; a reduced-weight preset says
    that it is its own reference (BENCHMARKS.md, "Float16 weights", "Bfloat16 weights on AMX")."""
    return [(f"{name} ({_REDUCED[p.weights]} weights: checked against its own greedy)", name)
            if p.weights in _REDUCED else name for name, p in presets.items() if runs_here(p)]


@dataclasses.dataclass(frozen=True)
class ModelRace:
    """A one-click example: ``strategy`` on ``model`` against the same on ``versus``, a preset trained from it to
    speed that strategy up (``trained_for``: a consistency-trained model for Jacobi)."""
    model: str
    versus: str
    strategy: str
    params: tuple = ()        # ((field, value), ...) of ``strategy`` the trained model was trained for

    @property
    def title(self) -> str:
        what = "consistency-trained" if self.strategy == "jacobi" else f"trained for {self.strategy}"
        label = registry()[self.strategy].label or self.strategy
        return f"Example: {label} on {self.model} vs {label} on {self.versus} ({what})"


def model_races(presets: dict) -> list[ModelRace]:
    """The one-click races the page offers: each preset with ``trained_for`` a known strategy and valid
    ``trained_params`` for it, whose base and it both load on this machine."""
    reg, races = registry(), []
    for name, p in presets.items():
        if p.trained_for not in reg or p.base not in presets or not (runs_here(p) and runs_here(presets[p.base])):
            continue
        try:
            params = dict(p.trained_params or {})
            reg[p.trained_for].parse(params)
        except (ValueError, TypeError) as exc:     # a preset's mistake: no button, and the log says why
            print(f"preset {name}: trained_params for {p.trained_for} ignored ({exc}); no race example")
            continue
        races.append(ModelRace(p.base, name, p.trained_for, tuple(sorted(params.items()))))
    return races


# clicks the Run button once the form shows the example's values: the example is the visitor's own Run
CLICK_RUN = "() => { document.querySelector('#run').click(); }"


def _wire_model_race(race: ModelRace, button: Any, inputs: Inputs) -> None:
    """The example button: the form set to the race (its two models, its one strategy and the parameters the
    trained model was trained for), then a click on Run, so the race is the request a visitor's Run sends (same
    checks, line, recording, views and autoplay)."""
    fields = ("model", "versus", "assistant", "strategies", *(param_input(race.strategy, f) for f, _ in race.params))
    values = (race.model, race.versus, "none", [race.strategy], *(v for _, v in race.params))
    button.click(lambda: values, None, inputs.list(fields), queue=False,
                 api_visibility="private").then(None, js=CLICK_RUN, api_visibility="private")


def build_demo(settings: Settings = DEFAULT_SETTINGS, run_order: Optional[tuple] = None,
               state: Optional[PlaygroundApp] = None) -> gr.Blocks:
    """The page of one app: ``state`` owns its stores (default: a new :class:`PlaygroundApp` with ``settings``,
    what the operator chose at start, which reach every run and sweep); it is ``demo.playground``. ``run_order``: the
    order /run takes its inputs in, by name (default :func:`run_inputs`; the tests move one)."""
    state = PlaygroundApp(settings) if state is None else state
    settings = state.settings
    run_order = tuple(run_inputs() if run_order is None else run_order)
    if sorted(run_order) != sorted(run_inputs()):
        raise ValueError("run_order must name each of the run's inputs (app.run_inputs()) once")
    presets = load_presets()
    reg = registry()
    prompts = example_prompts()
    ui = Views()
    with Playground(title="Decoding Playground", delete_cache=settings.limits.cache_cleanup_s) as demo:
        gr.Markdown("# Decoding Playground\nRun decoding strategies on the same prompt, watch them race, then "
                    "replay them token by token (by target forward passes or by wall-clock time).")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=3, value=prompts["chat"][0])
                with gr.Row():
                    category = gr.Dropdown(list(prompts), value="chat", label="Example category")
                    example = gr.Dropdown(prompts["chat"], value=prompts["chat"][0], label="Example prompt",
                                          allow_custom_value=True)
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
                target_note = gr.Markdown(html.escape(settings.target_note), elem_id="target-note",
                                          elem_classes=["dp-help"], visible=bool(settings.target_note))
                compiled_note = gr.Markdown(html.escape(settings.compiled_note), elem_id="compiled-note",
                                            elem_classes=["dp-help"], visible=bool(settings.compiled_note))
                with gr.Row():
                    chat = gr.Checkbox(value=True, label="Chat template", min_width=100)
                    seed = gr.Number(value=0, step=1, label="Seed", min_width=80)
                    max_new = gr.Number(value=DEFAULT_MAX_NEW, step=1, label=f"max_new_tokens (1–{settings.limits.max_new_tokens})",
                                        min_width=120)
        strategies = gr.CheckboxGroup([(s.label or s.name, s.name) for s in reg.values()],
                                      value=[n for n in settings.strategies if n in reg],
                                      label="Strategies (greedy is always run as the reference)")
        # default strategies left out on this machine, and why (its measured curve)
        strategies_note = gr.Markdown(_strategies_note(settings), elem_id="strategies-note", elem_classes=["dp-help"],
                                      visible=bool(settings.strategies_note))
        races = model_races(presets)
        if races:          # one click: a trained model against its base, on the strategy it was trained for
            with gr.Row(elem_id="model-races"):
                race_btns = {(race.model, race.versus): gr.Button(race.title, size="sm", elem_classes=["dp-example"])
                             for race in races}
        with gr.Row():
            run_btn = gr.Button("Run", variant="primary", scale=2, elem_id="run")
            stop_btn = gr.Button("Stop", variant="stop", scale=1)
            clear_btn = gr.Button("Clear history", scale=1, elem_id="clear-history")
        inputs = Inputs(model=model, assistant=assistant, strategies=strategies, prompt=prompt, chat=chat,
                        max_new_tokens=max_new, seed=seed, versus=versus)
        with gr.Row():
            with gr.Column():
                inputs.update({param_input(s, f): c for (s, f), c in _param_inputs(reg, settings).items()})
            with gr.Column():
                inputs.update({generation_input(n): c for n, c in _generation_inputs().items()})
        _race(ui)
        _share(ui)
        _tabs(ui)
        inputs.update(sweep_strategy=ui["sweep_strategy"], sweep_spec=ui["sweep_spec"])
        ui["key"] = gr.State(None)              # a key into the app's trace store, never the document itself
        ui["race_anchor"] = gr.State(None)      # where the wall-clock replay started: {"wall", "from"}
        ui["playing"] = gr.State(None)          # which replay plays now: "steps", "race" or None
        ui["ticker"] = gr.Timer(0.4, active=False)
        ui["race_ticker"] = gr.Timer(RACE_TICK_S, active=False)
        cancel_queued = gr.Number(visible=False)
        run_btn.click(lambda: ui.pack({"share": "", "race_id": ""}), None, ui.list(("share", "race_id")),
                      queue=False, show_progress="hidden", api_visibility="private")   # issue 40: a Run clears the link
        _wire(ui, demo, prompts, inputs, run_order, dict(category=category, example=example, prompt=prompt,
                                                         run=run_btn, stop=stop_btn, clear=clear_btn,
                                                         cancel_queued=cancel_queued), state)
        for race in races:
            _wire_model_race(race, race_btns[(race.model, race.versus)], inputs)
        _wire_share(ui, demo, state)
        _wire_start(demo, state, settings, dict(model=model, assistant=assistant, strategies=strategies,
                                                target_note=target_note, compiled_note=compiled_note,
                                                strategies_note=strategies_note),
                    {s: c for (s, f), c in inputs_fast(inputs).items()})
    demo.playground = state
    # Gradio's queue holds every waiting handler; runs and sweeps wait in our own line (the app's line) for the
    # compute slot, so a visitor sees their place in it, and identical runs share one computation
    demo.queue(default_concurrency_limit=1, max_size=state.limits.line_capacity)
    return demo


def _strategies_note(settings: Settings) -> str:
    if not settings.strategies_note:
        return ""
    return "Not ticked by default here (each stays one click away):\n\n" + "\n".join(
        f"- {html.escape(line)}" for line in settings.strategies_note.splitlines())


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
    views = {"target_note": gr.update(value=html.escape(settings.target_note), visible=bool(settings.target_note)),
             "compiled_note": gr.update(value=html.escape(settings.compiled_note),
                                        visible=bool(settings.compiled_note)),
             "strategies_note": gr.update(value=_strategies_note(settings), visible=bool(settings.strategies_note))}
    if (target, settings.strategies, settings.compiled) != (built.default_target(), built.strategies, built.compiled):
        views.update(model=target, assistant=PROPHET if has_prophet(target) else "none",
                     strategies=[n for n in settings.strategies if n in registry()])
        views.update({("fast", s): ui_default(s, "fast", settings) for s, f in param_fields() if f == "fast"})
    return views


def _wire_start(demo: gr.Blocks, state: PlaygroundApp, built: Settings, views: dict, fast: dict) -> None:
    """A page opened after the start's choices were made shows them (``start_views``); one opened before them
    has its notes updated by a timer until the start is done (its form is the visitor's by then)."""
    components = {**views, **{("fast", s): c for s, c in fast.items()}}
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

    light = dict(queue=False, show_progress="hidden", api_visibility="private")
    demo.load(_load, None, [components[n] for n in names], **light)
    ticker.tick(_tick, None, [components[n] for n in notes] + [ticker], **light)


def _wire(ui: Views, demo: gr.Blocks, prompts: dict, inputs: Inputs, run_order: tuple, c: dict,
          state: PlaygroundApp) -> None:
    """Every event: runs and sweeps share one queued worker; replays are unqueued and bounded. Handlers are
    functions of ``state`` (the app object) and take their inputs by name (``inputs``), never by position."""
    outputs = ui.list(RUN_VIEWS)
    params = param_fields()
    _admit = _admitter(state)

    # Gradio injects request and progress only into positional parameters before *values
    async def _run(request: gr.Request, progress=gr.Progress(), *values):
        v = Inputs.named(run_order, values)
        async for item in run_playground(
                state, model=v["model"], assistant=v["assistant"], strategies=v["strategies"], prompt=v["prompt"],
                chat=v["chat"], max_new_tokens=v["max_new_tokens"], seed=v["seed"], versus=v["versus"],
                params={(s, f): v[param_input(s, f)] for s, f in params},
                generation=[v[generation_input(name)] for name in GENERATION_FIELDS],
                progress=progress, request=request):
            yield ui.pack(item)

    async def _sweep(request: gr.Request, progress=gr.Progress(), *values):
        v = Inputs.named(SWEEP_INPUTS, values)
        async for item in run_sweep(
                state, model=v["model"], assistant=v["assistant"], prompt=v["prompt"], chat=v["chat"],
                max_new_tokens=v["max_new_tokens"], seed=v["seed"], strategy=v["sweep_strategy"],
                spec=v["sweep_spec"], progress=progress, request=request):
            yield item

    def _import(path, request: gr.Request = None):   # streamed: the first views, then the token columns
        for item in import_views(state, path, request=request):
            yield ui.pack(item)

    def _stop(request: gr.Request = None):
        return stop_run(state, request)

    def _clear(request: gr.Request = None):
        return clear_history(state, request)

    # The API page shows one endpoint, /race (web/api.py): named parameters, the CLI's JSON back. The page's own
    # events are left off it: those named here stay callable by name (scripts, tests, a client's Stop), the
    # rest are the page's alone (their parameters are the page's components, in the page's order).
    named, page = dict(api_visibility="undocumented"), dict(api_visibility="private")
    # Runs and sweeps are admitted (a Stop ticket, a bounded number per session) before they wait. Their
    # handlers only watch: the compute runs in the app line's slot (one on a CPU), where every run and sweep
    # waits its turn and sees its place; so many handlers may wait at once without holding a thread. Their
    # inputs reach web/validation.py as sent (preprocess=False), so it names every bad field itself.
    line = dict(concurrency_id="generate", concurrency_limit=state.limits.line_capacity)
    heavy = dict(line, validator=_admit, preprocess=False, **named)
    run_event = c["run"].click(_run, inputs.list(run_order), outputs, api_name="run", show_progress="minimal",
                               show_progress_on=[ui["status"]], **heavy)
    sweep_event = ui["sweep_btn"].click(_sweep, inputs.list(SWEEP_INPUTS), [ui["sweep_plot"], ui["sweep_status"]],
                                        api_name="sweep", **heavy)
    gradio_overrides.api_endpoint(race_endpoint(state), api_name="race", validator=_admit, **line)
    # Stop sets this session's flags (a running job keeps its partial trace); a job still waiting in
    # the queue is also taken out of it, through the hidden value's change and Gradio's cancels=.
    # concurrency_limit=None: Stops sent through the API (/call/stop) are queued by Gradio even with queue=False;
    # without it they would wait one at a time and a Stop storm would fill the queue that Runs need
    c["stop"].click(_stop, None, [ui["status"], c["cancel_queued"]], api_name="stop", queue=False,
                    concurrency_limit=None, **named)
    c["cancel_queued"].change(None, None, None, cancels=[run_event, sweep_event], **page)
    c["clear"].click(_clear, None, ui["status"], api_name="clear_history", queue=False,
                     concurrency_limit=None, **named)
    # unqueued handlers do bounded work (a replay frame draws at most MAX_FRAME_ITEMS tokens) and
    # clamp their raw inputs themselves; they show no progress: Gradio would dim the columns and put a
    # timer on them while each frame (ten a second in the wall-clock replay) is in flight
    light = dict(queue=False, preprocess=False, show_progress="hidden")
    step_views, step_figs = ui.list(STEP_VIEWS), ui.list(STEP_FIGURES)
    # "playing" names who owns the columns: the wall-clock race keeps them after it ends (a step change
    # left over from the step replay, delivered late on a busy server, must not redraw them); the
    # visitor moving the step slider, or ▶ Play steps, gives them back to the step replay
    def _replay(k, s, p=None):
        values = replay(state, k, s)
        if p == "race":
            values.pop("columns")
        return ui.pack(values)
    ui["step"].change(_replay, [ui["key"], ui["step"], ui["playing"]], step_views, api_name="replay", **light,
                      **named)
    ui["step"].input(lambda k, s: ui.pack({**replay(state, k, s), "playing": None}), [ui["key"], ui["step"]],
                     [*step_views, ui["playing"]], **light, **page)
    ui["step"].change(lambda k, s, n: ui.pack(replay_figures(state, k, s, n)),
                      [ui["key"], ui["step"], ui["inspect_strategy"]], step_figs, api_name="replay_figures",
                      trigger_mode="always_last", **light, **named)
    # one replay plays at a time (both redraw the columns): each play button stops the other's timer and
    # names itself in "playing", and a tick of the other replay (one already in flight) stops its timer
    ui["play"].click(lambda k, s: (*play(state, k, s), gr.Timer(active=False), "steps"), [ui["key"], ui["step"]],
                     [ui["step"], ui["ticker"], ui["race_ticker"], ui["playing"]], **light, **page)
    ui["ticker"].tick(lambda k, s, p: advance(state, k, s) if p == "steps" else (gr.skip(), gr.Timer(active=False)),
                      [ui["key"], ui["step"], ui["playing"]], [ui["step"], ui["ticker"]], **light, **page)
    race_out = ui.list(("columns", "clock_readout"))
    ui["clock"].input(lambda k, t, v: ui.pack(race_at(state, k, t, v)), [ui["key"], ui["clock"], ui["race_speed"]],
                      race_out, api_name="race_at", trigger_mode="always_last", **light, **named)
    ui["race"].click(lambda k, t, v: ui.pack({**race_play(state, k, t, v), "ticker": gr.Timer(active=False),
                                              "playing": "race"}),
                     [ui["key"], ui["clock"], ui["race_speed"]],
                     ui.list(("race_anchor", "race_ticker", "columns", "clock_readout", "clock", "ticker",
                              "playing")), **light, **page)
    ui["race_ticker"].tick(lambda k, a, v, p: ui.pack(race_tick(state, k, a, v) if p == "race"
                                                      else {"race_ticker": gr.Timer(active=False)}),
                           [ui["key"], ui["race_anchor"], ui["race_speed"], ui["playing"]],
                           ui.list(("columns", "clock_readout", "clock", "race_ticker", "playing")), **light, **page)
    # a replayed run (a recording of the identical request) plays its race in real time at once
    run_event.then(lambda k, v: ui.pack(autoplay(state, k, v)), [ui["key"], ui["race_speed"]],
                   ui.list(("race_anchor", "race_ticker", "columns", "clock_readout", "clock", "ticker",
                            "playing")), **light, **page)
    ui["race_speed"].change(race_rebase, [ui["race_anchor"], ui["clock"]], ui["race_anchor"], **light, **page)
    ui["upload"].upload(_import, ui["upload"], outputs, api_name="import_trace", concurrency_id="import",
                        concurrency_limit=1, validator=_admit, **named)
    ui["sweep_strategy"].change(lambda n: SWEEP_DEFAULTS.get(n, ""), ui["sweep_strategy"], ui["sweep_spec"],
                                queue=False, **page)
    for trigger in (ui["inspect_strategy"].change, ui["inspect_pos"].change):
        trigger(lambda k, s, p: inspect_position(state, k, s, p), [ui["key"], ui["inspect_strategy"], ui["inspect_pos"]], ui["inspector"], **light,
                **page)
    ui["inspect_strategy"].change(lambda k, s, n: ui.pack({"tree": replay_figures(state, k, s, n)["tree"]}),
                                  [ui["key"], ui["step"], ui["inspect_strategy"]], ui.list(("tree",)), **light,
                                  **page)
    c["category"].change(lambda cat: gr.update(choices=prompts.get(cat, []), value=(prompts.get(cat) or [""])[0]),
                         c["category"], c["example"], queue=False, **page)
    c["example"].change(lambda e: e, c["example"], c["prompt"], queue=False, **page)
    demo.run_event, demo.ui, demo.inputs, demo.run_order = run_event, ui, inputs, run_order


def _warm_start(state: PlaygroundApp, preload: bool, record: bool) -> None:
    """In the background at start: load the default model (and its head), so the first Run does not wait
    for it; then record the default comparison of every example prompt while no visitor's run is waiting."""
    if preload:
        preload_default(state.settings)
    if record:
        record_examples(state, [p for group in example_prompts().values() for p in group])


def server_address(host: Optional[str], port: Optional[int], env: Optional[dict] = None) -> tuple[str, int]:
    """``--host``/``--port`` when given, else ``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``, else 127.0.0.1:7860."""
    env = os.environ if env is None else env
    host = host or env.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    if port is None:
        raw = env.get("GRADIO_SERVER_PORT")
        try:
            port = int(raw) if raw else 7860
        except ValueError:
            raise SystemExit(f"GRADIO_SERVER_PORT must be a port number, got {raw!r}") from None
    return host, port


def main() -> None:
    ap = argparse.ArgumentParser(description="Decoding Playground web app")
    ap.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    ap.add_argument("--port", type=int, default=None, help="default: $GRADIO_SERVER_PORT, else 7860")
    ap.add_argument("--allow-any-model", action="store_true",
                    help="accept any Hugging Face Hub id in the model pickers (default: presets only)")
    ap.add_argument("--memory-budget-gb", type=float,
                    default=os.environ.get(MEMORY_BUDGET_ENV, str(DEFAULT_MEMORY_BUDGET_GB)),
                    help=f"evict least recently used models beyond this much memory (default "
                         f"{DEFAULT_MEMORY_BUDGET_GB:g}, or ${MEMORY_BUDGET_ENV}; 0 = no cap)")
    ap.add_argument("--no-preload", action="store_true",
                    help="do not load the default model in the background at start")
    ap.add_argument("--no-record-examples", action="store_true",
                    help="do not record the example prompts' default comparison in the background at start")
    ap.add_argument("--no-compile", action="store_true",
                    help="keep the CPU forward eager (default: compile the default target's forward at start, "
                         "cached on disk; also DECODING_COMPILE=0)")
    ap.add_argument("--target", default=None,
                    help="the page's default target model (default: the version of presets/models.yaml's default "
                         "that measures fastest on this CPU, timed at the first start and cached)")
    ap.add_argument("--recordings-dir", default=None,
                    help="keep recorded runs across restarts in a folder per code version, machine and library "
                         "versions under DIR (default: under /data where a Space has persistent storage, else under "
                         "~/.cache; 'none' keeps them in memory only)")
    args = ap.parse_args()
    try:
        budget_bytes(args.memory_budget_gb or None)
    except ValueError as exc:
        ap.error(f"--memory-budget-gb: {exc}")
    settings = Settings(allow_any_model=args.allow_any_model, memory_budget_gb=args.memory_budget_gb or None,
                        quiet_recordings=True)
    if args.target:
        try:
            check_model_name(args.target, "--target", load_presets(), args.allow_any_model)
        except ValueError as exc:
            ap.error(str(exc))
        settings = dataclasses.replace(settings, target=args.target)
    host, port = server_address(args.host, args.port)
    state = PlaygroundApp.create(settings, recordings_folder(args.recordings_dir))
    # the page first; the start's choices (version x mode timed as the race runs them, the compiled forward, the
    # default comparison) behind it, then the preload and the example recordings (web/startup.py)
    log = lambda msg: print(f"[app] {msg}", flush=True)      # noqa: E731
    state.startup = Startup(state, compile=not args.no_compile,
                            pinned=args.target, file=routes_file(), log=log)
    state.startup.start(then=lambda: _warm_start(state, not args.no_preload, not args.no_record_examples))
    build_demo(state=state).launch(server_name=host, server_port=port)


if __name__ == "__main__":
    main()
