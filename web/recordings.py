"""Recorded runs: finished deterministic runs by request key, bounded in memory and (optionally) kept on disk, so an
identical request afterwards is replayed at once with the timings measured when it ran; each has a random share
id (``web/share.py``), saved in its file, that opens it from a link. No Gradio and no torch here.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from web.bounded import Bounded, remove_file
from web.memory import held_bytes
from web.share import is_id, new_id


@dataclass
class Recording:
    """A finished run: its trace document, the document as exported JSON, its status line, and when and where
    it was measured."""
    key: str
    doc: dict
    text: str
    message: str
    recorded_at: float          # seconds since the epoch
    device: str
    views: dict = field(default_factory=dict, repr=False)   # drawn once, shared by every replay
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # ... drawn by one
    held: int = field(default=0, repr=False, compare=False)    # bytes in memory, measured when first asked
    share: str = ""             # its random share id (web/share.py), drawn when it is stored; saved in its file
    replay: Any = field(default=None, repr=False, compare=False)     # web/playback.Replay: built at its first replay
    trace_path: str = field(default="", repr=False, compare=False)   # its exported file, written once for every replay

    @property
    def size(self) -> int:
        """Bytes it holds in memory: the document, its JSON text and its views, measured (``web/memory.py``)."""
        if not self.held:
            self.held = held_bytes(self.doc, self.text, self.views)
        return self.held

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.recorded_at))


class Recordings:
    """Finished runs by request key, least recently used dropped beyond ``max_bytes``; with a ``directory``
    each is also written there (one JSON file, written atomically) and found again after a restart.

    On disk, visitors' recordings are bounded by ``max_files`` and ``max_disk_bytes``, oldest dropped first.
    The example prompts' recordings (``put(..., pinned=True)``) live apart, in ``examples/`` with bounds of
    their own, so no number of visitors' runs pushes them off the disk.

    Each recording stored gets a random share id (kept in its file's first line) and ``by_share`` finds it
    again: from an index of at most ``max_shares`` ids, rebuilt from the files' first lines after a restart
    (or for a recording another replica wrote), at most once per ``rescan_s``."""

    def __init__(self, max_bytes: int, directory: Optional[str] = None, max_files: int = 256,
                 max_disk_bytes: int = 64 << 20, max_pinned_files: int = 64, max_pinned_bytes: int = 32 << 20,
                 max_shares: int = 4096, rescan_s: float = 5.0) -> None:
        self.max_bytes, self.max_files, self.max_disk_bytes = max_bytes, max_files, max_disk_bytes
        self.max_shares, self.rescan_s = max_shares, rescan_s
        self._shares = Bounded(max_items=max_shares)        # share id -> (key, pinned)
        self._scanned: Optional[float] = None
        self.max_pinned_files, self.max_pinned_bytes = max_pinned_files, max_pinned_bytes
        self.directory = Path(directory) if directory else None
        self._items = Bounded(max_bytes=max_bytes, sizeof=lambda rec: rec.size)     # key -> Recording (in memory)
        self._lock = threading.Lock()

    def persist_to(self, directory: Optional[str]) -> None:
        self.directory = Path(directory) if directory else None

    def get(self, key: str) -> Optional[Recording]:
        rec = self._items.get(key)
        if rec is not None:
            return rec
        found = self._read(key)
        if found is None:
            return None
        rec, pinned = found
        if not rec.share:                   # written before share ids: it gets one now, saved with it
            rec.share = new_id()
            self._write(rec, pinned)
        self._index(rec.share, key, pinned)
        self._items.put(key, rec)
        return rec

    def put(self, rec: Recording, pinned: bool = False) -> None:
        if not is_id(rec.share):
            rec.share = new_id()
        self._index(rec.share, rec.key, pinned)
        self._items.put(rec.key, rec)
        self._write(rec, pinned)

    def remeasure(self, rec: Recording) -> None:
        """Count ``rec`` again after it grew (its views, drawn at its first replay after a read from disk)."""
        if self._items.get(rec.key) is rec:
            rec.held = 0
            self._items.resize(rec.key)

    # ----------------------------------------------------------------------- share ids
    def _index(self, share: str, key: str, pinned: bool) -> None:
        self._shares.put(share, (key, pinned))

    def by_share(self, share: str) -> Optional[Recording]:
        """The recording whose share id is ``share`` (checked by the caller: ``web.share.check_id``), or None
        when no recording held here or on disk has it (expired, or never was)."""
        for attempt in range(2):
            hit = self._shares.get(share)
            if hit is not None:
                rec = self.get(hit[0])
                if rec is not None and rec.share == share:
                    return rec
            if attempt == 0 and not self._rescan():
                return None
        return None

    def _rescan(self) -> bool:
        """Index the share ids in the files' first lines (bounded: the folders hold at most max_files +
        max_pinned_files recordings); False when the last scan is too recent or there is no folder."""
        now = time.monotonic()
        with self._lock:
            if self.directory is None or (self._scanned is not None and now - self._scanned < self.rescan_s):
                return False
            self._scanned = now
        for pinned, folder in ((True, self.directory / "examples"), (False, self.directory)):
            for path in sorted(folder.glob("*.json"), key=_mtime)[-(self.max_shares // 2):]:
                meta = _meta(path)
                if meta is not None and is_id(meta.get("share")) and meta.get("key") == path.stem:
                    self._index(meta["share"], path.stem, pinned)
        return True

    def _path(self, key: str, pinned: bool = False) -> Optional[Path]:
        if not self.directory:
            return None
        return (self.directory / "examples" if pinned else self.directory) / f"{key}.json"

    def _write(self, rec: Recording, pinned: bool = False) -> None:
        path = self._path(rec.key, pinned)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            meta = json.dumps({"key": rec.key, "message": rec.message, "recorded_at": rec.recorded_at,
                               "device": rec.device, "share": rec.share})
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(meta + "\n" + rec.text)
            os.replace(tmp, path)           # a reader sees the old file or the whole new one, never half
            if pinned:
                _bound(path.parent, self.max_pinned_files, self.max_pinned_bytes)
            else:
                _bound(path.parent, self.max_files, self.max_disk_bytes)
        except OSError:
            pass                            # a cache: a full disk costs a recomputation, nothing else

    def _read(self, key: str) -> Optional[tuple[Recording, bool]]:
        """(recording, whether it is pinned) from disk, or None."""
        path = next((p for p in (self._path(key, True), self._path(key)) if p is not None and p.is_file()), None)
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                meta = json.loads(fh.readline())
                text = fh.read()
            doc = json.loads(text)
            if meta.get("key") != key or not isinstance(doc, dict):
                return None
            share = meta.get("share") if is_id(meta.get("share")) else ""
            rec = Recording(key, doc, text, str(meta["message"]), float(meta["recorded_at"]), str(meta["device"]),
                            share=share)
            return rec, path.parent != self.directory
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def held_bytes(self) -> int:
        return int(self._items.held_bytes)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _meta(path: Path, limit: int = 4096) -> Optional[dict]:
    """A recording file's first line (its metadata), read no further than ``limit`` characters."""
    try:
        with open(path, encoding="utf-8") as fh:
            meta = json.loads(fh.readline(limit))
        return meta if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None


def _bound(folder: Path, max_files: int, max_bytes: int) -> None:
    """Delete the oldest recordings of ``folder`` (not its subfolders) until both bounds hold: the folder's files,
    oldest first, through the same bounded store as everything else (other replicas write to it too)."""
    files = []
    for path in folder.glob("*.json"):
        try:
            stat = path.stat()
        except OSError:
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    kept = Bounded(max_items=max_files, max_bytes=max_bytes, sizeof=lambda size: size,
                   on_drop=lambda path, size: remove_file(path))
    for _, size, path in sorted(files):
        if not kept.put(path, size):
            remove_file(path)
