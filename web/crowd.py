"""Serving a crowd: identical runs are computed once, a waiting visitor sees their place in line, and finished
runs are recorded and replayed. No Gradio and no torch here.

- ``Line``: the compute slots (one on a CPU) and the first-come line in front of them. Every run and sweep waits
  here for a slot, so a visitor can be told their place and an estimate while they wait. Background work
  (recording the example prompts) runs only when no visitor waits, and gives its slot up to the next visitor.
- ``Computation``: one run or sweep and everyone watching it. It runs in its own thread; visitors subscribe, read
  its live snapshot and leave. When the last one leaves (Stop, a closed tab) it stops.
- ``Board``: the computations in flight by request key, so an identical request joins the one under way.
- The recorded runs an identical request is replayed from are in ``web/recordings.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional


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
    seq: int = 0                            # its place in the order of submissions (``Line.submit``)
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
        self._submitted = 0                 # computations submitted so far (each one's ``seq``)
        self._tickets: list[int] = []       # exclusive() calls waiting: the submissions before each came first

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until no computation runs, and keep every one from starting while inside: what changes how runs
        compute (the start publishing the compiled forward, the served version) never lands mid-race.

        First come, first served: the visitors' computations submitted before the call start (and end) before it
        holds the line, and the ones submitted after it wait for it, as does all background work. The start holds
        the line once per timing, one after the other; without the order its next timing took the line before the
        visitor who had waited through the last one woke, and a visitor's first run on a busy machine waited
        through every timing of the start (192 s for 32 tokens; AMD EPYC Zen 5, two busy loops)."""
        with self._cond:
            ticket = self._submitted
            self._tickets.append(ticket)
            try:
                while self._running or self._held or any(not c.background and c.seq < ticket for c in self._waiting):
                    self._cond.wait(0.25)
            finally:
                self._tickets.remove(ticket)
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def _may_start(self, comp: Computation) -> bool:
        """Not held, and no exclusive() call waiting that ``comp`` must let go first (one that came before a
        visitor's computation; any, for background work)."""
        if self._held:
            return False
        if comp.background:
            return not self._tickets
        return all(comp.seq < ticket for ticket in self._tickets)

    def submit(self, comp: Computation) -> None:
        """Put ``comp`` in line and start its thread; QueueFull when the line is full (for visitors)."""
        with self._cond:
            visitors = sum(not c.background for c in self._waiting)
            if not comp.background and visitors >= self.capacity:
                raise QueueFull(f"queue full: {visitors} runs are waiting for the compute slot; "
                                f"try again in a few minutes")
            comp.seq, self._submitted = self._submitted, self._submitted + 1
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
                if self._may_start(comp) and len(self._running) < self.slots and self._next() is comp:
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
