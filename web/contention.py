"""How many threads a run computes on: one where other processes hold the cores.

PyTorch's CPU kernels split each product over the run's OpenMP threads, and every product ends in a barrier where
the threads wait for each other. While other processes hold the cores, a thread that waits for its partner waits
for the scheduler to run it again, at every barrier of every forward: on an AMD EPYC Zen 5 (2 vCPUs) with two busy
loops, a greedy run of 64 tokens on the compiled int8 version took 1.9 s, 2.3 s and once **280 s** on two threads,
and 0.8–0.9 s every time on one (quiet: 0.46 s on two, 0.49 on one). A crowd on a shared machine must not freeze a
visitor's run for minutes, so a run starts on one thread when the cores were busy with other work in the last
second (:data:`BUSY_SHARE` of all the cores' time, read from /proc by ``web.quiet``'s reader).

The thread count is set once per run, around the whole run (``omp_pool.threads`` in ``web/run_thread.py``), so every
strategy of a race and its greedy reference compute with the same count. The compiled forward keeps one graph per
thread count (inductor's kernels are generated for a count); the start compiles the served forward's one-thread graph
before publishing it (``web/startup.compile_one_thread``), where the first busy run used to compile it (18 s in one
process, 46 s through the app). Such a run is never recorded (``web.compute.quiet_timing``: its document names the
count it computed on): its timings are a busy machine's, however close its steps come to the quiet ones.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import torch

from web.quiet import CpuReader, others_share, read_proc

BUSY_SHARE = 0.4       # other processes took this share of all the cores' time: the run computes on one thread
SPAN_S = 1.0           # the window the share is read over (the sampler keeps readings this far back)
PERIOD_S = 0.25        # how often the sampler reads /proc
BUSY_NOTE = ("The machine was busy with other work when this run started: it computed on one thread, since two "
             "threads wait on each other's cores at every step there (its timings are a busy machine's).")


class CpuWatch:
    """Other processes' share of the cores over about the last :data:`SPAN_S` seconds, from a daemon thread that
    reads /proc every :data:`PERIOD_S` (started on first use; a few microseconds a reading)."""

    def __init__(self, cpu: CpuReader = read_proc, period_s: float = PERIOD_S, span_s: float = SPAN_S) -> None:
        self._cpu, self._period, self._span = cpu, period_s, span_s
        self._readings: list = []            # (monotonic seconds, CpuTimes)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        reading = self._cpu()
        if reading is None:
            return
        now = time.monotonic()
        with self._lock:
            self._readings.append((now, reading))
            while len(self._readings) > 2 and now - self._readings[1][0] >= self._span:
                self._readings.pop(0)

    def _loop(self) -> None:
        while True:
            self._sample()
            time.sleep(self._period)

    def share(self) -> Optional[float]:
        """Others' share (0..1) from the oldest kept reading to now; None where /proc cannot tell."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="cpu-watch", daemon=True)
                    self._thread.start()
        self._sample()
        with self._lock:
            if len(self._readings) < 2:
                return None
            (_, first), (_, last) = self._readings[0], self._readings[-1]
        return others_share(first, last)


WATCH = CpuWatch()


def run_threads(threads: int, share: Optional[float]) -> int:
    """The threads a run computes on: ``threads`` (the app's), or 1 where others took :data:`BUSY_SHARE` of the
    cores (``share``; None, unknown, keeps ``threads``)."""
    return 1 if threads > 1 and share is not None and share >= BUSY_SHARE else threads


def choose(watch: Optional[CpuWatch] = None) -> int:
    """:func:`run_threads` for a run starting now, with this process's thread count."""
    return run_threads(torch.get_num_threads(), (watch or WATCH).share())

