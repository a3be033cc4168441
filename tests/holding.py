"""Runs held mid-way, whatever the machine's speed, for the web floor's tests.

A test that needs a run to be going on while something else happens (a visitor leaves, Stop is called in a loop, the
queue's loop dies) holds it, instead of asking a slow model for a long answer: the run waits at one of its steps
until the test lets it go, so the test needs no real model and does not race the machine's speed.
"""

from __future__ import annotations

import threading
import time

from web import compute


class HeldStop:
    """A run's stop event whose ``is_set`` (asked by the strategy's loop before every step) waits at the
    ``after``-th asking until ``release`` is set: the computation is held mid-run, whatever the machine's speed."""

    def __init__(self, stop, release: threading.Event, after: int = 4) -> None:
        self._stop, self._release, self._left = stop, release, after

    def is_set(self) -> bool:
        self._left -= 1
        if self._left == 0:
            self._release.wait(timeout=120)
        return self._stop.is_set()

    def __getattr__(self, name):
        return getattr(self._stop, name)


def hold_runs(monkeypatch, release: threading.Event, after: int = 4) -> None:
    """Every run the app computes from now on is held at its ``after``-th step until ``release`` is set (once it
    is, runs go through). Wraps whatever ``compute.compute_run`` is now, so a counting wrapper keeps counting."""
    inner = compute.compute_run
    monkeypatch.setattr(compute, "compute_run",
                        lambda stop, req, budget_s=0: inner(HeldStop(stop, release, after), req, budget_s))


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)
