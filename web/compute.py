"""What happens between a checked request and the library's runner: runs, sweeps and the recordings of the
example prompts, as computations in an app's line (``web/app_object.py``). No Gradio event lives here; the handlers
(``web/handlers.py``) hand this work to ``web/watch.watch``, which submits and watches it, and show it.

On Hugging Face ZeroGPU the ``gpu``-wrapped compute runs in a forked process, so it takes and yields plain data
only (the request and the seconds it may hold the GPU), and every store is read and written by the callers
here, in the server process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import statistics
import threading
import time
from typing import Any, Callable, Iterator, Optional

import torch

from decoding.context import RunContext
from decoding.harness.bench import sweep_value
from decoding.harness.runner import run_comparison
from decoding.harness.steps import context_bucket, greedy_steps_ms
from decoding.runtime import omp_pool
from decoding.runtime.forward_cost import forward_cost
from visualize.page import chart_views, column_views, drafted, inspector_view, step_figures, step_html, survey
from visualize.race import clock_html, race_length_ms
from visualize.traces import export_trace, import_trace_file
from web import contention
from web.app_object import PlaygroundApp
from web.quiet import QUIET_NOTE, RunWindow, baselines_of, decode_step_ms, greedy_result
from web.crowd import Computation, QueueFull
from web.recordings import Recording
from web.gradio_overrides import plot_once
from web.guards import history_from
from web.validation import needs_assistant
from web.documents import complete, device_text, history_outputs, run_document
from web.loading import prepare_checked
from web.redact import redact_paths
from web.requests import RunRequest, SweepRequest, default_request
from web.run_thread import stream_comparison

try:  # Hugging Face Spaces ZeroGPU: request a GPU for the compute, for as long as the request needs
    import spaces

    def gpu(duration: Callable[..., int]) -> Callable:
        return spaces.GPU(duration=duration)
except ImportError:
    def gpu(duration: Callable[..., int]) -> Callable:
        return lambda fn: fn

POLL_S = 0.2          # the live race redraws at least this often while tokens come
PROBE_TOKENS = 16     # decode steps of the run that measures a quiet baseline (decode_probe)
NOT_RECORDED = "[app] run not recorded:"     # the operator's log line for each run not recorded, and why (no prompt)
log = logging.getLogger(__name__)


def budget_seconds(app: PlaygroundApp, units: float) -> int:
    """How long a computation may hold a (ZeroGPU) device: the line's estimate with room to spare, so shorter
    requests go first, never past the time limit."""
    return int(min(app.limits.time_limit_s, 2 * app.line.estimator.expect(units) + 10))


def _granted(stop: Any, req: Any, budget_s: int) -> int:
    """ZeroGPU's duration for a gpu-wrapped call: the budget its caller computed (``budget_seconds``)."""
    return budget_s


@gpu(_granted)
def compute_run(stop: Any, req: RunRequest, budget_s: int = 0) -> Iterator[tuple]:
    """Load and run a checked request; yields ``("live", snapshot, max_new)`` then ``("done", document,
    message, outputs for the history)``. Raises ValueError / ModelLoadError for what only the model can tell."""
    plan = list(req.plan)
    generation = req.generation if req.generation.active else None
    limits = req.settings.limits
    prep = prepare_checked(req.inputs, needs_assistant(plan), load=req.settings.load, generation=generation,
                           limits=limits)
    rival = req.inputs.rival()          # a race of two models: the same request on the second one
    rivals = [prepare_checked(rival, needs_assistant(plan), load=req.settings.load, generation=generation,
                              limits=limits)] \
        if rival is not None else []
    context = RunContext(generation=generation,
                         history=history_from(None if req.history is None else list(req.history),
                                              limits.history_tokens))
    results = []
    count = torch.get_num_threads()     # the process's count now (the start's one-thread compile lowers it a while)
    threads = contention.choose()       # one where other processes hold the cores (web/contention.py)
    for kind, value in stream_comparison(prep, plan, stop=stop, context=context, rivals=rivals,
                                         time_limit_s=limits.time_limit_s, poll_s=POLL_S, threads=threads):
        if kind == "live":
            yield "live", value, prep.max_new
        else:
            results = value
    doc, message = run_document(results, prep, req.inputs.prompt, req.inputs.chat, req.generation)
    if isinstance(doc.get("environment"), dict):
        doc["environment"]["threads"] = threads      # the count it computed on, not the process's (restored by now)
    if threads < count:
        message = f"{message} {contention.BUSY_NOTE}"
    yield "done", doc, message, history_outputs(doc["results"])


@gpu(_granted)
def compute_sweep(stop: Any, req: SweepRequest, budget_s: int = 0) -> tuple[dict, str]:
    """One strategy over a parameter grid against one greedy reference: (sweep, message)."""
    prep = prepare_checked(req.inputs, needs_assistant(req.plan), load=req.settings.load, limits=req.settings.limits)
    results = run_comparison(prep.prompt_ids, prep.pair, req.plan, max_new_tokens=prep.max_new, seed=prep.seed,
                             should_stop=stop.is_set, time_limit_s=req.settings.limits.time_limit_s)
    runs = [r for r in results if not r.reference]
    points = [{"values": [sweep_value(v) for v in combo], "speedup": r.speedup or 0.0,
               "tokens_per_target_forward": round(len(r.token_ids) / max(r.target_forwards, 1), 3)}
              for combo, r in zip(req.combos, runs) if not r.error]
    errors = [f"{dict(zip(req.keys, c))}: {redact_paths(r.error)}" for c, r in zip(req.combos, runs) if r.error]
    message = f"Swept {len(points)} settings of {req.strategy} on {prep.model}{prep.note}."
    if errors:
        message += " Failed: " + "; ".join(errors)
    return {"strategy": req.strategy, "keys": req.keys, "points": points}, message


@dataclasses.dataclass
class Outcome:
    """A finished run as every subscriber needs it: the document, its export, the status, the history outputs."""
    doc: dict
    text: str
    message: str
    outputs: list
    views: dict          # drawn once in the computation's thread, shared by every watcher and the recording
    quiet: bool = True   # timed on a quiet machine (``quiet_timing``): only then is it recorded
    share: str = ""      # its recording's share id (web/share.py); none when it was not recorded


def decode_probe(load: Callable[[str], Any], model: str, fast: bool,
                 context: Optional[int] = None) -> Callable[[], float]:
    """What seeds (and measures again) the quiet baseline of ``model`` in greedy's mode (the start seeds the served
    one's, ``web/startup.py``; a run's judgement measures again; ``load``: the app's loader): greedy's own loop
    run now after a prompt of ``context`` tokens (the run's context bucket; None: the default example), its median
    decode step (``harness/steps.greedy_steps_ms``), the quantity the run is judged by (a bare forward is not:
    issue 47). A model it cannot run keeps the curve kept on it."""
    def probe() -> float:
        lm = load(model)
        try:
            return statistics.median(greedy_steps_ms(lm, fast, tokens=PROBE_TOKENS, repeats=1, context=context))
        except Exception:  # noqa: BLE001: the curve kept on the model (a stand-in model in the tests)
            return forward_cost(lm, 1, fast=fast)(1)
    return probe


def quiet_timing(app: PlaygroundApp, req: RunRequest, doc: dict, share: Optional[float]) -> tuple[bool, str]:
    """Whether this run was timed on a quiet machine (``web/quiet.py``): other processes took little of the cores
    while greedy ran (``share``, from /proc) and greedy's median decode step cost about what it costs when quiet;
    else replaying its timings to every later visitor would misstate every speedup. (recorded, note)."""
    greedy = greedy_result(doc["results"])
    step = None if greedy is None else decode_step_ms(greedy)
    if not req.settings.quiet_recordings or step is None:
        return True, ""
    ran_on = (doc.get("environment") or {}).get("threads")
    if isinstance(ran_on, int) and ran_on < torch.get_num_threads():
        # sent to fewer threads because other processes held the cores when it started (web/contention.py), or run
        # while the start compiled the one-thread graph: not this machine's quiet timings, however close its steps
        # came to them (the /proc window of a short run on one thread can be too short to tell)
        return False, (f" Not recorded: it computed on {ran_on} of this app's {torch.get_num_threads()} threads (a "
                       f"run goes on one while other processes hold the cores), so its timings are not the quiet "
                       f"machine's; {QUIET_NOTE}")
    fast = bool((greedy.get("params") or {}).get("fast"))        # the baseline of greedy's own mode (compiled)
    # and of its context: a step after a 400-word prompt attends over ~10x the keys of the default example's
    bucket = context_bucket(len(doc.get("prompt_ids") or ()))
    key = (req.inputs.model, fast) if bucket == context_bucket(0) else (req.inputs.model, fast, bucket)
    probe = decode_probe(req.settings.load, req.inputs.model, fast, None if len(key) == 2 else bucket)
    return baselines_of(app).judge(key, step, share, probe, app.limits.quiet)


def run_work(app: PlaygroundApp, req: RunRequest, example: bool = False) -> Callable[[Computation], Outcome]:
    """What the computation thread does for a run: compute, publish live frames, record the result in ``app``'s
    recordings (an example prompt's apart from visitors', ``example``)."""
    def work(comp: Computation) -> Outcome:
        # a run given the slot while the start still prepares the fastest configuration runs eagerly, and says so
        eager_note = app.startup.run_note() if app.startup is not None else ""
        window = RunWindow(baselines_of(app).cpu)       # /proc around greedy's timed run (quiet_timing)
        for item in compute_run(comp.stop, req, budget_seconds(app, req.units)):
            if item[0] == "live":
                window.watch(item[1])
                comp.publish((item[1], item[2]))
            else:
                _, doc, message, outputs = item
        share = window.share(app.limits.quiet.window_s)
        message += eager_note
        outcome = Outcome(doc, export_trace(doc), message, outputs, draw_views(doc))
        if not req.private and not comp.stop.is_set() and complete(doc):
            outcome.quiet, note = quiet_timing(app, req, doc, share)
            if outcome.quiet:
                rec = Recording(req.key, doc, outcome.text, message, time.time(), device_text(doc),
                                views=outcome.views)
                app.recordings.put(rec, pinned=example)
                outcome.share = rec.share
            else:                       # /race's document has no message: the log says why (benchmarks read it)
                log.warning("%s%s", NOT_RECORDED, note.split(f"; {QUIET_NOTE}")[0].replace(" Not recorded:", "", 1))
            outcome.message += note
        return outcome
    return work


def submit_run(app: PlaygroundApp, req: RunRequest, background: bool = False) -> tuple[Computation, bool]:
    """Join the identical computation under way in ``app``, or start one (QueueFull when the line is full)."""
    def make() -> Computation:
        # a background run is the example recorder's: its recording is kept apart from visitors' on disk
        return Computation(req.key, run_work(app, req, example=background), units=req.units, background=background)
    if req.private:
        comp = make()
        comp.subscribe()
        app.line.submit(comp)
        return comp, True
    return app.board.join(req.key, make, app.line)


def sweep_work(app: PlaygroundApp, req: SweepRequest) -> Callable[[Computation], tuple[dict, str]]:
    """What the computation thread does for a sweep: one greedy reference, then each setting."""
    return lambda comp: compute_sweep(comp.stop, req, budget_seconds(app, req.units))


def imported(path: str, max_bytes: int) -> Iterator[tuple[dict, dict]]:
    """An uploaded trace, read in chunks and checked (ValueError names what is refused), then its views drawn:
    yields (document, views) once with every view but the token columns, then once with all of them."""
    doc = import_trace_file(path, max_bytes=max_bytes)
    views: dict = {}
    for stage in draw_stages(doc):
        views.update(stage)
        yield doc, views


def import_work(path: str, max_bytes: int) -> Callable[[Computation], tuple[dict, dict]]:
    """What the computation thread does for an import: the views drawn first are published (``comp.live``:
    the document and those views) while the token columns are drawn; the result is (document, views). A Stop
    after the first views ends it with those (no columns)."""
    def work(comp: Computation) -> tuple[dict, dict]:
        doc, views = None, {}
        with paused_gc():
            for doc, views in imported(path, max_bytes):
                if "columns" not in views:
                    comp.publish((doc, dict(views)))
                if comp.stop.is_set():
                    break
        return doc, views
    return work


_gc_lock = threading.Lock()
_gc_pauses = [0, False]      # pauses under way, and whether collection was enabled before the first


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's automatic garbage collection held off while a trace is read and drawn (nested and concurrent
    pauses end with the last one). A full collection walks every object the server holds (~0.2 s with torch,
    transformers and Gradio loaded) and drawing 200,000 events' views set off two or three of them; an import
    makes no reference cycles worth collecting (its objects are freed by reference counting), and collection
    resumes, as it was, when the views are drawn."""
    with _gc_lock:
        if _gc_pauses[0] == 0:
            _gc_pauses[1] = gc.isenabled()
            gc.disable()
        _gc_pauses[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses[0] -= 1
            if _gc_pauses[0] == 0 and _gc_pauses[1]:
                gc.enable()


def record_examples(app: PlaygroundApp, prompts: list[str], stop: Optional[Any] = None, idle_s: float = 1.0) -> int:
    """Record the page's default comparison of each example prompt (with ``app``'s settings), so a visitor who
    presses Run on one sees its race at once. One at a time and only while no visitor's run waits or runs: a
    visitor arriving stops the one being recorded, which is recorded again later. Returns how many were
    recorded."""
    recorded, pending = 0, list(prompts)
    while pending and not (stop is not None and stop.is_set()):
        if not app.line.idle():
            time.sleep(idle_s)
            continue
        req = default_request(pending[0], app.settings)
        if app.recordings.get(req.key) is not None:
            pending.pop(0)
            continue
        omp_pool.release()      # this thread waits while the run computes: no OpenMP pool beside its (runtime/omp_pool)
        try:
            comp, _ = submit_run(app, req, background=True)
        except QueueFull:
            time.sleep(idle_s)
            continue
        comp.done.wait()
        comp.leave()
        if comp.preempted:
            continue
        if app.recordings.get(req.key) is not None:
            recorded += 1
            pending.pop(0)
        elif getattr(comp.result, "quiet", True):   # not worth recording (an error, the time limit)
            pending.pop(0)
        else:                                       # timed while the machine was busy: again, later
            time.sleep(idle_s * app.limits.quiet_retry_idle)
    return recorded


def draw_stages(doc: dict) -> Iterator[dict]:
    """The views of a finished run that are the same for every visitor, in two parts: every view but the token
    columns (the summary, the clock, the charts, the step views and figures), then the columns, the costliest
    (``web/handlers.import_views`` shows the first part while the second is drawn)."""
    seen = survey(doc)                   # one pass over the events, shared by every view below
    choices = drafted(doc, seen)
    results = doc["results"]
    total = race_length_ms(results)
    values = {"inspector": inspector_view(doc, choices[0], 1) if choices else None,
              "clock_readout": clock_html(total, total, None, results)}   # the race's clock at its end
    values.update(chart_views(doc, seen))
    values.update(step_html(doc, seen.top, seen, columns=False))
    values.update(step_figures(doc, seen.top, choices[0] if choices else None, seen))
    yield {name: plot_once(v) for name, v in values.items()}
    yield column_views(doc, seen.top)


def draw_views(doc: dict) -> dict:
    """The views of a finished run that are the same for every visitor: drawn once, shared."""
    views: dict = {}
    for stage in draw_stages(doc):
        views.update(stage)
    return views
