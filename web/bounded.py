"""The one bounded store every cache of the web service uses: least recently used first out, beyond a number of
entries and a number of bytes, thread-safe, and told what it pushed out (so a file on disk goes with its entry).

The order and the byte count are ``cachetools.LRUCache``'s (with ``getsizeof``); this class adds what each of
the app's stores needs on top: a lock, a bound on entries beside the one on bytes, a callback for each entry
dropped, and a choice for an entry over the whole byte budget (refused, or held alone). Users: the replay
documents and the recorded runs in memory (``web/guards.TraceStore``, ``web/recordings.Recordings``), the exported
trace files and animations (``web/guards.TraceFiles``, ``web/export.ExportFiles``) and the recordings' folders
on disk (``web/recordings.py``, rebuilt from the folder, which other replicas write too).
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import signal
import tempfile
import threading
from typing import Any, Callable, Hashable, Optional

import cachetools


def remove_file(path: Any) -> None:
    """Delete ``path`` if it is still there (another process, or an earlier drop, may have deleted it)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


_FOLDERS: list[str] = []        # this process's temporary folders, removed at exit and on SIGTERM
_SIGTERM_HOOKED: list[bool] = []


def temp_folder(prefix: str) -> str:
    """A new folder in the system's temporary directory, removed with everything in it when the process exits:
    normally (``atexit``) or on SIGTERM (a host stopping the app), after which the signal goes on to the handler
    that was there before (by default: the process ends, as it would have)."""
    path = tempfile.mkdtemp(prefix=prefix)
    if not _FOLDERS:
        atexit.register(remove_temp_folders)
    _FOLDERS.append(path)
    _hook_sigterm()
    return path


def remove_temp_folders() -> None:
    while _FOLDERS:
        shutil.rmtree(_FOLDERS.pop(), ignore_errors=True)


def _hook_sigterm() -> None:
    """Put the folders' removal in front of SIGTERM's handler, once (only the main thread may set a handler;
    a folder made in another thread is hooked by the next one the main thread makes, and removed at exit)."""
    if _SIGTERM_HOOKED or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        remove_temp_folders()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:            # the default (or a handler set outside Python): end
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    _SIGTERM_HOOKED.append(True)


class _Dropping(cachetools.LRUCache):
    """An LRU cache that hands every entry it evicts to ``dropped``."""

    def __init__(self, maxsize: float, getsizeof: Optional[Callable[[Any], float]], dropped: Callable) -> None:
        super().__init__(maxsize, getsizeof)
        self._dropped = dropped

    def popitem(self) -> tuple:
        key, value = super().popitem()
        self._dropped(key, value)
        return key, value


class Bounded:
    """An LRU map of at most ``max_items`` entries and ``max_bytes`` bytes (``sizeof`` of each value; None: no
    such bound). ``on_drop(key, value)`` runs for each entry pushed out or replaced (not for ``pop``). An entry
    larger than ``max_bytes`` is refused (``put`` returns False), or with ``oversized="alone"`` held alone."""

    def __init__(self, max_items: Optional[int] = None, max_bytes: Optional[float] = None,
                 sizeof: Optional[Callable[[Any], float]] = None, on_drop: Optional[Callable[[Any, Any], None]] = None,
                 oversized: str = "refuse") -> None:
        if oversized not in ("refuse", "alone"):
            raise ValueError("oversized must be 'refuse' or 'alone'")
        self.max_items, self.max_bytes, self.oversized = max_items, max_bytes, oversized
        self._on_drop = on_drop or (lambda key, value: None)
        self._sizeof = sizeof if max_bytes is not None else None
        self._cache = _Dropping(math.inf if max_bytes is None else max_bytes, self._sizeof, self._on_drop)
        self._alone: Optional[tuple] = None     # the one entry over the byte budget (oversized="alone")
        self._lock = threading.RLock()

    def put(self, key: Hashable, value: Any) -> bool:
        """Hold ``value`` under ``key`` as the most recently used entry; False when it is refused (too large)."""
        with self._lock:
            old = self.pop(key)
            if old is not None and old is not value:
                self._on_drop(key, old)
            if self._sizeof is not None and self._sizeof(value) > self.max_bytes:
                if self.oversized == "refuse":
                    return False
                self.clear()
                self._alone = (key, value)
                return True
            if self._alone is not None:         # a new entry within the budget pushes the oversized one out
                self._drop_oldest()
            self._cache[key] = value
            while self.max_items is not None and len(self) > self.max_items:
                self._drop_oldest()
            return True

    def _drop_oldest(self) -> None:
        if self._alone is not None:
            (key, value), self._alone = self._alone, None
            self._on_drop(key, value)
        else:
            self._cache.popitem()

    def get(self, key: Any, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            if self._alone is not None and self._alone[0] == key:
                return self._alone[1]
            try:
                return self._cache[key]
            except (KeyError, TypeError):   # TypeError: an unhashable key from a client is simply not held
                return default

    def pop(self, key: Any, default: Any = None) -> Any:
        """Take the entry out without ``on_drop`` (the caller owns it now)."""
        with self._lock:
            if self._alone is not None and self._alone[0] == key:
                (_, value), self._alone = self._alone, None
                return value
            try:
                return self._cache.pop(key, default)
            except TypeError:
                return default

    def resize(self, key: Any) -> None:
        """Count the entry under ``key`` again (its value grew or shrank in place); the bounds then hold again."""
        with self._lock:
            value = self.pop(key)
            if value is not None:
                self.put(key, value)

    def clear(self) -> None:
        """Drop every entry (``on_drop`` for each)."""
        with self._lock:
            while len(self):
                self._drop_oldest()

    def __len__(self) -> int:
        return len(self._cache) + (self._alone is not None)

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` is held (its place in the order unchanged)."""
        with self._lock:
            try:
                return key in self._cache or (self._alone is not None and self._alone[0] == key)
            except TypeError:
                return False

    @property
    def held_bytes(self) -> float:
        """Bytes of the entries held (0 without a byte bound)."""
        with self._lock:
            if self._sizeof is None:
                return 0
            return self._sizeof(self._alone[1]) if self._alone is not None else self._cache.currsize
