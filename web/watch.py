"""One way for a handler to watch a computation in the app's line: :func:`watch`.

Every handler whose work uses the cores (a run, a sweep, an import, an export, the batch race) puts it in the app's
compute line and follows it the same way, written once here:

1. **submit**: the computation goes in line (a run may join the identical one under way); a full line is a
   refusal by name (``gr.Error`` with QueueFull's message), nothing is left in line;
2. **watch**: while it waits, the visitor's place in line; while it runs, the frames the handler draws from
   what it published; an ``await`` between looks, no thread held;
3. **leave** on Stop, or when the client is gone (the generator is closed): the last watcher to leave stops it
   (``Computation.leave``), so its slot is given back;
4. **settle**: the result, once it is done, as :class:`Settled`; a failure the visitor can act on
   (``refused``) becomes the handler's named error, without server paths; any other is raised as it was.

No store here: every value comes from the app the handler was given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import inspect
import threading
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Union

import gradio as gr

from decoding.runtime.models import ModelLoadError
from web.crowd import Computation, QueueFull
from web.app_object import PlaygroundApp
from web.redact import public_message

WATCH_S = 0.1         # how often a handler looks at its computation (an await, no thread held)
REFUSED = (ValueError, ModelLoadError)   # what only the computation could tell of a request: the visitor's to fix


def user_error(exc: BaseException, prefix: str = "", page: bool = True) -> gr.Error:
    """A message for the caller, without server paths: for the page, markup escaped so it shows as text (Gradio
    renders a page's error as HTML); for an API client (``page=False``), plain text as it was written."""
    message = prefix + public_message(exc)
    return gr.Error(html.escape(message, quote=False) if page else message)


def waiting_text(place: Optional[tuple[int, int, float]]) -> Optional[str]:
    if place is None:
        return None
    position, waiting, eta = place
    ahead = "you are next" if position == 1 else f"you are number {position} in line"
    return (f"Waiting for the compute slot: {ahead} ({waiting} waiting); starts in about "
            f"{max(1, round(eta))} s.")


def progress_to(progress: Any, fraction: float, desc: str) -> None:
    if progress is not None:
        progress(fraction, desc=desc)


@dataclasses.dataclass
class Settled:
    """How a watched computation ended for this watcher (always :func:`watch`'s last item)."""
    comp: Computation
    left: bool = False       # this watcher left before it was done (Stop): ``result`` is what it made until then
    others: int = 0          # left while others still watch: it goes on for them, and ``result`` is None
    cancelled: bool = False  # taken out of line before it started: no result

    @property
    def result(self) -> Any:
        return None if self.cancelled or self.others else self.comp.result


def alone(kind: str, work: Callable[[Computation], Any], units: float = 0) -> Computation:
    """``work`` as a computation watched by its one caller and never shared (``watch`` puts it in line)."""
    return Computation(f"{kind}-{uuid.uuid4().hex}", work, units=units)


def _submitted(app: PlaygroundApp, job: Union[Computation, Callable[[], Computation]]) -> Computation:
    """``job`` subscribed and in ``app``'s line: a computation of its own (put in line here), or a callable that
    joins or submits one (a run: ``compute.submit_run``). A full line: the refusal, by name."""
    try:
        if isinstance(job, Computation):
            job.subscribe()
            app.line.submit(job)
            return job
        return job()
    except QueueFull as exc:
        raise gr.Error(str(exc)) from None


async def _looks(app: PlaygroundApp, comp: Computation, stop: threading.Event, progress: Any,
                 frame: Optional[Callable[[Computation], Any]], running_s: float) -> AsyncIterator[dict]:
    """The updates while it is neither done nor stopped: the place in line while it waits (said when it changes),
    ``frame(comp)`` (or what it awaits) for each new publication while it runs (None: nothing to show)."""
    seen: Any = None
    while not comp.done.is_set() and not stop.is_set():
        if comp.state == "waiting":
            text = waiting_text(app.line.place(comp))
            if text is not None and text != seen:
                seen = text
                progress_to(progress, 0.0, text)
                yield {"status": text}
        elif frame is not None and comp.live is not None and comp.version != seen:
            seen = comp.version
            update = frame(comp)
            if inspect.isawaitable(update):      # a frame drawn in a worker thread (an import's first views)
                update = await update
            if update is not None:
                yield update
        await asyncio.sleep(running_s if comp.state == "running" else WATCH_S)


async def watch(app: PlaygroundApp, job: Union[Computation, Callable[[], Computation]], stop: threading.Event, *,
                progress: Any = None, starting: str = "", frame: Optional[Callable[[Computation], Any]] = None,
                refused: tuple = REFUSED, prefix: str = "", page: bool = True,
                running_s: float = WATCH_S) -> AsyncIterator[Union[dict, Settled]]:
    """Submit ``job`` to ``app``'s line, watch it, leave it on ``stop`` (or when closed), and settle it.

    Yields view updates (``{"status": place in line}``, and ``frame(comp)``'s while it runs), then a
    :class:`Settled`. Raises ``gr.Error`` for a full line, and for a failure of a ``refused`` type (message:
    ``prefix`` and the error, escaped for the page unless ``page`` is false); any other failure as it was.
    ``starting``: the progress bar's first words. ``running_s``: how often it looks while it runs."""
    comp = _submitted(app, job)
    if starting:
        progress_to(progress, 0.0, starting)
    try:
        async for update in _looks(app, comp, stop, progress, frame, running_s):
            yield update
    finally:
        left = not comp.done.is_set()
        others = comp.leave()           # the last one to leave (Stop, a closed page) stops it: its slot is freed
    if left and others > 0:
        yield Settled(comp, left=True, others=others)
        return
    while not comp.done.is_set():
        await asyncio.sleep(WATCH_S)
    if comp.state == "cancelled":
        yield Settled(comp, left=left, cancelled=True)
        return
    if comp.error is not None:
        if isinstance(comp.error, refused):
            raise user_error(comp.error, prefix, page=page) from None
        raise comp.error
    yield Settled(comp, left=left)
