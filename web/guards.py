"""Bounded resources of the web service: request bodies, trace files on disk, replay documents in memory,
suffix-decoding histories.

Each of these grows with what visitors send, so each has a fixed bound that no
sequence of requests can exceed. No Gradio here: ``BodyLimit`` is plain ASGI.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import threading
from typing import Any, Awaitable, Callable, Optional

from decoding.drafting.suffix import SuffixHistory
from web.bounded import Bounded, remove_file, temp_folder
from web.memory import held_bytes

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: answer 413 to a request body over its limit, before the app buffers it.

    ``larger`` maps path suffixes (Gradio's ``/upload``) to their own limit; every
    other path gets ``default``. Content-Length is checked first; bodies without
    one are counted as they arrive.
    """

    def __init__(self, app: Callable, default: int, larger: Optional[dict[str, int]] = None) -> None:
        self.app, self.default, self.larger = app, default, dict(larger or {})

    def limit_for(self, path: str) -> int:
        return next((n for suffix, n in self.larger.items() if path.endswith(suffix)), self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(send, limit)
            return
        received, started, over = 0, False, False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise _TooLarge()
            return message

        async def watched(message: Message) -> None:
            # once the body ran over, whatever the app answers (it may have caught _TooLarge) becomes our 413
            nonlocal started
            if over:
                if not started:
                    started = True
                    await self._refuse(send, limit)
                return
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await self._refuse(send, limit)

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        body = json.dumps({"detail": f"request body over the limit of {limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class TraceFiles:
    """Exported trace files in one directory of this process; only the newest ``keep`` stay."""

    def __init__(self, keep: int, directory: Optional[str] = None) -> None:
        self.directory = directory or temp_folder("decoding-playground-traces-")
        self._paths = Bounded(max_items=keep, on_drop=lambda path, _: remove_file(path))

    @property
    def keep(self) -> int:
        return self._paths.max_items

    @keep.setter
    def keep(self, value: int) -> None:
        self._paths.max_items = value

    def write(self, text: str) -> str:
        fd, path = tempfile.mkstemp(prefix="decoding-trace-", suffix=".json", dir=self.directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        self._paths.put(path, True)
        return path

    def holds(self, path: Any) -> bool:
        """Whether ``path`` is one of the files kept here and still on disk (a recording's file, written once and
        served to every replay of it, is written again once it was dropped)."""
        return isinstance(path, str) and self._paths.get(path) is not None and os.path.isfile(path)

    def count(self) -> int:
        return len(os.listdir(self.directory))


class TraceStore:
    """Replay documents of all sessions, least recently used dropped first beyond ``max_bytes`` of memory (one
    document over the whole budget is held alone).

    A session's ``gr.State`` holds only a random key, so a visitor holds no
    memory beyond this shared budget, however many sessions or imports they
    make. A document counts what it holds in memory, measured on it (``web/memory.held_bytes``):
    its JSON size says little (``{}`` is 2 bytes of JSON and 64 of memory).
    """

    def __init__(self, max_bytes: int, frame_bytes: int = 16 << 20) -> None:
        self.max_bytes = max_bytes
        # key -> (doc, size, top step, whether it replays a recorded run, the recording's id or None)
        self._docs = Bounded(max_bytes=max_bytes, sizeof=lambda entry: entry[1], oversized="alone")
        # (recording's id, frame's time) -> a frame of its wall-clock race, drawn once for every visitor
        self._frames = Bounded(max_bytes=frame_bytes, sizeof=lambda text: sys.getsizeof(text))
        self._drawing = threading.Lock()

    def put(self, doc: dict, top: int, replay: bool = False, size: Optional[int] = None,
            shared: Optional[str] = None) -> str:
        """Hold ``doc`` under a new random key; ``replay`` marks a recorded run replayed (its race autoplays);
        ``size``: its bytes when measured already (a recording's, measured once for all its replays); ``shared``:
        the recording's id, under which every visitor replaying it shares the frames of its race (``frame``)."""
        key = secrets.token_urlsafe(16)
        self._docs.put(key, (doc, held_bytes(doc) if size is None else size, top, replay, shared))
        return key

    def frame(self, key: Any, at: float, draw: Callable[[], str]) -> str:
        """``draw()``, the frame at ``at`` of the race held under ``key``: for a recording's replay, drawn once
        and kept (bounded, least recently used dropped) for every visitor whose replay reaches that time;
        anything else, drawn for this caller alone."""
        entry = self._docs.get(key) if isinstance(key, str) else None
        if entry is None or entry[4] is None:
            return draw()
        with self._drawing:                 # visitors ticking together wait for one drawing, not one each
            frame = self._frames.get((entry[4], at))
            if frame is None:
                frame = draw()
                self._frames.put((entry[4], at), frame)
            return frame

    def is_replay(self, key: Any) -> bool:
        entry = self._docs.get(key) if isinstance(key, str) else None
        return entry is not None and entry[3]

    def get(self, key: Any) -> Optional[tuple[dict, int]]:
        """(document, top replay step), or None when the key is unknown or was dropped."""
        entry = self._docs.get(key) if isinstance(key, str) else None
        return None if entry is None else (entry[0], entry[2])

    def __len__(self) -> int:
        return len(self._docs)

    @property
    def held_bytes(self) -> int:
        return int(self._docs.held_bytes)


# --------------------------------------------------------------------------- suffix-decoding histories
class Histories:
    """One ``SuffixHistory`` per browser session, so one visitor's outputs never draft for another's.

    Held here, server-side, keyed by the session id (never in ``gr.State``, which
    the browser round-trips). Bounded three ways: at most ``sessions`` histories
    (the least recently used dropped first), ``max_tokens`` tokens each (the
    history drops its oldest outputs), and ``max_nodes`` suffix-tree nodes over
    all of them (least recently used histories dropped until under; one over the
    whole budget on its own is dropped too). The two outer bounds are a
    :class:`web.bounded.Bounded` sized in nodes, counted again after each add.
    """

    def __init__(self, sessions: int, max_tokens: int, max_nodes: int,
                 factory: Optional[Callable[[int], Any]] = None, unshared: tuple[str, ...] = ()) -> None:
        self.sessions, self.max_tokens, self.max_nodes = sessions, max_tokens, max_nodes
        self.unshared = unshared      # session ids that name no single visitor: they get no history
        self._factory = factory or _suffix_history
        self._held = Bounded(max_items=sessions, max_bytes=max_nodes, sizeof=lambda history: len(history.tree))
        self._lock = threading.Lock()

    def get(self, session: Optional[str]) -> Any:
        """This session's history (created on first use); None without a session (nothing keeps it apart)."""
        if not session or session in self.unshared:
            return None
        with self._lock:                # one history per session, however many of its requests ask at once
            history = self._held.get(session)
            if history is None:
                history = self._factory(self.max_tokens)
                self._held.put(session, history)
            return history

    def items(self, session: Optional[str]) -> Optional[list[list[int]]]:
        """A copy of this session's earlier outputs (None: this request keeps no history)."""
        history = self.get(session)
        if history is None:
            return None
        with history.lock:
            return [list(tokens) for tokens in history.items]

    def add(self, session: Optional[str], outputs: list[list[int]]) -> None:
        """Remember a run's outputs for this session, then keep every bound (its nodes counted again)."""
        history = self.get(session)
        if history is not None:
            for tokens in outputs:
                history.add(tokens)
            self._held.resize(session)

    def clear(self, session: Optional[str]) -> int:
        """Forget this session's earlier outputs; returns how many there were."""
        history = self._held.pop(session) if session else None
        return len(history) if history is not None else 0

    def nodes(self) -> int:
        """Suffix-tree nodes held over all sessions."""
        return int(self._held.held_bytes)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, session: str) -> bool:
        return session in self._held


def _suffix_history(max_tokens: int) -> Any:
    return SuffixHistory(max_tokens=max_tokens)


def history_from(items: Optional[list], max_tokens: int) -> Any:
    """A ``SuffixHistory`` holding ``items`` (earlier outputs), or None: a run's own copy of a session's
    history. The run drafts from the copy; the caller adds the run's outputs to the session's history,
    so a run in another process (ZeroGPU) keeps the same contract."""
    if items is None:
        return None
    history = _suffix_history(max_tokens)
    for tokens in items:
        history.add(tokens)
    return history
