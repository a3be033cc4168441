"""Serving a crowd: identical runs are computed once, a waiting visitor sees their place in line, and finished
runs are recorded and replayed. No Gradio and no torch here.

- ``Line``: the compute slots (one on a CPU) and the first-come line in front of them. Every run and sweep waits
  here for a slot, so a visitor can be told their place and an estimate while they wait. Background work
  (recording the example prompts) runs only when no visitor waits, and gives its slot up to the next visitor.
- ``Computation``: one run or sweep and everyone watching it. It runs in its own thread; visitors subscribe, read
  its live snapshot and leave. When the last one leaves (Stop, a closed tab) it stops.
- ``Board``: the computations in flight by request key, so an identical request joins the one under way.
- ``Recordings``: finished deterministic runs by request key (bounded in memory, optionally kept on disk), so an
  identical request afterwards is replayed at once with the timings measured when it ran; each has a random
  share id (``web/share.py``), saved in its file, that opens it from a link.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from web.memory import held_bytes
from web.share import is_id, new_id

KEY_VERSION = 1      # bump when what a key covers changes: older recordings then miss instead of misleading


def request_key(fields: dict) -> str:
    """A stable digest of everything that decides a run's result (canonical JSON, so key order does not matter)."""
    text = json.dumps({"v": KEY_VERSION, **fields}, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class QueueFull(Exception):
    """The line already holds its capacity of waiting computations."""


class Estimator:
    """How long a computation will take, learned from those that finished: a fixed start cost plus seconds per
    unit of work (a unit is one token of one strategy), averaged over recent computations."""

    def __init__(self, per_unit_s: float = 0.08, start_s: float = 2.0, weight: float = 0.3) -> None:
        self.per_unit_s, self.start_s, self.weight = per_unit_s, start_s, weight
        self._lock = threading.Lock()

    def expect(self, units: float) -> float:
        return self.start_s + units * self.per_unit_s

    def learn(self, units: float, seconds: float) -> None:
        if units <= 0 or seconds <= 0:
            return
        with self._lock:
            per = max(seconds - self.start_s, 0.0) / units
            self.per_unit_s = (1 - self.weight) * self.per_unit_s + self.weight * per


@dataclass
class Computation:
    """One run or sweep: a ``work(computation)`` callable run in its own thread once it has a compute slot.

    ``work`` publishes live progress with ``publish`` and returns the outcome (``result``); an exception is
    kept in ``error``. ``stop`` asks ``work`` to end early. ``units`` sizes it for the line's estimates;
    ``background`` work gives way to visitors.
    """
    key: str
    work: Callable[["Computation"], Any]
    units: float = 1.0
    background: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    state: str = "waiting"                  # waiting -> running -> finished | failed | cancelled
    result: Any = None
    error: Optional[BaseException] = None
    live: Any = None                        # the latest published progress (plain data)
    version: int = 0                        # bumped by every publish
    preempted: bool = False                 # stopped to give its slot to a visitor (background work only)
    subscribers: int = 0
    joined: int = 0                         # how many requests this computation answered
    recorder: bool = False                  # started by the example recorder (one of ``joined`` is not a visitor)
    entered: float = field(default_factory=time.monotonic)
    started: Optional[float] = None
    finished: Optional[float] = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.recorder = self.background     # background work is the recorder's until a visitor joins it

    @property
    def visitors(self) -> int:
        """How many visitors' requests it answered (the recorder's own subscription not counted)."""
        return self.joined - int(self.recorder)

    def publish(self, live: Any) -> None:
        with self._lock:
            self.live, self.version = live, self.version + 1

    def memo(self, name: str, version: int, build: Callable[[], Any]) -> Any:
        """``build()`` once per (name, version) however many subscribers ask (a frame drawn once for all)."""
        with self._lock:
            hit = self._memo.get(name)
            if hit is not None and hit[0] == version:
                return hit[1]
        value = build()
        with self._lock:
            self._memo[name] = (version, value)
        return value

    def subscribe(self) -> None:
        with self._lock:
            self.subscribers += 1
            self.joined += 1
            if self.subscribers > 1 or not self.background:
                self.background = False     # a visitor waits for it now: it no longer gives way

    def leave(self) -> int:
        """One subscriber less; the last one to leave stops it (a run nobody watches is not finished)."""
        with self._lock:
            self.subscribers -= 1
            remaining = self.subscribers
        if remaining <= 0 and not self.done.is_set():
            self.stop.set()
        return remaining


class Line:
    """Compute slots and the first-come line in front of them.

    A visitor's computation waits behind the visitors' computations that came before it; background
    computations wait until no visitor's does, and a visitor arriving while every slot runs background
    work stops one of them (it is recorded again later). At most ``capacity`` visitors' computations wait.
    """

    def __init__(self, slots: int = 1, capacity: int = 32, estimator: Optional[Estimator] = None,
                 spawn: Callable[[Callable[[], None]], None] = None) -> None:
        self.slots, self.capacity = max(1, slots), capacity
        self.estimator = estimator or Estimator()
        self._waiting: list[Computation] = []
        self._running: list[Computation] = []
        self._cond = threading.Condition()
        self.started = 0                    # computations given a slot so far (runs, sweeps, exports)
        self._spawn = spawn or _thread
        self._held = False                  # exclusive(): no computation runs, none starts

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until no computation runs, and keep every one from starting while inside: what changes how runs
        compute (the start publishing the compiled forward, the served version) never lands mid-race."""
        with self._cond:
            while self._running or self._held:
                self._cond.wait(0.25)
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def submit(self, comp: Computation) -> None:
        """Put ``comp`` in line and start its thread; QueueFull when the line is full (for visitors)."""
        with self._cond:
            visitors = sum(not c.background for c in self._waiting)
            if not comp.background and visitors >= self.capacity:
                raise QueueFull(f"queue full: {visitors} runs are waiting for the compute slot; "
                                f"try again in a few minutes")
            self._waiting.append(comp)
            if not comp.background:
                self._preempt()
            self._cond.notify_all()
        self._spawn(lambda: self._run(comp))

    def _preempt(self) -> None:
        """Every slot busy with background work while a visitor waits: stop the most recent one."""
        if len(self._running) >= self.slots:
            background = [c for c in self._running if c.background]
            if len(background) == len(self._running) and background:
                background[-1].preempted = True
                background[-1].stop.set()

    def _next(self) -> Optional[Computation]:
        visitors = [c for c in self._waiting if not c.background]
        return (visitors or self._waiting or [None])[0]

    def _take_slot(self, comp: Computation) -> bool:
        """Block until ``comp`` has a slot (True) or was stopped while waiting (False, out of line)."""
        with self._cond:
            while True:
                if comp.stop.is_set():
                    self._waiting.remove(comp)
                    self._cond.notify_all()
                    return False
                if not self._held and len(self._running) < self.slots and self._next() is comp:
                    self._waiting.remove(comp)
                    self._running.append(comp)
                    comp.state, comp.started = "running", time.monotonic()
                    self.started += 1
                    return True
                self._cond.wait(0.25)       # also wakes for a Stop, which does not notify

    def _run(self, comp: Computation) -> None:
        if not self._take_slot(comp):
            comp.state, comp.finished = "cancelled", time.monotonic()
            comp.done.set()
            return
        try:
            comp.result = comp.work(comp)
            comp.state = "finished"
        except BaseException as exc:        # noqa: BLE001 - handed to every subscriber
            comp.error, comp.state = exc, "failed"
        finally:
            comp.finished = time.monotonic()
            if comp.state == "finished" and not comp.stop.is_set():
                self.estimator.learn(comp.units, comp.finished - comp.started)
            with self._cond:
                self._running.remove(comp)
                self._cond.notify_all()
            comp.done.set()

    def place(self, comp: Computation) -> Optional[tuple[int, int, float]]:
        """(place in line from 1, computations waiting, estimated seconds until it starts); None unless waiting."""
        with self._cond:
            if comp not in self._waiting:
                return None
            order = sorted(self._waiting, key=lambda c: c.background)     # visitors first, each in arrival order
            ahead = order[:order.index(comp)]
            now = time.monotonic()
            busy = [max(self.estimator.expect(c.units) - (now - (c.started or now)), 0.0)
                    for c in self._running if not c.background]
            work = sum(busy) + sum(self.estimator.expect(c.units) for c in ahead)
            return len(ahead) + 1, len(self._waiting), work / self.slots

    def idle(self) -> bool:
        """No visitor's computation waits or runs."""
        with self._cond:
            return not any(not c.background for c in self._waiting + self._running)

    def counts(self) -> dict:
        with self._cond:
            return {"slots": self.slots, "running": len(self._running), "waiting": len(self._waiting),
                    "started": self.started}


def _thread(target: Callable[[], None]) -> None:
    """A daemon thread that runs in a copy of the caller's context (Gradio's request, for ZeroGPU's quota)."""
    ctx = contextvars.copy_context()
    threading.Thread(target=ctx.run, args=(target,), name="decoding-compute", daemon=True).start()


class Board:
    """Computations in flight by request key: an identical request joins the one under way."""

    def __init__(self) -> None:
        self._inflight: dict[str, Computation] = {}
        self._lock = threading.Lock()

    def join(self, key: str, make: Callable[[], Computation], line: Line) -> tuple[Computation, bool]:
        """(computation, whether this call started it), subscribed. One that is stopping is not joined."""
        with self._lock:
            comp = self._inflight.get(key)
            if comp is not None and not comp.stop.is_set() and not comp.done.is_set():
                comp.subscribe()
                return comp, False
            comp = make()
            comp.subscribe()
            line.submit(comp)               # QueueFull: nothing registered
            self._inflight[key] = comp
        threading.Thread(target=self._forget, args=(key, comp), daemon=True).start()
        return comp, True

    def _forget(self, key: str, comp: Computation) -> None:
        comp.done.wait()
        with self._lock:
            if self._inflight.get(key) is comp:
                del self._inflight[key]

    def __len__(self) -> int:
        return len(self._inflight)


# --------------------------------------------------------------------------- recordings
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
        self._shares: "OrderedDict[str, tuple[str, bool]]" = OrderedDict()    # share id -> (key, pinned)
        self._scanned: Optional[float] = None
        self.max_pinned_files, self.max_pinned_bytes = max_pinned_files, max_pinned_bytes
        self.directory = Path(directory) if directory else None
        self._items: "OrderedDict[str, Recording]" = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def persist_to(self, directory: Optional[str]) -> None:
        self.directory = Path(directory) if directory else None

    def get(self, key: str) -> Optional[Recording]:
        with self._lock:
            rec = self._items.get(key)
            if rec is not None:
                self._items.move_to_end(key)
                return rec
        found = self._read(key)
        if found is None:
            return None
        rec, pinned = found
        if not rec.share:                   # written before share ids: it gets one now, saved with it
            rec.share = new_id()
            self._write(rec, pinned)
        self._index(rec.share, key, pinned)
        self._hold(rec)
        return rec

    def put(self, rec: Recording, pinned: bool = False) -> None:
        if not is_id(rec.share):
            rec.share = new_id()
        self._index(rec.share, rec.key, pinned)
        self._hold(rec)
        self._write(rec, pinned)

    def remeasure(self, rec: Recording) -> None:
        """Count ``rec`` again after it grew (its views, drawn at its first replay after a read from disk)."""
        with self._lock:
            if self._items.get(rec.key) is not rec:
                return
            self._held -= rec.size
            rec.held = 0
            self._held += rec.size
            while self._held > self.max_bytes and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                self._held -= dropped.size

    # ----------------------------------------------------------------------- share ids
    def _index(self, share: str, key: str, pinned: bool) -> None:
        with self._lock:
            self._shares[share] = (key, pinned)
            self._shares.move_to_end(share)
            while len(self._shares) > self.max_shares:
                self._shares.popitem(last=False)

    def by_share(self, share: str) -> Optional[Recording]:
        """The recording whose share id is ``share`` (checked by the caller: ``web.share.check_id``), or None
        when no recording held here or on disk has it (expired, or never was)."""
        for attempt in range(2):
            with self._lock:
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

    def _hold(self, rec: Recording) -> None:
        with self._lock:
            old = self._items.pop(rec.key, None)
            self._held -= old.size if old else 0
            if rec.size > self.max_bytes:
                return
            self._items[rec.key] = rec
            self._held += rec.size
            while self._held > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._held -= dropped.size

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
        return self._held


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
    """Delete the oldest recordings of ``folder`` (not its subfolders) until both bounds hold."""
    files = []
    for path in folder.glob("*.json"):
        try:
            stat = path.stat()
        except OSError:
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    files.sort()
    total = sum(size for _, size, _ in files)
    while files and (len(files) > max_files or total > max_bytes):
        _, size, path = files.pop(0)
        path.unlink(missing_ok=True)
        total -= size
