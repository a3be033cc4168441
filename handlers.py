"""The app's request handlers: what each Gradio event does, as functions of plain values.

Handlers return (or, for a run, yield) ``{view name: value}``; ``app.py`` maps view
names onto components, builds the page and wires the events. Requests are
validated, run and bounded in ``decoding/service.py`` and ``decoding/guards.py``;
which view shows what comes from ``visualize/page.py``.

On Hugging Face ZeroGPU the ``gpu``-wrapped compute runs in a forked process, so it
takes and yields plain data only, and every store (jobs, replay documents, trace
files, histories) is read and written here, in the server process.
"""

from __future__ import annotations

import contextlib
import html
import math
import os
import time
import uuid
from typing import Any, Iterator, Optional

import gradio as gr

from decoding.bench import _num as sweep_value
from decoding.context import RunContext
from decoding.guards import Histories, TraceFiles, TraceStore, history_from
from decoding.models import ModelLoadError
from decoding.runner import run_comparison
from decoding.service import (LIMITS, SESSION_FALLBACK, Jobs, build_plan, generation_settings, history_outputs,
                              needs_assistant, parse_sweep_spec, prepare, public_message, redact_paths,
                              run_document, stream_comparison)
from visualize.charts import sweep_figure
from visualize.page import chart_views, drafted, inspector_view, race_views, step_figures, step_html, top_step
from visualize.race import SPEEDS, clamp_ms, live_columns_html, live_status, race_length_ms
from visualize.tokens import columns_html
from visualize.traces import export_trace, import_trace

try:  # Hugging Face Spaces ZeroGPU: request a GPU for the compute
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

POLL_S = 0.2          # the live race redraws at least this often while tokens come
EXPIRED = ("<div class='dp-muted'>This trace is no longer held by the server (it keeps the most recent "
           "ones); run again or import the trace file.</div>")

# Every store a request can add to is bounded (decoding/service.py, decoding/guards.py).
JOBS = Jobs(LIMITS["jobs_per_session"], capacity=4 * LIMITS["queue_size"],
            queued_ttl_s=LIMITS["time_limit_s"] * (LIMITS["queue_size"] + 1), count_s=LIMITS["time_limit_s"])
TRACE_FILES = TraceFiles(LIMITS["trace_files"])
STORE = TraceStore(LIMITS["trace_store_bytes"])
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
def _error(exc: BaseException, prefix: str = "") -> gr.Error:
    """A message for the browser: no server paths, and markup shown as text (Gradio renders it as HTML)."""
    return gr.Error(html.escape(prefix + public_message(exc), quote=False))


@gpu
def compute_run(job_key: int, model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any,
                max_new_tokens: Any, seed: Any, params: dict, generation: Any,
                history: Optional[list]) -> Iterator[tuple]:
    """Validate, load and run; yields ``("live", snapshot)`` then ``("done", document, message, outputs
    for the history)``. Raises ValueError / ModelLoadError for bad input."""
    plan = build_plan(strategies, params or {})
    settings = generation_settings(generation)
    prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan),
                   generation=settings, plan=plan)
    context = RunContext(generation=settings if settings.active else None,
                         history=history_from(history, LIMITS["history_tokens"]))
    results = []
    for kind, value in stream_comparison(prep, plan, stop=JOBS.flag(job_key), context=context,
                                         time_limit_s=LIMITS["time_limit_s"], poll_s=POLL_S):
        if kind == "live":
            yield "live", value, prep.max_new
        else:
            results = value
    doc, message = run_document(results, prep, prompt, chat, settings)
    yield "done", doc, message, history_outputs(doc["results"])


@gpu
def compute_sweep(job_key: int, model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any,
                  seed: Any, strategy: Any, spec: Any) -> tuple[dict, str]:
    """One strategy over a parameter grid against one greedy reference: (sweep, message)."""
    keys, combos, plan = parse_sweep_spec(strategy, spec)
    prep = prepare(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan))
    results = run_comparison(prep.prompt_ids, prep.pair, plan, max_new_tokens=prep.max_new, seed=prep.seed,
                             should_stop=JOBS.flag(job_key).is_set, time_limit_s=LIMITS["time_limit_s"])
    runs = [r for r in results if not r.reference]
    points = [{"values": [sweep_value(v) for v in combo], "speedup": r.speedup or 0.0,
               "tokens_per_target_forward": round(len(r.token_ids) / max(r.target_forwards, 1), 3)}
              for combo, r in zip(combos, runs) if not r.error]
    errors = [f"{dict(zip(keys, c))}: {redact_paths(r.error)}" for c, r in zip(combos, runs) if r.error]
    message = f"Swept {len(points)} settings of {strategy} on {prep.model}{prep.note}."
    if errors:
        message += " Failed: " + "; ".join(errors)
    return {"strategy": strategy, "keys": keys, "points": points}, message


# --------------------------------------------------------------------------- handlers: return {view name: value}
def run_playground(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any, max_new_tokens: Any,
                   seed: Any, params: dict, generation: Any = None, progress: Any = None,
                   request: Any = None) -> Iterator[dict]:
    """Run the selected strategies one after the other, streaming each column as it fills."""
    with job(request) as (key, stop):
        if stop.is_set():
            yield {"status": "Stopped before the run started."}
            return
        session = getattr(request, "session_hash", None)
        if progress is not None:
            progress(0, desc="loading the model")
        try:
            for item in compute_run(key, model, assistant, strategies, prompt, chat, max_new_tokens, seed,
                                    params, generation if generation is not None else [None] * 5,
                                    HISTORIES.items(session)):
                if item[0] == "live":
                    snap, max_new = item[1], item[2]
                    if progress is not None:
                        progress(_fraction(snap, max_new), desc=live_status(snap, max_new))
                    yield {"columns": live_columns_html(snap), "status": live_status(snap, max_new)}
                else:
                    _, doc, message, outputs = item
        except (ValueError, ModelLoadError) as exc:
            raise _error(exc) from None
    HISTORIES.add(session, outputs)
    text = export_trace(doc)
    yield _outputs(doc, message, len(text), TRACE_FILES.write(text))


def _fraction(snap: dict, max_new: int) -> float:
    total = len(snap["done"]) + bool(snap["running"]) + len(snap["waiting"]) or 1
    running = snap["running"] or {}
    return min(1.0, (len(snap["done"]) + len(running.get("token_ids") or ()) / max(max_new, 1)) / total)


def run_sweep(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
              strategy: Any, spec: Any, progress: Any = None, request: Any = None) -> tuple:
    """The sweep's (figure, message)."""
    with job(request) as (key, stop):
        if stop.is_set():
            return gr.skip(), "Stopped before the sweep started."
        if progress is not None:
            progress(0, desc="sweeping (one greedy reference, then each setting)")
        try:
            sweep, message = compute_sweep(key, model, assistant, prompt, chat, max_new_tokens, seed,
                                           strategy, spec)
        except (ValueError, ModelLoadError) as exc:
            raise _error(exc) from None
    return sweep_figure(sweep), message


def _outputs(doc: dict, message: str, size: int, trace_path: Optional[str]) -> dict:
    """Every run view for a finished run or an imported trace (the document goes into STORE)."""
    top = top_step(doc)
    key = STORE.put(doc, size, top)
    choices = drafted(doc)
    total = race_length_ms(doc["results"])
    values = {"key": key, "step": gr.update(minimum=0, maximum=max(top, 1), value=top),
              "clock": gr.update(minimum=0, maximum=max(round(total), 1), value=round(total)),
              "download": trace_path, "status": message,
              "inspect_strategy": gr.update(choices=choices, value=choices[0] if choices else None),
              "inspector": inspector_view(doc, choices[0], 1) if choices else None,
              "clock_readout": race_views(doc, total, None)["clock"]}
    values.update(chart_views(doc))
    values.update(step_html(doc, top))
    values.update(step_figures(doc, top, choices[0] if choices else None))
    return values


def _held(key: Any) -> tuple[Optional[dict], int]:
    """(document, top replay step) of this session's trace; (None, 0) when there is none or it expired."""
    return STORE.get(key) or (None, 0)


def _step(step: Any, top: int) -> int:
    ok = isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step)
    return min(max(int(step), 0), top) if ok else 0


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
    wall, start = anchor.get("wall"), anchor.get("from")
    if not isinstance(wall, (int, float)) or not isinstance(start, (int, float)):
        return stopped
    now = clamp_ms(start + (time.monotonic() - wall) * 1e3 * _speed(speed), total)
    return {**race_at(key, now, speed), "clock": round(now), "race_ticker": gr.Timer(active=now < total),
            "playing": "race"}


def race_rebase(anchor: Any, at_ms: Any) -> Any:
    """A new speed while playing: go on from where the clock is."""
    if not isinstance(anchor, dict):
        return gr.skip()
    return {"wall": time.monotonic(), "from": float(at_ms) if isinstance(at_ms, (int, float)) else 0.0}


def inspect_position(key: Any, strategy: Any, position: Any) -> Any:
    doc, _ = _held(key)
    return inspector_view(doc, strategy, position)


def import_file(path: Any, request: gr.Request = None) -> dict:
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
