"""Decoding Playground: the Gradio app. The page is put together here from its features, each of which makes its
components and wires its own events by name (web/page_form.py, page_race.py, page_share.py, page_tabs.py,
page_sweep.py, page_import.py, page_model_races.py, page_start.py; the names themselves in web/page_names.py); the
run and its Stop are wired here. One app object owns every store (web/app_object.py), what each event does is in
web/handlers.py and web/playback.py (thin functions of that object), runs, sweeps and the example recordings in
web/compute.py, the /race endpoint for code in web/api.py, requests are validated, run and bounded in
web/validation.py, web/requests.py and web/guards.py, every override of Gradio's internals is in
web/gradio_overrides.py, decoding lives in decoding/, views in visualize/ (visualize/page.py says which view shows
what). Code calls the page's /run by name through web/page_client.py.

    python app.py [--host 127.0.0.1] [--port 7860] [--allow-any-model] [--memory-budget-gb G]

Host and port: ``--host``/``--port`` when given, else ``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``
(what Hugging Face Spaces sets), else 127.0.0.1:7860.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
from typing import Any, Optional

from decoding.runtime import attention_kernels

if __name__ == "__main__":
    # The project's C++ kernels are built (g++, about 6 s on 2 cores with an empty cache) before the page can list
    # the versions that run here (the bfloat16 one needs them: kernels.bf16_route); started now, the build runs
    # while the rest of the app imports, and the page's check waits on the same build (attention_kernels.load).
    # Not a daemon: an exit during the build (a bad argument) waits for it, where a daemon thread still loading the
    # library when the interpreter shut down aborted the process ("terminate called without an active exception").
    threading.Thread(target=attention_kernels.load_default, name="kernel-build", daemon=False).start()

import gradio as gr  # after the kernel build has started
from starlette.middleware import Middleware

from decoding.harness.examples import example_prompts, examples_default_first
from decoding.runtime import omp_pool
from decoding.runtime.models import DEFAULT_MEMORY_BUDGET_GB, budget_bytes, load_presets
from web import contention, gradio_overrides
from web.api import race_endpoint
from web.batch_panel import batch_panel   # issue 49: the batch race, a panel of its own
from web.compute import record_examples
from web.guards import BodyLimit
from web.handlers import clear_history, run_playground, stop_run
from web.limits import DEFAULT_LIMITS
from web.loading import preload_default
from web.page_form import build_form, wire_examples
from web.page_import import wire_import
from web.page_model_races import wire_model_races
from web.page_names import RUN_VIEWS, generation_input, param_input, run_inputs
from web.page_parts import NAMED, PAGE, Inputs, Views, admitter
from web.page_race import build_race, build_replay_state, wire_clock, wire_inspector, wire_steps
from web.page_share import build_share, wire_run_clears_link, wire_share
from web.page_start import inputs_fast, inputs_shape, wire_start
from web.page_sweep import wire_sweep, wire_sweep_defaults
from web.page_tabs import build_tabs
from web.app_object import PlaygroundApp
from web.settings import DEFAULT_SETTINGS, Settings, recordings_folder
from web.startup import Startup, routes_file
from web.validation import GENERATION_FIELDS, check_model_name, param_fields

MEMORY_BUDGET_ENV = "DECODING_MEMORY_BUDGET_GB"
PAGE_CSS = (".dp-help{color:#57606a;font-size:.9em;margin:0 0 -6px}.dp-help p{margin:2px 0}"
            ".dp-clock{padding:6px 0;font-size:.95em}#columns{min-height:120px}"
            ".dp-drafts table,.dp-drafts td{font-size:12px}.dp-la,.dp-xt,.dp-drafts{overflow-x:auto}"
            "#strategies-note{margin-bottom:10px}")


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



def _wire_run(ui: Views, inputs: Inputs, run_order: tuple, controls: dict, state: PlaygroundApp, admit):
    """The run, the sweep, /race, Stop and Clear history: runs and sweeps share one queued worker. Handlers are
    functions of ``state`` (the app object) and take their inputs by name (``inputs``), never by position."""
    params = param_fields()

    def _stop(request: gr.Request = None):
        return stop_run(state, request)

    def _clear(request: gr.Request = None):
        return clear_history(state, request)

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

    # Runs and sweeps are admitted (a Stop ticket, a bounded number per session) before they wait. Their
    # handlers only watch: the compute runs in the app line's slot (one on a CPU), where every run and sweep
    # waits its turn and sees its place; so many handlers may wait at once without holding a thread. Their
    # inputs reach web/validation.py as sent (preprocess=False), so it names every bad field itself.
    line = dict(concurrency_id="generate", concurrency_limit=state.limits.line_capacity)
    heavy = dict(line, validator=admit, preprocess=False, **NAMED)
    run_event = controls["run"].click(_run, inputs.list(run_order), ui.list(RUN_VIEWS), api_name="run",
                                      show_progress="minimal", show_progress_on=[ui["status"]], **heavy)
    sweep_event = wire_sweep(ui, state, inputs, heavy)
    gradio_overrides.api_endpoint(race_endpoint(state), api_name="race", validator=admit, **line)
    # Stop sets this session's flags (a running job keeps its partial trace); a job still waiting in
    # the queue is also taken out of it, through the hidden value's change and Gradio's cancels=.
    # concurrency_limit=None: Stops sent through the API (/call/stop) are queued by Gradio even with queue=False;
    # without it they would wait one at a time and a Stop storm would fill the queue that Runs need
    controls["stop"].click(_stop, None, [ui["status"], controls["cancel_queued"]], api_name="stop", queue=False,
                           concurrency_limit=None, **NAMED)
    controls["cancel_queued"].change(None, None, None, cancels=[run_event, sweep_event], **PAGE)
    controls["clear"].click(_clear, None, ui["status"],
                            api_name="clear_history", queue=False, concurrency_limit=None, **NAMED)
    return run_event


def build_demo(settings: Settings = DEFAULT_SETTINGS, run_order: Optional[tuple] = None,
               state: Optional[PlaygroundApp] = None) -> gr.Blocks:
    """The page of one app: ``state`` owns its stores (default: a new :class:`PlaygroundApp` with ``settings``,
    what the operator chose at start, which reach every run and sweep); it is ``demo.playground``. ``run_order``: the
    order /run takes its inputs in, by name (default :func:`run_inputs`; the tests move one)."""
    state = PlaygroundApp(settings) if state is None else state
    settings = state.settings
    run_order = tuple(run_inputs() if run_order is None else run_order)
    if sorted(run_order) != sorted(run_inputs()):
        raise ValueError("run_order must name each of the run's inputs (web.page_names.run_inputs()) once")
    presets, prompts, ui = load_presets(), example_prompts(), Views()
    with Playground(title="Decoding Playground", delete_cache=settings.limits.cache_cleanup_s) as demo:
        form = build_form(settings, presets, prompts)
        inputs, controls = form.inputs, form.controls
        build_race(ui)
        build_share(ui)
        build_tabs(ui)
        batch_panel({k: inputs[k] for k in ("model", "assistant", "strategies", "prompt", "chat", "max_new_tokens")},
                    state)
        inputs.update(sweep_strategy=ui["sweep_strategy"], sweep_spec=ui["sweep_spec"])
        build_replay_state(ui)
        controls["cancel_queued"] = gr.Number(visible=False)
        _wire(demo, ui, form, run_order, state, prompts)
    demo.playground = state
    # Gradio's queue holds every waiting handler; runs and sweeps wait in our own line (the app's line) for the
    # compute slot, so a visitor sees their place in it, and identical runs share one computation
    demo.queue(default_concurrency_limit=1, max_size=state.limits.line_capacity)
    return demo


def _wire(demo: gr.Blocks, ui: Views, form: Any, run_order: tuple, state: PlaygroundApp, prompts: dict) -> None:
    """Every event, feature by feature; the Run clears the old link before the Run itself is wired."""
    inputs, controls, admit = form.inputs, form.controls, admitter(state)
    wire_run_clears_link(ui, controls["run"])                          # issue 40: a Run clears the link
    run_event = _wire_run(ui, inputs, run_order, controls, state, admit)
    wire_steps(ui, state)
    wire_clock(ui, state, run_event)
    wire_import(ui, state, admit)
    wire_sweep_defaults(ui)
    wire_inspector(ui, state)
    wire_examples(controls, prompts)
    wire_model_races(form.races, inputs)
    wire_share(ui, demo, state)
    start = dict(model=inputs["model"], assistant=inputs["assistant"], strategies=inputs["strategies"], **form.notes)
    wire_start(demo, state, state.settings, start, {**inputs_fast(inputs), **inputs_shape(inputs)})
    demo.run_event, demo.ui, demo.inputs, demo.run_order = run_event, ui, inputs, run_order


def _warm_start(state: PlaygroundApp, preload: bool, record: bool) -> None:
    """In the background at start: load the default model (and its head), so the first Run does not wait
    for it; then record the default comparison of every example prompt (the default example first) while no
    visitor's run is waiting."""
    if preload:
        preload_default(state.settings)
    if record:
        record_examples(state, examples_default_first())


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
    demo = build_demo(state=state)
    contention.WATCH.share()   # the /proc sampler starts now, so the first run already knows whether the cores are busy
    omp_pool.release()         # the main thread only serves from here: no OpenMP pool beside the compute's
    demo.launch(server_name=host, server_port=port)


if __name__ == "__main__":
    main()
