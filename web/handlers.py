"""The app's Gradio event functions: thin functions of one app object (``web/app_object.PlaygroundApp``).

Each handler takes the app first, then plain values: it validates (``web/validation.py``, ``web/requests.py``), hands the work to the
app's line (``web/compute.py``'s work, watched by ``web/watch.watch``) or its stores, and returns (or, for a run, yields) ``{view name: value}``;
``app.py`` maps view names onto components, builds the page and wires the events by name. Which view shows
what comes from ``visualize/page.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from typing import Any, AsyncIterator, Iterator, Optional

import anyio
import gradio as gr

from visualize.animation import check_mode
from visualize.charts import sweep_figure
from visualize.page import drafted, survey, top_step
from visualize.race import live_columns_html, live_status, race_length_ms
from web.compute import Outcome, draw_views, import_work, submit_run, sweep_work
from web.crowd import Computation
from web.recordings import Recording
from web.documents import history_outputs
from web.export import caption, check_format, render
from web.jobs import SESSION_FALLBACK
from web.playback import replay_outputs, run_controls
from web.app_object import PlaygroundApp
from web.requests import RunRequest, run_request, sweep_request
from web.validation import GENERATION_FIELDS
from web.share import check_id, share_views, shared_note, unknown_note
from web.watch import Settled, alone, progress_to, user_error, watch

IMPORT_POLL_S = 0.02  # how often a running import is looked at (its first views are shown the moment they are drawn)
SWEEPING = "sweeping (one greedy reference, then each setting)"

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


# --------------------------------------------------------------------------- who asked
def from_page(request: Any) -> bool:
    """Whether an event came from the page rather than an API client: Gradio's own browser client says
    ``x-gradio-user: app`` (its Python and JavaScript clients say ``api``); no request (a direct call) is not
    the page."""
    headers = getattr(request, "headers", None)
    return headers is not None and headers.get("x-gradio-user") == "app"


def _frame(comp: Computation) -> dict:
    """The live columns and status line of a running computation (drawn once per update for all watchers)."""
    def draw() -> dict:
        snap, max_new = comp.live
        return {"columns": live_columns_html(snap), "status": live_status(snap, max_new)}
    return comp.memo("frame", comp.version, draw)


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

    def frame(comp: Computation) -> dict:
        update = _frame(comp)
        progress_to(progress, _fraction(*comp.live), update["status"])
        return update
    async with contextlib.aclosing(watch(app, lambda: submit_run(app, req)[0], stop, progress=progress,
                                         starting="starting", frame=frame if frames else None, page=frames)) as ups:
        async for item in ups:
            if not isinstance(item, Settled):
                yield item
            elif item.others:
                n, shown = item.others, _frame(item.comp) if frames and item.comp.live else {}
                yield {**shown, "status": f"Stopped watching. {n} other visitor{'s' * (n != 1)} asked for this "
                                          f"same run, so it goes on for them."}
            elif item.cancelled:
                yield {"status": "Stopped the queued run before it started."}
            else:
                app.histories.add(session, item.result.outputs)
                yield Finished(item.result.doc, outcome=item.result, joined=item.comp.visitors)


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
        work = alone("sweep", sweep_work(app, req), req.units)
        async with contextlib.aclosing(watch(app, work, stop, progress=progress, starting=SWEEPING)) as updates:
            async for item in updates:
                if not isinstance(item, Settled):
                    yield gr.skip(), item["status"]
                elif item.cancelled:
                    yield gr.skip(), "Stopped the queued sweep before it started."
                else:
                    sweep, message = item.result
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


async def import_views(app: PlaygroundApp, path: Any, request: gr.Request = None) -> AsyncIterator[dict]:
    """Replay an uploaded trace (no model needed), streamed: its place in line while it waits, then every view
    but the token columns as soon as they are drawn (the trace goes into the store: the step slider works),
    then the columns, the costliest (issue 39). It is read, checked and drawn in the app's line, as a run is
    computed (``compute.import_work``), and Stop ends it. The last update holds every view. The file is not
    exported again: its owner has it."""
    with job(app, request) as (_, stop):
        if not isinstance(path, str) or not path:
            raise gr.Error("trace: choose a JSON file exported from this app")
        first: list[dict] = []          # the first views, as sent

        async def frame(comp: Computation) -> Optional[dict]:
            if first:
                return None
            doc, views = comp.live
            first.append(await anyio.to_thread.run_sync(lambda: _outputs(
                app, doc, _imported(doc, " Drawing the token columns…"), None, {**views, "columns": DRAWING})))
            return first[0]
        work = alone("import", import_work(path, app.limits.upload_bytes))
        async with contextlib.aclosing(watch(app, work, stop, frame=frame, refused=(OSError, ValueError),
                                             prefix="trace: ", running_s=IMPORT_POLL_S)) as updates:
            async for item in updates:
                yield item if not isinstance(item, Settled) else await _import_ended(app, item, first)


async def _import_ended(app: PlaygroundApp, end: Settled, first: list[dict]) -> dict:
    """An import's last update: every view (unchanged ones cost nothing: Gradio sends diffs), or what Stop left."""
    if end.cancelled or (end.left and not first):
        return {"status": "Stopped the import."}
    if end.left:
        return {"status": _imported(end.comp.live[0], " Stopped before its token columns were shown."),
                "columns": STOPPED}
    doc, views = end.result
    if not first:                           # done before its first views were looked at: all at once
        return await anyio.to_thread.run_sync(lambda: _outputs(app, doc, _imported(doc), None, views))
    return {**first[0], **views, "status": _imported(doc)}


async def import_file(app: PlaygroundApp, path: Any, request: gr.Request = None) -> dict:
    """:func:`import_views` to its end, as one update (for callers without a page)."""
    values: dict = {}
    async with contextlib.aclosing(import_views(app, path, request)) as updates:
        async for update in updates:
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
        note = caption(rec.when(), rec.device)
        work = alone("export", lambda c: render(rec.doc, fmt, mode, note, app.exports, key))
        async with contextlib.aclosing(watch(app, work, stop, page=from_page(request))) as updates:
            async for item in updates:      # its place in line: no page to show it
                if isinstance(item, Settled) and item.result is not None:
                    return item.result
        raise gr.Error("Stopped the export before it finished.")
