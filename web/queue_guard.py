"""Keeps this app's Gradio queue alive, brings it back if it stops anyway, and says how it is (``GET /healthz``).

Written against gradio 6.31.0 (``gradio/queueing.py``, ``gradio/routes.py``, ``gradio/utils.py``); the newest
6.x on PyPI when written, so no upgrade fixes it. Issue 25 item 4, "A queue that cannot die". The app reaches it
through ``web/gradio_overrides.py``, which records the Gradio every override fits and warns on another.

The trigger
-----------
Gradio keeps one message queue per session in ``Queue.pending_messages_per_session``, an
``LRUCache(2000)`` (queueing.py:132, utils.py:1596): inserting a 2001st session drops the *oldest* one,
whether or not that session still has an event waiting or running. Every ``POST /gradio_api/call/<api>``
without a session hash is a new session (``Event.session_hash`` defaults to the event id, queueing.py:70,
entry made in ``Queue.push``, queueing.py:360), and so is every new ``gradio_client.Client`` and browser
tab; entries are never removed when a call completes, only pushed out. The ``/call/`` routes queue every
function, ``queue=False`` ones included (routes.py:1672, ``queue_join_helper``), so a loop calling Stop
through ``/gradio_api/call/stop`` makes a session per call. After 2000 of them, the sessions of clients
still waiting in the queue (the oldest entries) are evicted, and the next message for them,
``Queue.send_message`` -> ``self.pending_messages_per_session[event.session_hash]`` (queueing.py:259),
raises ``KeyError``:

- from ``broadcast_estimations`` in ``start_processing`` (queueing.py:544/703): the KeyError leaves the
  processing loop, whose ``finally`` sets ``stopped = True`` and cancels every running job
  (queueing.py:547-549). Every later call is refused with ``503 {"detail": "Queue is stopped."}``
  (routes.py:1696) until the process restarts; nothing restarts it.
- from ``start_progress_updates`` (queueing.py:567): that loop ends; no progress is sent again.
- from ``process_events`` (queueing.py:785 ``ProcessStartsMessage``, 913 ``ProcessGeneratingMessage`` for a
  generator like Run, 1014/1041 the completion): caught there (queueing.py:1088), but the job is abandoned
  and its client never hears of it again (the "lost silently" runs).

Any client that waits while 2000 other sessions arrive is exposed; the Stop loop just makes that happen
within a few minutes. Closing a queued or running client's stream does not trigger it: routes.py deletes
that session's entry (routes.py:1902) but ``clean_events`` marks its events dead in the same step.

The guard (this app's queue instance only; nothing in Gradio is patched globally)
----------------------------------------------------------------------------------
1. :class:`SessionMessages` replaces the ``LRUCache``: same bound, but a session with an event still
   queued or running is never the one evicted (the oldest idle session goes instead). This removes the
   trigger. A session whose run has *finished* but whose answer its stream has not yet read (Gradio keeps
   the event id in ``pending_event_ids_session`` until then, routes.py:1866) is spared for ``GRACE_S``
   after the answer was sent: evicted in that window, its stream's next look finds no entry and answers
   404, and the client sees its finished run cancelled (what a Stop storm did to one run in eight on a busy
   machine). Past the grace such a session is idle (a ``/call/`` whose caller never reads, say); the
   spared-in-grace ones may push the count past the bound only up to ``2 * max_size``, and beyond it the ones
   answered longest ago go first. A session with a message stream open (``GET …/queue/data`` or ``GET
   …/call/<api>/<event_id>``, seen by :class:`Health`) is never evicted while it is read: bounded by the
   open connections. An evicted session's undelivered event ids go with it (Gradio never drops them).
2. :meth:`GuardedQueue.send_message`: a message for a live event whose session has no message queue
   (any other way an entry could go missing) gets a fresh one instead of raising ``KeyError`` in the
   queue's loops.
3. A watchdog (one asyncio task beside the queue's loops): if the processing or progress loop has ended
   or the queue says ``stopped`` while the app runs, it records why, starts the loops again and answers
   the jobs the dead loop cancelled with an error (their clients would otherwise wait forever).
4. :class:`Health`: ``GET /healthz`` answers ``{"ok": ..., "queue": {...}}``, 200 when the queue is
   serving and 503 when it is not (see :func:`queue_health`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from asyncio import Queue as AsyncQueue
from collections import OrderedDict
from typing import Any, Optional
from urllib.parse import unquote

from gradio import queueing
from gradio.exceptions import Error
from gradio.server_messages import ProcessCompletedMessage
from gradio.utils import LRUCache, error_payload

WATCH_S = 1.0                      # how often the watchdog looks at the queue's loops
GRACE_S = 30.0                     # how long a finished run's unread answer keeps its session from eviction
HEALTH_PATH = "/healthz"
LOOPS = {"processing": "start_processing", "progress": "start_progress_updates"}
NOTIFY_LOOP = ("estimates", "notify_clients")       # runs only when the queue has no live updates
# what the guard reads and replaces; a Gradio without them is left alone (install returns False)
REQUIRED = ("pending_messages_per_session", "event_ids_to_events", "active_jobs", "start_processing",
            "start_progress_updates", "send_message", "_cancel_asyncio_tasks", "stopped", "live_updates")
RESTART_MESSAGE = "The server's queue restarted while this job ran; run it again."

log = logging.getLogger(__name__)


class SessionMessages(LRUCache):
    """Gradio's per-session message queues, bounded like its ``LRUCache``, except that a session whose event
    is still queued or running is never evicted, and one whose finished run's answer is still unread is
    spared for ``GRACE_S``: the oldest idle session goes instead. When every session is busy (at most the
    queue's size plus the running jobs) the bound is exceeded rather than a client lost; sessions spared only
    by the grace exceed it up to ``2 * max_size``, then the oldest of them go too."""

    def __init__(self, max_size: int = 2000, queue: Any = None, grace_s: Optional[float] = None) -> None:
        super().__init__(max_size)
        self.queue = queue
        self.grace_s = grace_s
        self.answered: dict[Any, float] = {}   # session -> when its last answer (a completion) was sent
        self.listening: dict[Any, int] = {}    # session -> its open message streams (GET /queue/data, /call/...)
        self.evicted = 0           # idle sessions dropped to stay within the bound
        self.spared = 0            # busy sessions that Gradio's LRUCache would have dropped

    def __setitem__(self, key: Any, value: Any) -> None:
        if key in self:
            self.move_to_end(key)
        elif len(self) >= self.max_size:
            self._evict(len(self) - self.max_size + 1)
        OrderedDict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        OrderedDict.__delitem__(self, key)
        self.answered.pop(key, None)

    def pop(self, key: Any, *default: Any) -> Any:
        self.answered.pop(key, None)
        return OrderedDict.pop(self, key, *default)

    def clear(self) -> None:
        OrderedDict.clear(self)
        self.answered.clear()

    def listen(self, key: Any, change: int) -> None:
        """A message stream for ``key`` opened (+1) or closed (-1): a session someone is reading is not idle."""
        n = self.listening.get(key, 0) + change
        if n > 0:
            self.listening[key] = n
        else:
            self.listening.pop(key, None)

    def mark_answered(self, key: Any, at: Optional[float] = None) -> None:
        """A completion was put in ``key``'s queue: its stream has ``GRACE_S`` to read it before eviction."""
        if key in self:
            self.answered[key] = time.monotonic() if at is None else at

    def _unread(self, now: float) -> set:
        """Sessions with an answer sent less than ``GRACE_S`` ago that their stream has not read yet."""
        grace = GRACE_S if self.grace_s is None else self.grace_s
        pending = getattr(self.queue, "pending_event_ids_session", {}) if self.queue is not None else {}
        return {key for key, at in self.answered.items() if now - at < grace and pending.get(key)}

    def _evict(self, count: int) -> None:
        busy = busy_sessions(self.queue) if self.queue is not None else set()
        busy.update(self.listening)             # read by an open stream: bounded by the open connections
        unread = self._unread(time.monotonic()) if self.answered else set()
        victims, spared_unread = [], []
        for key in self:                        # oldest first; stops at the first `count` idle ones
            if key in busy or key in unread:
                self.spared += 1
                if key in unread and key not in busy:
                    spared_unread.append(key)
                continue
            victims.append(key)
            if len(victims) >= count:
                break
        # the grace never holds more than max_size sessions past the bound: then the unread ones answered longest
        # ago go (a caller that never reads was answered at once; a client whose run just ended, last)
        over = len(self) - len(victims) + 1 - 2 * self.max_size
        spared_unread.sort(key=lambda key: self.answered[key])
        victims += spared_unread[:max(0, min(over, count - len(victims)))]
        pending = getattr(self.queue, "pending_event_ids_session", None)
        for key in victims:
            del self[key]
            if isinstance(pending, dict):       # its undelivered ids can never be read now
                pending.pop(key, None)
        self.evicted += len(victims)


def busy_sessions(queue: Any) -> set:
    """Sessions with an event queued or running (Gradio drops an event from ``event_ids_to_events`` when it
    finishes, is removed from the queue or is cleaned up with its closed stream)."""
    events = list(queue.event_ids_to_events.values())
    events += [event for job in list(queue.active_jobs) if job for event in job]
    return {event.session_hash for event in events}


class GuardedQueue(queueing.Queue):
    """Gradio's ``Queue`` with the guard: assigned to one app's queue instance by :func:`install`."""

    def _guard_init(self) -> None:
        old = self.pending_messages_per_session
        messages = SessionMessages(getattr(old, "max_size", 2000), queue=self)
        for key, value in list(old.items()):
            OrderedDict.__setitem__(messages, key, value)
        self.pending_messages_per_session = messages
        self.guard_loops: dict[str, asyncio.Task] = {}
        self.guard_watchdog: Optional[asyncio.Task] = None
        self.guard_closed = False
        self.guard_restarts = 0
        self.guard_failures: list[dict] = []     # the newest few: {"at", "loop", "error"}
        self.guard_recreated = 0                  # messages whose session queue had gone
        self.guard_orphans: list = []             # jobs cancelled by a dying processing loop

    # ----------------------------------------------------------------- a call that names no session
    async def push(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        """A call that names no session (a plain HTTP client of ``/call/<api>``) gets a fresh one before it is
        queued. Gradio 6.31 gives it its event's id later, but first runs the queue validator with a throwaway
        ``SessionState`` (``route_utils.restore_session_state``), whose config of every block of the page was
        about 40 % of the server's time when 16 such visitors pressed Run on a recorded race. Named now, the
        validator finds the session in the app's (lean) state holder, and the call is its own session as before."""
        if getattr(body, "session_hash", "") is None:
            body.session_hash = uuid.uuid4().hex
        return await super().push(body, *args, **kwargs)

    # ----------------------------------------------------------------- the failing call
    def send_message(self, event: Any, event_message: Any) -> None:
        if event.alive and event.session_hash not in self.pending_messages_per_session:
            self.pending_messages_per_session[event.session_hash] = AsyncQueue()
            self.guard_recreated += 1
        super().send_message(event, event_message)
        if event.alive and isinstance(event_message, ProcessCompletedMessage):
            self.pending_messages_per_session.mark_answered(event.session_hash)

    # ----------------------------------------------------------------- the loops and their watchdog
    def start(self) -> None:
        """Gradio's ``Queue.start`` (6.31), keeping the loops' tasks so the watchdog can see them end."""
        self.active_jobs = [None] * self.max_thread_count
        self.guard_closed = False
        self._start_loops(self._loop_names())
        loop = asyncio.get_event_loop()
        watchdog = self.guard_watchdog
        if watchdog is None or watchdog.done() or watchdog.get_loop() is not loop:   # a relaunch has a new loop
            self.guard_watchdog = loop.create_task(self._watch())

    def close(self) -> None:
        # called from the closing thread, not the server's loop: the watchdog sees the flag and ends itself
        self.guard_closed = True
        super().close()

    def _loop_names(self) -> dict[str, str]:
        return {**LOOPS, **({} if self.live_updates else dict([NOTIFY_LOOP]))}

    def _start_loops(self, names: dict[str, str]) -> None:
        loop = asyncio.get_event_loop()
        for name, method in names.items():
            self.guard_loops[name] = loop.create_task(getattr(self, method)())

    def _cancel_asyncio_tasks(self) -> None:
        # called only from the end of start_processing: the jobs it ran are about to be cancelled
        self.guard_orphans = [event for job in list(self.active_jobs) if job for event in job]
        super()._cancel_asyncio_tasks()

    def dead_loops(self) -> list[str]:
        return [name for name, task in self.guard_loops.items() if task.done()]

    async def _watch(self) -> None:
        while not self.guard_closed:
            await asyncio.sleep(WATCH_S)
            try:
                self.revive()
            except Exception:                     # noqa: BLE001 - the watchdog itself must not die
                log.exception("queue watchdog: revive failed")

    def revive(self) -> bool:
        """Start the queue's ended loops again (and clear ``stopped``) unless the app closed it; True if it did."""
        if self.guard_closed or not self.guard_loops:
            return False
        dead = self.dead_loops()
        if not dead and not self.stopped:
            return False
        for name in dead:
            task = self.guard_loops[name]
            error = None if task.cancelled() else task.exception()
            self._record(name, repr(error) if error else "ended")
        if self.stopped and not dead:
            self._record("processing", "stopped")
        self.stopped = False
        self._start_loops({name: method for name, method in self._loop_names().items()
                           if name in dead or name not in self.guard_loops})
        orphans, self.guard_orphans = self.guard_orphans, []
        for event in orphans:                     # their process_events was cancelled: no answer would come
            content = error_payload(Error(RESTART_MESSAGE), True)
            self.send_message(event, ProcessCompletedMessage(output=content, title=content.get("title") or "Error",
                                                             success=False))
        self.guard_restarts += 1
        log.error("Gradio queue restarted (%s); %d running job(s) answered with an error",
                  ", ".join(dead) or "stopped", len(orphans))
        return True

    def _record(self, loop: str, error: str) -> None:
        self.guard_failures = [*self.guard_failures[-4:], {"at": time.time(), "loop": loop, "error": error}]


def install(blocks: Any) -> bool:
    """Put the guard on ``blocks``' queue (call before ``launch``). False, with a warning, when the queue is
    not Gradio's own or lacks what the guard relies on (another Gradio version): it is then left as it was."""
    queue = getattr(blocks, "_queue", None)
    if isinstance(queue, GuardedQueue):
        return True
    if type(queue) is not queueing.Queue or not all(hasattr(queue, name) for name in REQUIRED):
        log.warning("queue guard not installed: %r is not the Gradio Queue it was written for", type(queue))
        return False
    queue.__class__ = GuardedQueue
    queue._guard_init()
    # Gradio rebuilds a pandas summary of up to 10,000 past events after every finished job (about 22 ms
    # here); under a storm of API calls that is most of the CPU. Every 100 jobs is often enough for a summary.
    if hasattr(queue, "ANAYLTICS_CACHE_FREQUENCY"):
        queue.ANAYLTICS_CACHE_FREQUENCY = max(queue.ANAYLTICS_CACHE_FREQUENCY, 100)
    return True


def queue_health(blocks: Any) -> dict:
    """``{"ok": bool, "queue": {...}}``: ok when the app runs, its queue is not stopped and every queue loop
    runs. ``queue``: ``state`` (running / stopped / not started / closed), ``loops`` (name -> running or
    ended), ``waiting`` and ``max_size`` (events in the queue, its bound), ``running`` (jobs being run),
    ``sessions`` (message queues held), ``restarts`` and ``failures`` (what the watchdog saw, newest last),
    ``guarded`` (whether the guard is on this queue)."""
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return {"ok": False, "queue": {"state": "none"}}
    guarded = isinstance(queue, GuardedQueue)
    loops = ({name: "ended" if task.done() else "running" for name, task in queue.guard_loops.items()}
             if guarded else {})
    if guarded and queue.guard_closed or not getattr(blocks, "is_running", False):
        state = "closed" if guarded and queue.guard_closed else "not started"
    elif guarded and not loops:
        state = "not started"
    elif queue.stopped:
        state = "stopped"
    else:
        state = "running"
    info = {"state": state, "loops": loops, "waiting": len(queue), "max_size": queue.max_size,
            "running": queue.get_active_worker_count(), "sessions": len(queue.pending_messages_per_session),
            "guarded": guarded}
    if guarded:
        info.update(restarts=queue.guard_restarts, failures=queue.guard_failures,
                    sessions_evicted=queue.pending_messages_per_session.evicted,
                    sessions_spared=queue.pending_messages_per_session.spared)
    ok = state == "running" and all(v == "running" for v in loops.values())
    return {"ok": ok, "queue": info}


def stream_session(scope: dict, queue: Any) -> Optional[str]:
    """The session a request streams messages of, or None: ``GET …/queue/data?session_hash=…`` (a browser tab or
    ``gradio_client``), or ``GET …/call/<api>/<event_id>`` (the session holding that event, as Gradio finds it;
    the event id itself for a call that sent no session)."""
    if scope.get("method") != "GET":
        return None
    path = scope.get("path") or ""
    if path.endswith("/queue/data"):
        for part in (scope.get("query_string") or b"").split(b"&"):
            name, _, value = part.partition(b"=")
            if name == b"session_hash" and value:
                return unquote(value.decode("latin-1"))
        return None
    head, _, event_id = path.rpartition("/")
    if "/call/" not in head + "/" or not event_id:
        return None
    pending = getattr(queue, "pending_event_ids_session", None) or {}
    return next((session for session, ids in list(pending.items()) if event_id in ids), event_id)


class Health:
    """ASGI middleware answering ``GET``/``HEAD /healthz`` with :func:`queue_health` (200 when ok, else 503);
    every other request goes on to the app. A middleware, so it exists before Gradio adds its routes."""

    def __init__(self, app: Any, blocks: Any, path: str = HEALTH_PATH) -> None:
        self.app, self.blocks, self.path = app, blocks, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("GET", "HEAD") or \
                scope.get("path") not in (self.path, scope.get("root_path", "") + self.path):
            messages = getattr(getattr(self.blocks, "_queue", None), "pending_messages_per_session", None)
            key = stream_session(scope, getattr(self.blocks, "_queue", None)) \
                if isinstance(messages, SessionMessages) else None
            if key is None:
                await self.app(scope, receive, send)
                return
            messages.listen(key, +1)            # its session stays while the stream is open
            try:
                await self.app(scope, receive, send)
            finally:
                messages.listen(key, -1)
            return
        health = queue_health(self.blocks)
        body = json.dumps(health).encode()
        await send({"type": "http.response.start", "status": 200 if health["ok"] else 503,
                    "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-store"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
