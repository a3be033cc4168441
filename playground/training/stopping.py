"""A training loop that ends cleanly when it is asked to stop.

A leased GPU call ends with ``timeout`` (or the lease's own limit), which sends SIGTERM: before this, the
trainers died mid-step and the export, the summary and every step since the last checkpoint were lost
(BENCHMARKS.md, "The GPU run of 2026-11-30": call 2's own timeout cut training after the step-100
checkpoint, before the export). Inside ``stop_requested()`` SIGTERM (and SIGINT) only sets a flag: the loop
reads it as it reads its time budget, so the current step finishes, the last evaluation, checkpoint and
export run, and the command exits as if its minutes had run out. The previous handlers come back on leaving.
``timeout -k`` gives the ending its grace: ``timeout -k 60 390 ...`` sends SIGKILL a minute after SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Stop:
    """Whether a stop was asked for, and by which signal."""

    def __init__(self) -> None:
        self.signal: str = ""

    def __bool__(self) -> bool:
        return bool(self.signal)

    def record(self) -> dict:
        """What a log entry or summary says of it: ``{"stopped": "SIGTERM"}``, or nothing."""
        return {"stopped": self.signal} if self.signal else {}


@contextlib.contextmanager
def stop_requested(signals: tuple = (signal.SIGTERM, signal.SIGINT)) -> Iterator[Stop]:
    """A ``Stop`` that becomes true on ``signals`` while the block runs. Off the main thread (where Python cannot
    install a handler) it never becomes true, and the signals keep their old behaviour."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def ask(signum: int, frame: object) -> None:
        stop.signal = signal.Signals(signum).name

    previous = {s: signal.signal(s, ask) for s in signals}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
