"""The app's Gradio event functions: thin functions of one app object (``web/playground.PlaygroundApp``).

Each handler takes the app first, then plain values: it validates (``web/validation.py``, ``web/requests.py``), hands the work to the
app's line (``web/compute.py``) or its stores, and returns (or, for a run, yields) ``{view name: value}``;
``app.py`` maps view names onto components, builds the page and wires the events by name. Which view shows
what comes from ``visualize/page.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import time
import uuid
from typing import Any, AsyncIterator, Iterator, Optional

import anyio
import gradio as gr

from decoding.runtime.models import ModelLoadError
from visualize.animation import check_mode
from visualize.charts import sweep_figure
from visualize.page import drafted, survey, top_step
from visualize.race import live_columns_html, live_status, race_length_ms
from web.compute import Outcome, draw_views, submit_export, submit_import, submit_run, submit_sweep
from web.crowd import Computation, QueueFull
from web.recordings import Recording
from web.documents import history_outputs
from web.export import caption, check_format
from web.jobs import SESSION_FALLBACK
from web.playback import replay_outputs, run_controls
from web.playground import PlaygroundApp
from web.redact import public_message
from web.requests import RunRequest, run_request, sweep_request
from web.validation import GENERATION_FIELDS
from web.share import check_id, share_views, shared_note, unknown_note

WATCH_S = 0.1         # how often a visitor's handler looks at its computation (an await, no thread held)
IMPORT_POLL_S = 0.02  # ... and at a running import (its first views are shown the moment they are drawn)

# --------------------------------------------------------------------------- jobs
def _session(request: Any) -> str:
    return getattr(request, "session_hash", None) or SESSION_FALLBACK


def _admission_session(request: Any) -> str:
    """A raw API call names no session when it is queued: it is its own session (nothing to group it with)."""
    return getattr(request, "session_hash", None) or f"anonymous-{uuid.uuid4().hex}"


def _request_state(request: Any) -> Any:
    """The HTTP request's state: the queue admission and the job itself see the same one."""
    return getattr(getattr(request, "request", None), "state", None)


def admit(app: PlaygroundApp, request: gr.Request, *inputs: Any) -> list:
    """Queue admission (Gradio's validator runs it before a job waits): a Stop ticket, a few per session.

    A validator answers one ``gr.validate`` per input; a refusal is reported on the first.
    """
    fine = [gr.validate(True, "") for _ in inputs[1:]]
    try:
        ticket = app.jobs.admit(_admission_session(request))
    except ValueError as exc:
        return [gr.validate(False, str(exc))] + fine
    state = _request_state(request)
    if state is not None:
        state.decoding_ticket = ticket
    return [gr.validate(True, "")] + fine


@contextlib.contextmanager
def job(app: PlaygroundApp, request: Any) -> Iterator[tuple[int, Any]]:
    """This job's (key, Stop flag) for as long as it runs (set already if Stop was pressed while it waited)."""
    key, flag = app.jobs.start(getattr(_request_state(request), "decoding_ticket", None), _session(request))
    try:
        yield key, flag
    finally:
        app.jobs.finish(key)


def stop_run(app: PlaygroundApp, request: gr.Request = None) -> tuple[str, Any]:
    """Set this session's Stop flags. Returns the status and, when only queued jobs were stopped,
    a new value for the hidden component whose change cancels them in the browser."""
    running, waiting = app.jobs.stop(_session(request))
    if running:
        return "Stopping after the current step…", gr.skip()
    if waiting:
        return "Stopped the queued job before it started.", time.time()
    return "Nothing to stop.", gr.skip()


def clear_history(app: PlaygroundApp, request: gr.Request = None) -> str:
    """Forget this browser session's earlier outputs (suffix decoding drafts from them)."""
    n = app.histories.clear(getattr(request, "session_hash", None))
    return f"Cleared this session's history ({n} earlier output{'s' * (n != 1)})."


# --------------------------------------------------------------------------- compute (plain data in and out)
def user_error(exc: BaseException, prefix: str = "", page: bool = True) -> gr.Error:
    """A message for the caller, without server paths: for the page, markup escaped so it shows as text (Gradio
    renders a page's error as HTML); for an API client (``page=False``), plain text as it was written."""
    message = prefix + public_message(exc)
    return gr.Error(html.escape(message, quote=False) if page else message)


def from_page(request: Any) -> bool:
    """Whether an event came from the page rather than an API client: Gradio's own browser client says
    ``x-gradio-user: app`` (its Python and JavaScript clients say ``api``); no request (a direct call) is not
    the page."""
    headers = getattr(request, "headers", None)
    return headers is not None and headers.get("x-gradio-user") == "app"




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


async def _watch(app: PlaygroundApp, comp: Computation, stop: Any, progress: Any,
                 frames: bool = True) -> AsyncIterator[dict]:
    """What a visitor sees until the computation is done or they press Stop: their place in line while it
    waits, the live columns while it runs (none drawn without ``frames``: a caller with no page)."""
    seen: Any = None
    while not comp.done.is_set() and not stop.is_set():
        if comp.state == "waiting":
            text = waiting_text(app.line.place(comp))
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


CANCELLED = object()     # what a computation taken out of line before it started leaves


async def _settled(comp: Computation, page: bool = True) -> Any:
    """The result of a computation, once it is done (awaited, no thread held); ``CANCELLED`` when it was taken
    out of line before it started. A bad request only the model can tell becomes a message for the browser; any
    other failure is raised as it was."""
    while not comp.done.is_set():
        await asyncio.sleep(WATCH_S)
    if comp.state == "cancelled":
        return CANCELLED
    if comp.error is not None:
        if isinstance(comp.error, (ValueError, ModelLoadError)):
            raise user_error(comp.error, page=page) from None
        raise comp.error
    return comp.result


# --------------------------------------------------------------------------- a checked run, for any caller
@dataclasses.dataclass
class Finished:
    """How a run ended for one caller: its document, computed now (``outcome``, ``joined`` callers shared it)
    or replayed from the recording of the identical request (``recording``)."""
    doc: dict
    outcome: Optional[Outcome] = None
    recording: Optional[Recording] = None
    joined: int = 1


async def follow_run(app: PlaygroundApp, req: RunRequest, stop: Any, progress: Any, session: Optional[str],
                     frames: bool = True) -> AsyncIterator[Any]:
    """Everything between a checked request and its result, the same for the page's Run and the ``/race`` API:
    the recording of the identical request when there is one; else a place in the line (joining the identical
    computation under way), watched until it is done. The session's history keeps the outputs.

    Yields view updates (``{"status": ...}``, live frames with ``frames``; without, a caller with no page, whose
    errors come as plain text) and last a :class:`Finished`, unless
    the caller stopped watching or the run was cancelled (then a status update is the last). Raises gr.Error
    for a full line, a bad request only the model can tell, or a failed run. Close it with
    ``contextlib.aclosing``: closing it is how a caller leaves the computation (the last to leave stops it)."""
    rec = None if req.private else await anyio.to_thread.run_sync(app.recordings.get, req.key)
    if rec is not None:
        app.histories.add(session, history_outputs(rec.doc["results"]))
        yield Finished(rec.doc, recording=rec)
        return
    try:
        comp, _ = submit_run(app, req)
    except QueueFull as exc:
        raise gr.Error(str(exc)) from None
    _progress(progress, 0.0, "starting")
    try:
        async for update in _watch(app, comp, stop, progress, frames):
            yield update
    finally:
        others = comp.leave()           # the last one to leave (Stop, a closed tab) stops the computation
    if not comp.done.is_set() and others > 0:
        frame = comp.memo("frame", comp.version, lambda: _frame(comp)) if frames and comp.live else {}
        yield {**frame, "status": f"Stopped watching. {others} other visitor{'s' * (others != 1)} asked for "
                                  f"this same run, so it goes on for them."}
        return
    outcome: Outcome = await _settled(comp, page=frames)
    if outcome is CANCELLED:
        yield {"status": "Stopped the queued run before it started."}
        return
    app.histories.add(session, outcome.outputs)
    yield Finished(outcome.doc, outcome=outcome, joined=comp.visitors)


# --------------------------------------------------------------------------- handlers: return {view name: value}
async def run_playground(app: PlaygroundApp, model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any,
                         max_new_tokens: Any, seed: Any, params: dict, generation: Any = None, progress: Any = None,
                         request: Any = None, versus: Any = None) -> AsyncIterator[dict]:
    """Run the selected strategies (or join the identical run under way, or replay its recording), streaming
    the visitor's place in line, then each column as it fills. ``versus``: a second model that runs the same
    strategies beside the target (a race of two models), or none."""
    with job(app, request) as (_, stop):
        if stop.is_set():
            yield {"status": "Stopped before the run started."}
            return
        session = getattr(request, "session_hash", None)
        try:
            req = run_request(model, assistant, strategies, prompt, chat, max_new_tokens, seed, params,
                              generation if generation is not None else [None] * len(GENERATION_FIELDS),
                              app.histories.items(session), app.settings, versus)
        except ValueError as exc:
            raise user_error(exc) from None
        async with contextlib.aclosing(follow_run(app, req, stop, progress, session)) as updates:
            async for item in updates:
                if not isinstance(item, Finished):
                    yield item
                elif item.recording is not None:
                    yield {**await anyio.to_thread.run_sync(_replayed, app, item.recording),
                           **share_views(item.recording.share)}
                else:
                    outcome = item.outcome
                    shared = (f" {item.joined} visitors asked for this same run while it was computed; it ran "
                              f"once." if item.joined > 1 else "")
                    yield {**await anyio.to_thread.run_sync(
                        lambda: _outputs(app, outcome.doc, outcome.message + shared,
                                         app.trace_files.write(outcome.text), outcome.views)),
                        **share_views(outcome.share)}


def _replayed(app: PlaygroundApp, rec: Recording) -> dict:
    """A recorded run, replayed: the same views, its recorded timings, and a status that says so. Visitors who
    press Run together on a recording read from disk wait for one drawing of its views, not one each."""
    note = (f"Replay of a recorded run: this exact request (model, prompt, strategies, parameters, seed, "
            f"settings) was computed at {rec.when()} on {rec.device}; identical requests are computed once, "
            f"so the speed figures are the ones measured then. {rec.message}")
    return replay_outputs(app, rec, note)


def _fraction(snap: dict, max_new: int) -> float:
    total = len(snap["done"]) + bool(snap["running"]) + len(snap["waiting"]) or 1
    running = snap["running"] or {}
    return min(1.0, (len(snap["done"]) + len(running.get("token_ids") or ()) / max(max_new, 1)) / total)


async def run_sweep(app: PlaygroundApp, model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                    strategy: Any, spec: Any, progress: Any = None, request: Any = None) -> AsyncIterator[tuple]:
    """The sweep's (figure, message): it waits in the same line as runs, showing its place."""
    with job(app, request) as (_, stop):
        if stop.is_set():
            yield gr.skip(), "Stopped before the sweep started."
            return
        try:
            req = sweep_request(model, assistant, prompt, chat, max_new_tokens, seed, strategy, spec, app.settings)
        except ValueError as exc:
            raise user_error(exc) from None
        try:
            comp = submit_sweep(app, req)
        except QueueFull as exc:
            raise gr.Error(str(exc)) from None
        _progress(progress, 0.0, "sweeping (one greedy reference, then each setting)")
        try:
            async for update in _watch(app, comp, stop, progress):
                yield gr.skip(), update["status"]
        finally:
            comp.leave()
        result = await _settled(comp)
        if result is CANCELLED:
            yield gr.skip(), "Stopped the queued sweep before it started."
            return
        sweep, message = result
        yield sweep_figure(sweep), message


def _outputs(app: PlaygroundApp, doc: dict, message: str, trace_path: Optional[str],
             views: Optional[dict] = None) -> dict:
    """Every run view for a finished run or an imported trace (the document goes into the app's trace store)."""
    seen = survey(doc)                      # one pass over the events for both
    top = top_step(doc, seen)
    values = run_controls(app.store.put(doc, top), top, race_length_ms(doc["results"]), drafted(doc, seen),
                          trace_path, message)
    values.update(views if views is not None else draw_views(doc))
    return values


DRAWING = "<div class='dp-muted'>Drawing the token columns…</div>"
STOPPED = "<div class='dp-muted'>Stopped before the token columns were shown; move the step slider to draw them.</div>"


def _imported(doc: dict, drawn: str = "") -> str:
    return f"Imported a trace with {len(doc['results'])} strategies (no model needed).{drawn}"


def import_views(app: PlaygroundApp, path: Any, request: gr.Request = None) -> Iterator[dict]:
    """Replay an uploaded trace (no model needed), streamed: its place in line while it waits, then every view
    but the token columns as soon as they are drawn (the trace goes into the store: the step slider works),
    then the columns, the costliest (issue 39). It is read, checked and drawn in the app's line, as a run is
    computed (``compute.submit_import``), and Stop ends it. The last update holds every view. The file is not
    exported again: its owner has it."""
    with job(app, request) as (_, stop):
        if not isinstance(path, str) or not path:
            raise gr.Error("trace: choose a JSON file exported from this app")
        try:
            comp = submit_import(app, path)
        except QueueFull as exc:
            raise gr.Error(str(exc)) from None
        shown: Optional[dict] = None        # the first views, as sent
        said, left = None, False
        try:
            while not comp.done.wait(IMPORT_POLL_S if comp.state == "running" else WATCH_S):
                if stop.is_set():
                    comp.leave()            # its only watcher: taken out of line or stopped (a read under way ends)
                    left = True
                    comp.done.wait()
                    yield {"status": "Stopped the import."} if shown is None else {
                        "status": _imported(comp.live[0], " Stopped before its token columns were shown."),
                        "columns": STOPPED}
                    return
                text = waiting_text(app.line.place(comp)) if comp.state == "waiting" else None
                if text is not None and text != said:
                    said = text
                    yield {"status": text}
                if shown is None and comp.live is not None:
                    doc, views = comp.live
                    shown = _outputs(app, doc, _imported(doc, " Drawing the token columns…"), None,
                                     {**views, "columns": DRAWING})
                    yield shown
        finally:
            if not left:
                comp.leave()                # done; or the page went away (the generator closed): stop it
    if comp.state == "cancelled":
        yield {"status": "Stopped the import before it started."}
        return
    if comp.error is not None:
        if isinstance(comp.error, (OSError, ValueError)):    # a file over a cap, or not a trace: say which
            raise user_error(comp.error, "trace: ") from None
        raise comp.error
    doc, views = comp.result
    if shown is None:                       # done before its first views were looked at: all at once
        yield _outputs(app, doc, _imported(doc), None, views)
    else:                                   # every view again (unchanged ones cost nothing: Gradio sends diffs),
        yield {**shown, **views, "status": _imported(doc)}     # so the last update is the whole page


def import_file(app: PlaygroundApp, path: Any, request: gr.Request = None) -> dict:
    """:func:`import_views` to its end, as one update (for callers without a page)."""
    values: dict = {}
    for update in import_views(app, path, request):
        values.update(update)
    return values


# --------------------------------------------------------------------------- share links and exports (issue 40)
def _shared(app: PlaygroundApp, race_id: Any) -> Recording:
    """The recording a race id names; ValueError naming ``race_id`` when the id is malformed (checked before any
    lookup) or no recording held here has it."""
    rec = app.recordings.by_share(check_id(race_id))
    if rec is None:
        raise ValueError("race_id: no race with this id is held here (the server keeps its most recent races; "
                         "this one expired, or the link is mistyped)")
    return rec


def open_shared(app: PlaygroundApp, race_id: Any) -> dict:
    """The page opened with ``?race=<id>``: that race's views at once, replayed from its recording and labelled
    so (when, on what machine), nothing computed. A bad or unknown id: a message, and the page as it was."""
    if race_id is None:
        return {}
    try:
        rec = _shared(app, race_id)
    except ValueError as exc:
        return {"status": unknown_note(str(exc))}
    values = _replayed(app, rec)
    values["status"] = shared_note(rec.when(), rec.device, rec.message)
    return {**values, **share_views(rec.share)}


async def export_race(app: PlaygroundApp, race_id: Any, fmt: Any, mode: Any, request: Any = None) -> str:
    """The race ``race_id`` as an animated GIF or an MP4 (its path): drawn in the app's compute line, so it never
    runs beside a timed run; the same export asked again is the file already made."""
    with job(app, request) as (_, stop):
        try:
            check_format(fmt)
            check_mode(mode)
            rec = _shared(app, race_id)
        except ValueError as exc:
            raise user_error(exc, page=from_page(request)) from None
        key = (rec.share, fmt, mode)
        made = app.exports.get(key)
        if made is not None:
            return made
        try:
            comp = submit_export(app, rec.doc, fmt, mode, caption(rec.when(), rec.device), key)
        except QueueFull as exc:
            raise gr.Error(str(exc)) from None
        try:
            async for _ in _watch(app, comp, stop, None, frames=False):   # its place in line: no page to show it
                pass
        finally:
            comp.leave()
        path = await _settled(comp, page=from_page(request))
        if path is CANCELLED or path is None:
            raise gr.Error("Stopped the export before it finished.")
        return path
