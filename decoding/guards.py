"""Bounded resources of the web service: request bodies, trace files on disk, replay documents in memory.

Each of these grows with what visitors send, so each has a fixed bound that no
sequence of requests can exceed. No Gradio here: ``BodyLimit`` is plain ASGI.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections import OrderedDict, deque
from typing import Any, Awaitable, Callable, Optional

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
        self.keep = keep
        self.directory = directory or tempfile.mkdtemp(prefix="decoding-playground-traces-")
        self._paths: deque[str] = deque()
        self._lock = threading.Lock()
        if directory is None:
            atexit.register(shutil.rmtree, self.directory, True)

    def write(self, text: str) -> str:
        fd, path = tempfile.mkstemp(prefix="decoding-trace-", suffix=".json", dir=self.directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        with self._lock:
            self._paths.append(path)
            while len(self._paths) > self.keep:
                old = self._paths.popleft()
                try:
                    os.remove(old)
                except FileNotFoundError:
                    pass
        return path

    def count(self) -> int:
        return len(os.listdir(self.directory))


class TraceStore:
    """Replay documents of all sessions, least recently used dropped first beyond ``max_bytes`` of memory.

    A session's ``gr.State`` holds only a random key, so a visitor holds no
    memory beyond this shared budget, however many sessions or imports they
    make. A document's memory is estimated from its JSON size (``PER_JSON_BYTE``).
    """

    PER_JSON_BYTE = 5   # Python objects per byte of JSON: 4.6 measured on an event-heavy trace

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._docs: OrderedDict[str, tuple[dict, int, int]] = OrderedDict()   # key -> (doc, size, top step)
        self._held = 0
        self._lock = threading.Lock()

    def put(self, doc: dict, json_bytes: int, top: int) -> str:
        key = secrets.token_urlsafe(16)
        size = json_bytes * self.PER_JSON_BYTE
        with self._lock:
            self._docs[key] = (doc, size, top)
            self._held += size
            while self._held > self.max_bytes and len(self._docs) > 1:
                _, (_, old, _) = self._docs.popitem(last=False)
                self._held -= old
        return key

    def get(self, key: Any) -> Optional[tuple[dict, int]]:
        """(document, top replay step), or None when the key is unknown or was dropped."""
        if not isinstance(key, str):
            return None
        with self._lock:
            entry = self._docs.get(key)
            if entry is None:
                return None
            self._docs.move_to_end(key)
            return entry[0], entry[2]

    def __len__(self) -> int:
        return len(self._docs)

    @property
    def held_bytes(self) -> int:
        return self._held
