"""The app's request handlers: what each Gradio event does, as functions of plain values.

Handlers return (or, for a run, yield) ``{view name: value}``; ``app.py`` maps view
names onto components, builds the page and wires the events. Requests are
validated, run and bounded in ``web/service.py`` and ``web/guards.py``;
which view shows what comes from ``visualize/page.py``.

On Hugging Face ZeroGPU the ``gpu``-wrapped compute runs in a forked process, so it
takes and yields plain data only, and every store (jobs, replay documents, trace
files, histories) is read and written here, in the server process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import math
import os
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import anyio
import gradio as gr

from decoding.context import RunContext
from decoding.harness.bench import sweep_value
from decoding.harness.runner import run_comparison
from decoding.runtime.forward_cost import forward_cost
from decoding.runtime.models import ModelLoadError
from visualize.charts import sweep_figure
from visualize.page import chart_views, drafted, inspector_view, race_views, step_figures, step_html, top_step
from visualize.race import SPEEDS, clamp_ms, live_columns_html, live_status, race_length_ms
from visualize.tokens import columns_html, number
from visualize.traces import export_trace, import_trace_file
from web.crowd import Board, Computation, Line, QueueFull, Recording, Recordings
from web.export import ExportFiles, caption, check_format, render
from web.share import check_id, share_views, shared_note, unknown_note
from visualize.animation import check_mode
from web.gradio_overrides import plot_once
from web.guards import Histories, TraceFiles, TraceStore, history_from
from web.service import (DEFAULT_SETTINGS, Settings, 
    GENERATION_FIELDS,
    LIMITS,
    SESSION_FALLBACK,
    Jobs,
    RunRequest,
    SweepRequest,
    complete,
    default_request,
    device_text,
    history_outputs,
    needs_assistant,
    prepare_checked,
    public_message,
    redact_paths,
    run_document,
    run_request,
    stream_comparison,
    sweep_request,
)

try:  # Hugging Face Spaces ZeroGPU: request a GPU for the compute, for as long as the request needs
    import spaces

    def gpu(duration: Callable[..., int]) -> Callable:
        return spaces.GPU(duration=duration)
except ImportError:
    def gpu(duration: Callable[..., int]) -> Callable:
        return lambda fn: fn

POLL_S = 0.2          # the live race redraws at least this often while tokens come
MAX_CLOCK_MS = 1e12      # a replay clock beyond any run (the anchor stays a finite number)
WATCH_S = 0.1         # how often a visitor's handler looks at its computation (an await, no thread held)
EXPIRED = ("<div class='dp-muted'>This trace is no longer held by the server (it keeps the most recent "
           "ones); run again or import the trace file.</div>")

# Every store a request can add to is bounded (web/service.py, web/guards.py).
JOBS = Jobs(LIMITS["jobs_per_session"], capacity=4 * LIMITS["queue_size"],
            queued_ttl_s=LIMITS["time_limit_s"] * (LIMITS["queue_size"] + 1), count_s=LIMITS["time_limit_s"])
TRACE_FILES = TraceFiles(LIMITS["trace_files"])
STORE = TraceStore(LIMITS["trace_store_bytes"])
LINE = Line(slots=LIMITS["compute_slots"], capacity=LIMITS["queue_size"])   # every run and sweep waits here
BOARD = Board()                                                    # identical requests share one computation
RECORDINGS = Recordings(LIMITS["recordings_bytes"])                # ... and its recording afterwards
HISTORIES = Histories(LIMITS["history_sessions"], LIMITS["history_tokens"], LIMITS["history_nodes"],
                      unshared=(SESSION_FALLBACK,))


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
def job(request: Any) -> Iterator[tuple[int, Any]]:
    """This job's (key, Stop flag) for as long as it runs (set already if Stop was pressed while it waited)."""
    key, flag = JOBS.start(getattr(_request_state(request), "decoding_ticket", None), _session(request))
    try:
        yield key, flag
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


def clear_history(request: gr.Request = None) -> str:
    """Forget this browser session's earlier outputs (suffix decoding drafts from them)."""
    n = HISTORIES.clear(getattr(request, "session_hash", None))
    return f"Cleared this session's history ({n} earlier output{'s' * (n != 1)})."


# --------------------------------------------------------------------------- compute (plain data in and out)
def user_error(exc: BaseException, prefix: str = "") -> gr.Error:
    """A message for the browser: no server paths, and markup shown as text (Gradio renders it as HTML)."""
    return gr.Error(html.escape(prefix + public_message(exc), quote=False))


_error = user_error


def _run_seconds(stop: Any, req: RunRequest) -> int:
    """ZeroGPU's duration for a run: the line's estimate with room to spare (shorter requests go first)."""
    return int(min(LIMITS["time_limit_s"], 2 * LINE.estimator.expect(req.units) + 10))


def _sweep_seconds(stop: Any, req: SweepRequest) -> int:
    return int(min(LIMITS["time_limit_s"], 2 * LINE.estimator.expect(req.units) + 10))


@gpu(_run_seconds)
def compute_run(stop: Any, req: RunRequest) -> Iterator[tuple]:
    """Load and run a checked request; yields ``("live", snapshot, max_new)`` then ``("done", document,
    message, outputs for the history)``. Raises ValueError / ModelLoadError for what only the model can tell."""
    plan = list(req.plan)
    prep = prepare_checked(req.inputs, needs_assistant(plan), load=req.settings.load,
                           generation=req.generation if req.generation.active else None)
    context = RunContext(generation=req.generation if req.generation.active else None,
                         history=history_from(None if req.history is None else list(req.history),
                                              LIMITS["history_tokens"]))
    results = []
    for kind, value in stream_comparison(prep, plan, stop=stop, context=context,
                                         time_limit_s=LIMITS["time_limit_s"], poll_s=POLL_S):
        if kind == "live":
            yield "live", value, prep.max_new
        else:
            results = value
    doc, message = run_document(results, prep, req.inputs.prompt, req.inputs.chat, req.generation)
    yield "done", doc, message, history_outputs(doc["results"])


@gpu(_sweep_seconds)
def compute_sweep(stop: Any, req: SweepRequest) -> tuple[dict, str]:
    """One strategy over a parameter grid against one greedy reference: (sweep, message)."""
    prep = prepare_checked(req.inputs, needs_assistant(req.plan), load=req.settings.load)
    results = run_comparison(prep.prompt_ids, prep.pair, req.plan, max_new_tokens=prep.max_new, seed=prep.seed,
                             should_stop=stop.is_set, time_limit_s=LIMITS["time_limit_s"])
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


def quiet_timing(req: RunRequest, doc: dict) -> tuple[bool, str]:
    """Whether greedy's steps in this run cost about what the target's one-position forward costs when the
    machine is quiet (its calibrated fastest, ``forward_cost``); else the run was timed while something else
    used the cores, and replaying its timings to every later visitor would misstate every speedup."""
    greedy = next((r for r in doc["results"] if r["strategy"] == "greedy" and not r["error"]), None)
    if not req.settings.quiet_recordings or greedy is None or not greedy.get("target_forwards"):
        return True, ""
    try:
        one = forward_cost(req.settings.load(req.inputs.model), 1)(1)
    except Exception:  # noqa: BLE001: a model whose forwards cannot be timed alone keeps the old behaviour
        return True, ""
    step = 1000.0 * greedy["wall_s"] / greedy["target_forwards"]
    if step <= LIMITS["quiet_slack"] * one + LIMITS["quiet_ms"]:
        return True, ""
    return False, (f" Not recorded: greedy took {step:.0f} ms a step against {one:.0f} ms on a quiet machine, so "
                   f"something else was using the cores; it is recorded when the machine is quiet.")


def _run_work(req: RunRequest, example: bool = False) -> Callable[[Computation], Outcome]:
    """What the computation thread does for a run: compute, publish live frames, record the result."""
    def work(comp: Computation) -> Outcome:
        for item in compute_run(comp.stop, req):
            if item[0] == "live":
                comp.publish((item[1], item[2]))
            else:
                _, doc, message, outputs = item
        outcome = Outcome(doc, export_trace(doc), message, outputs, _views(doc))
        if not req.private and not comp.stop.is_set() and complete(doc):
            outcome.quiet, note = quiet_timing(req, doc)
            if outcome.quiet:
                rec = Recording(req.key, doc, outcome.text, message, time.time(), device_text(doc),
                                views=outcome.views)
                RECORDINGS.put(rec, pinned=example)
                outcome.share = rec.share
            outcome.message += note
        return outcome
    return work


def submit_run(req: RunRequest, background: bool = False) -> tuple[Computation, bool]:
    """Join the identical computation under way, or start one (QueueFull when the line is full)."""
    def make() -> Computation:
        # a background run is the example recorder's: its recording is kept apart from visitors' on disk
        return Computation(req.key, _run_work(req, example=background), units=req.units, background=background)
    if req.private:
        comp = make()
        comp.subscribe()
        LINE.submit(comp)
        return comp, True
    return BOARD.join(req.key, make, LINE)


def record_examples(prompts: list[str], settings: Settings = DEFAULT_SETTINGS, stop: Optional[Any] = None,
                    idle_s: float = 1.0) -> int:
    """Record the page's default comparison of each example prompt, so a visitor who presses Run on one
    sees its race at once. One at a time and only while no visitor's run waits or runs: a visitor arriving
    stops the one being recorded, which is recorded again later. Returns how many were recorded."""
    recorded, pending = 0, list(prompts)
    while pending and not (stop is not None and stop.is_set()):
        if not LINE.idle():
            time.sleep(idle_s)
            continue
        req = default_request(pending[0], settings)
        if RECORDINGS.get(req.key) is not None:
            pending.pop(0)
            continue
        try:
            comp, _ = submit_run(req, background=True)
        except QueueFull:
            time.sleep(idle_s)
            continue
        comp.done.wait()
        comp.leave()
        if comp.preempted:
            continue
        if RECORDINGS.get(req.key) is not None:
            recorded += 1
            pending.pop(0)
        elif getattr(comp.result, "quiet", True):   # not worth recording (an error, the time limit)
            pending.pop(0)
        else:                                       # timed while the machine was busy: again, later
            time.sleep(idle_s * LIMITS["quiet_retry_idle"])
    return recorded


# --------------------------------------------------------------------------- following a computation
def waiting_text(place: Optional[tuple[int, int, float]]) -> Optional[str]:
    if place is None:
        return None
    position, waiting, eta = place
    ahead = "you are next" if position == 1 else f"you are number {position} in line"
    return (f"Waiting for the compute slot: {ahead} ({waiting} waiting); starts in about "
            f"{max(1, round(eta))} s.")


def _frame(comp: Computation) -> dict:
    """The live columns and status line of a running computation (drawn once per update for all watchers)."""
    snap, max_new = comp.live
    return {"columns": live_columns_html(snap), "status": live_status(snap, max_new)}


async def _watch(comp: Computation, stop: Any, progress: Any, frames: bool = True) -> AsyncIterator[dict]:
    """What a visitor sees until the computation is done or they press Stop: their place in line while it
    waits, the live columns while it runs (none drawn without ``frames``: a caller with no page)."""
    seen: Any = None
    while not comp.done.is_set() and not stop.is_set():
        if comp.state == "waiting":
            text = waiting_text(LINE.place(comp))
            if text is not None and text != seen:
                seen = text
                _progress(progress, 0.0, text)
                yield {"status": text}
        elif frames and comp.live is not None and comp.version != seen:
            seen = version = comp.version
            frame = comp.memo("frame", version, lambda: _frame(comp))
            snap, max_new = comp.live
            _progress(progress, _fraction(snap, max_new), frame["status"])
            yield frame
        await asyncio.sleep(WATCH_S)


def _progress(progress: Any, fraction: float, desc: str) -> None:
    if progress is not None:
        progress(fraction, desc=desc)


async def _until_done(comp: Computation) -> None:
    while not comp.done.is_set():
        await asyncio.sleep(WATCH_S)


# --------------------------------------------------------------------------- a checked run, for any caller
@dataclasses.dataclass
class Finished:
    """How a run ended for one caller: its document, computed now (``outcome``, ``joined`` callers shared it)
    or replayed from the recording of the identical request (``recording``)."""
    doc: dict
    outcome: Optional[Outcome] = None
    recording: Optional[Recording] = None
    joined: int = 1


async def follow_run(req: RunRequest, stop: Any, progress: Any, session: Optional[str],
                     frames: bool = True) -> AsyncIterator[Any]:
    """Everything between a checked request and its result, the same for the page's Run and the ``/race`` API:
    the recording of the identical request when there is one; else a place in the line (joining the identical
    computation under way), watched until it is done. The session's history keeps the outputs.

    Yields view updates (``{"status": ...}``, live frames with ``frames``) and last a :class:`Finished`, unless
    the caller stopped watching or the run was cancelled (then a status update is the last). Raises gr.Error
    for a full line, a bad request only the model can tell, or a failed run. Close it with
    ``contextlib.aclosing``: closing it is how a caller leaves the computation (the last to leave stops it)."""
    rec = None if req.private else await anyio.to_thread.run_sync(RECORDINGS.get, req.key)
    if rec is not None:
        HISTORIES.add(session, history_outputs(rec.doc["results"]))
        yield Finished(rec.doc, recording=rec)
        return
    try:
        comp, _ = submit_run(req)
    except QueueFull as exc:
        raise gr.Error(str(exc)) from None
    _progress(progress, 0.0, "starting")
    try:
        async for update in _watch(comp, stop, progress, frames):
            yield update
    finally:
        others = comp.leave()           # the last one to leave (Stop, a closed tab) stops the computation
    if not comp.done.is_set() and others > 0:
        frame = comp.memo("frame", comp.version, lambda: _frame(comp)) if frames and comp.live else {}
        yield {**frame, "status": f"Stopped watching. {others} other visitor{'s' * (others != 1)} asked for "
                                  f"this same run, so it goes on for them."}
        return
    await _until_done(comp)
    if comp.state == "cancelled":
        yield {"status": "Stopped the queued run before it started."}
        return
    if comp.error is not None:
        if isinstance(comp.error, (ValueError, ModelLoadError)):
            raise _error(comp.error) from None
        raise comp.error
    outcome: Outcome = comp.result
    HISTORIES.add(session, outcome.outputs)
    yield Finished(outcome.doc, outcome=outcome, joined=comp.visitors)


# --------------------------------------------------------------------------- handlers: return {view name: value}
async def run_playground(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any,
                         max_new_tokens: Any, seed: Any, params: dict, generation: Any = None, progress: Any = None,
                         request: Any = None, settings: Settings = DEFAULT_SETTINGS) -> AsyncIterator[dict]:
    """Run the selected strategies (or join the identical run under way, or replay its recording), streaming
    the visitor's place in line, then each column as it fills."""
    with job(request) as (_, stop):
        if stop.is_set():
            yield {"status": "Stopped before the run started."}
            return
        session = getattr(request, "session_hash", None)
        try:
            req = run_request(model, assistant, strategies, prompt, chat, max_new_tokens, seed, params,
                              generation if generation is not None else [None] * len(GENERATION_FIELDS),
                              HISTORIES.items(session), settings)
        except ValueError as exc:
            raise _error(exc) from None
        async with contextlib.aclosing(follow_run(req, stop, progress, session)) as updates:
            async for item in updates:
                if not isinstance(item, Finished):
                    yield item
                elif item.recording is not None:
                    yield {**await anyio.to_thread.run_sync(_replayed, item.recording),
                           **share_views(item.recording.share)}
                else:
                    outcome = item.outcome
                    shared = (f" {item.joined} visitors asked for this same run while it was computed; it ran "
                              f"once." if item.joined > 1 else "")
                    yield {**await anyio.to_thread.run_sync(
                        lambda: _outputs(outcome.doc, outcome.message + shared, len(outcome.text),
                                         TRACE_FILES.write(outcome.text), outcome.views)),
                        **share_views(outcome.share)}


def _replayed(rec: Recording) -> dict:
    """A recorded run, replayed: the same views, its recorded timings, and a status that says so. Visitors who
    press Run together on a recording read from disk wait for one drawing of its views, not one each."""
    with rec.lock:
        if not rec.views:
            rec.views = _views(rec.doc)
    note = (f"Replay of a recorded run: this exact request (model, prompt, strategies, parameters, seed, "
            f"settings) was computed at {rec.when()} on {rec.device}; identical requests are computed once, "
            f"so the speed figures are the ones measured then. {rec.message}")
    return _outputs(rec.doc, note, len(rec.text), TRACE_FILES.write(rec.text), rec.views, replay=True)


def _fraction(snap: dict, max_new: int) -> float:
    total = len(snap["done"]) + bool(snap["running"]) + len(snap["waiting"]) or 1
    running = snap["running"] or {}
    return min(1.0, (len(snap["done"]) + len(running.get("token_ids") or ()) / max(max_new, 1)) / total)


async def run_sweep(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                    strategy: Any, spec: Any, progress: Any = None, request: Any = None,
                    settings: Settings = DEFAULT_SETTINGS) -> AsyncIterator[tuple]:
    """The sweep's (figure, message): it waits in the same line as runs, showing its place."""
    with job(request) as (_, stop):
        if stop.is_set():
            yield gr.skip(), "Stopped before the sweep started."
            return
        try:
            req = sweep_request(model, assistant, prompt, chat, max_new_tokens, seed, strategy, spec, settings)
        except ValueError as exc:
            raise _error(exc) from None
        comp = Computation(f"sweep-{uuid.uuid4().hex}", lambda c: compute_sweep(c.stop, req), units=req.units)
        comp.subscribe()
        try:
            LINE.submit(comp)
        except QueueFull as exc:
            raise gr.Error(str(exc)) from None
        _progress(progress, 0.0, "sweeping (one greedy reference, then each setting)")
        try:
            async for update in _watch(comp, stop, progress):
                yield gr.skip(), update["status"]
        finally:
            comp.leave()
        await _until_done(comp)
        if comp.state == "cancelled":
            yield gr.skip(), "Stopped the queued sweep before it started."
            return
        if comp.error is not None:
            if isinstance(comp.error, (ValueError, ModelLoadError)):
                raise _error(comp.error) from None
            raise comp.error
        sweep, message = comp.result
        yield sweep_figure(sweep), message


def _views(doc: dict) -> dict:
    """The views of a finished run that are the same for every visitor: drawn once, shared."""
    top = top_step(doc)
    choices = drafted(doc)
    total = race_length_ms(doc["results"])
    values = {"inspector": inspector_view(doc, choices[0], 1) if choices else None,
              "clock_readout": race_views(doc, total, None)["clock"]}
    values.update(chart_views(doc))
    values.update(step_html(doc, top))
    values.update(step_figures(doc, top, choices[0] if choices else None))
    return {name: plot_once(v) for name, v in values.items()}


def _outputs(doc: dict, message: str, size: int, trace_path: Optional[str], views: Optional[dict] = None,
             replay: bool = False) -> dict:
    """Every run view for a finished run or an imported trace (the document goes into STORE)."""
    top = top_step(doc)
    key = STORE.put(doc, size, top, replay=replay)
    choices = drafted(doc)
    total = race_length_ms(doc["results"])
    values = {"key": key, "step": gr.update(minimum=0, maximum=max(top, 1), value=top),
              "clock": gr.update(minimum=0, maximum=max(round(total), 1), value=round(total)),
              "download": trace_path, "status": message,
              "inspect_strategy": gr.update(choices=choices, value=choices[0] if choices else None)}
    values.update(views if views is not None else _views(doc))
    return values


def _held(key: Any) -> tuple[Optional[dict], int]:
    """(document, top replay step) of this session's trace; (None, 0) when there is none or it expired."""
    return STORE.get(key) or (None, 0)


def _step(step: Any, top: int) -> int:
    """A replay step from the browser, clamped to [0, top]; 0 when it is not a number."""
    value = number(step, None)
    if value is None or value != value:
        return 0
    return int(min(max(value, 0.0), float(top)))


def replay(key: Any, step: Any) -> dict:
    """The HTML views at one replay step (bounded: see visualize.tokens.MAX_FRAME_ITEMS)."""
    doc, top = _held(key)
    if doc is None:
        values = step_html(None, None)
        values["columns"] = EXPIRED if key else columns_html([])
        return values
    return step_html(doc, _step(step, top))


def replay_figures(key: Any, step: Any, strategy: Any) -> dict:
    """The figures at one replay step: draft tree, lookahead mask, beams, sampling."""
    doc, top = _held(key)
    return step_figures(doc, _step(step, top) if doc else None, strategy)


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


def _speed(value: Any) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value in SPEEDS else 1.0


def race_at(key: Any, at_ms: Any, speed: Any) -> dict:
    """The wall-clock replay at ``at_ms``: every column at that time of its own run."""
    doc, _ = _held(key)
    if doc is None:
        return {"columns": EXPIRED if key else columns_html([]), "clock_readout": ""}
    total = race_length_ms(doc["results"])
    views = race_views(doc, clamp_ms(at_ms, total), _speed(speed))
    return {"columns": views["columns"], "clock_readout": views["clock"]}


def race_play(key: Any, at_ms: Any, speed: Any) -> dict:
    """Start the wall-clock replay (from 0 when at the end): its anchor and the timer."""
    doc, _ = _held(key)
    total = race_length_ms(doc["results"]) if doc else 0.0
    start = clamp_ms(at_ms, total)
    start = 0.0 if start >= total else start
    return {"race_anchor": {"wall": time.monotonic(), "from": start}, "race_ticker": gr.Timer(active=total > 0),
            **race_at(key, start, speed), "clock": start}


def race_tick(key: Any, anchor: Any, speed: Any) -> dict:
    """One frame of the wall-clock replay: real elapsed time times the speed factor since the anchor
    (``playing`` stays "race" at the end: the race keeps the columns until the visitor moves the step
    slider or plays the steps)."""
    doc, _ = _held(key)
    stopped = {"race_ticker": gr.Timer(active=False), "playing": None}
    if doc is None or not isinstance(anchor, dict):
        return stopped
    total = race_length_ms(doc["results"])
    wall, start = number(anchor.get("wall"), None), number(anchor.get("from"), None)
    if wall is None or start is None or not math.isfinite(wall) or not math.isfinite(start):
        return stopped
    now = clamp_ms(start + (time.monotonic() - wall) * 1e3 * _speed(speed), total)
    return {**race_at(key, now, speed), "clock": round(now), "race_ticker": gr.Timer(active=now < total),
            "playing": "race"}


def autoplay(key: Any, speed: Any) -> dict:
    """After a run: a replayed recording plays its race in real time from the start; anything else stays."""
    if not STORE.is_replay(key):
        return {name: gr.skip() for name in ("race_anchor", "race_ticker", "columns", "clock_readout", "clock",
                                             "ticker", "playing")}
    return {**race_play(key, 0, speed), "ticker": gr.Timer(active=False), "playing": "race"}


def race_rebase(anchor: Any, at_ms: Any) -> Any:
    """A new speed while playing: go on from where the clock is."""
    if not isinstance(anchor, dict):
        return gr.skip()
    return {"wall": time.monotonic(), "from": clamp_ms(at_ms, MAX_CLOCK_MS)}


def inspect_position(key: Any, strategy: Any, position: Any) -> Any:
    doc, _ = _held(key)
    return inspector_view(doc, strategy, position)


def import_file(path: Any, request: gr.Request = None) -> dict:
    """Replay an uploaded trace (no model needed). The file is not exported again: its owner has it."""
    with job(request):
        if not isinstance(path, str) or not path:
            raise gr.Error("trace: choose a JSON file exported from this app")
        try:   # read in chunks: a file over a cap (size, events, depth, ...) is refused before it is all read
            size = os.path.getsize(path)
            doc = import_trace_file(path, max_bytes=LIMITS["upload_bytes"])
        except (OSError, ValueError) as exc:
            raise _error(exc, "trace: ") from None
    return _outputs(doc, f"Imported a trace with {len(doc['results'])} strategies (no model needed).",
                    size, None)


# --------------------------------------------------------------------------- share links and exports (issue 40)
EXPORTS = ExportFiles(keep=16, max_bytes=96 * 2**20)     # exported animations on disk (oldest deleted first)


def _shared(race_id: Any) -> Recording:
    """The recording a race id names; ValueError naming ``race_id`` when the id is malformed (checked before any
    lookup) or no recording held here has it."""
    rec = RECORDINGS.by_share(check_id(race_id))
    if rec is None:
        raise ValueError("race_id: no race with this id is held here (the server keeps its most recent races; "
                         "this one expired, or the link is mistyped)")
    return rec


def open_shared(race_id: Any) -> dict:
    """The page opened with ``?race=<id>``: that race's views at once, replayed from its recording and labelled
    so (when, on what machine), nothing computed. A bad or unknown id: a message, and the page as it was."""
    if race_id is None:
        return {}
    try:
        rec = _shared(race_id)
    except ValueError as exc:
        return {"status": unknown_note(str(exc))}
    values = _replayed(rec)
    values["status"] = shared_note(rec.when(), rec.device, rec.message)
    return {**values, **share_views(rec.share)}


async def export_race(race_id: Any, fmt: Any, mode: Any, request: Any = None) -> str:
    """The race ``race_id`` as an animated GIF or an MP4 (its path): drawn in the compute line (``LINE``), so
    it never runs beside a timed run; the same export asked again is the file already made."""
    with job(request) as (_, stop):
        try:
            check_format(fmt)
            check_mode(mode)
            rec = _shared(race_id)
        except ValueError as exc:
            raise _error(exc) from None
        key = (rec.share, fmt, mode)
        made = EXPORTS.get(key)
        if made is not None:
            return made
        note = caption(rec.when(), rec.device)
        comp = Computation(f"export-{uuid.uuid4().hex}", lambda c: render(rec.doc, fmt, mode, note, EXPORTS, key),
                           units=0)
        comp.subscribe()
        try:
            LINE.submit(comp)
        except QueueFull as exc:
            raise gr.Error(str(exc)) from None
        try:
            while not comp.done.is_set() and not stop.is_set():
                await asyncio.sleep(WATCH_S)
        finally:
            comp.leave()
        await _until_done(comp)
        if comp.state == "cancelled" or comp.result is None and comp.error is None:
            raise gr.Error("Stopped the export before it finished.")
        if comp.error is not None:
            if isinstance(comp.error, ValueError):
                raise _error(comp.error) from None
            raise comp.error
        return comp.result
