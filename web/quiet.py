"""Whether a finished run was timed on a quiet machine: only then is it recorded and replayed to later visitors.

Two independent checks, neither of which depends on the prompt's length (issue 47):

(a) **the cores were free**: while greedy's timed run lasted, other processes took at most ``cpu_share`` of all
    the cores' time. Read from ``/proc/stat`` (every core's busy jiffies, steal included: a hypervisor giving the
    core to another guest) less ``/proc/self/stat`` (this process's own user and system jiffies), over the window
    that brackets greedy's timed run (``RunWindow``, from the live race's snapshots). Where ``/proc`` is missing or
    the window is too short to count (``window_s``), this check cannot tell and is skipped.

(b) **the steps cost what they cost when quiet**: greedy's median *decode* step, the prefill excluded
    (``decode_step_ms``), is at most ``slack`` x a baseline + ``ms``. The baseline is the same quantity taken when
    the machine was measured quiet, kept per (model, fast mode) on the app (``baselines_of``), never a module's:
    seeded by a probe (greedy's own loop run briefly, timed inside a /proc window; one measured busy is never used),
    lowered by any run whose steps come out faster (load only adds time), and measured again after ``remeasure``
    slow verdicts in a row while /proc said the cores were free (the baseline itself was too low).

Pure functions and one small store; no Gradio, no torch of its own. The /proc reader (``read_proc``) and the
probe are injected, so the tests script both.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence

from decoding.harness.steps import median_step_ms

try:
    USER_HZ = os.sysconf("SC_CLK_TCK")          # /proc's jiffies per second
except (AttributeError, ValueError, OSError):
    USER_HZ = 100

QUIET_NOTE = "it is recorded when the machine is quiet."


# --------------------------------------------------------------------------- what /proc says

@dataclass(frozen=True)
class CpuTimes:
    """One reading of /proc, in jiffies since boot."""
    total: int      # every core's time, idle included
    busy: int       # every core's time not idle (iowait counts as idle; steal counts as busy)
    own: int        # this process's user + system time (all its threads)
    cores: int


CpuReader = Callable[[], Optional[CpuTimes]]


def read_proc(root: str = "/proc") -> Optional[CpuTimes]:
    """This machine's CPU times now, or None where ``root`` (``/proc``) is missing or unreadable."""
    try:
        with open(os.path.join(root, "stat")) as f:
            lines = f.read().splitlines()
        with open(os.path.join(root, "self", "stat")) as f:
            own_line = f.read()
    except OSError:
        return None
    try:
        # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user
        fields = [int(x) for x in lines[0].split()[1:9]]
        total = sum(fields)
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        cores = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit()) or 1
        if cores > _usable_cores():
            # a container pinned to fewer cores than /proc/stat counts (the host's): other tenants' work is in
            # the totals, so others' share cannot be told; check (b) alone judges there
            return None
        after_name = own_line.rsplit(")", 1)[1].split()     # field 3 (state) onwards; the name may hold spaces
        own = int(after_name[11]) + int(after_name[12])     # fields 14 and 15: utime, stime
    except (IndexError, ValueError):
        return None
    return CpuTimes(total, total - idle, own, cores)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def others_share(before: Optional[CpuTimes], after: Optional[CpuTimes], min_s: float = 0.0) -> Optional[float]:
    """The share of all the cores' time that other processes took between two readings (0..1); None where a
    reading is missing or the window lasted under ``min_s`` seconds (too few jiffies to tell)."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0 or total / max(after.cores, 1) < min_s * USER_HZ:
        return None
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / total))


class RunWindow:
    """/proc readings that bracket greedy's timed run in a comparison, taken as the live race's snapshots come
    (``web.live.Live.snapshot``: a ``running`` dict with ``strategy`` and ``warming``, and the ``done`` results).

    It begins at the first snapshot of greedy's timed run (after its warm-up) and ends at the first one that shows
    greedy done (within the race's poll interval of each); a comparison whose greedy run no snapshot saw (a short
    one, or a stand-in that yields none) falls back on the whole comparison. Only the first greedy counts (a race
    of two models runs one per model; the first is the one judged)."""

    def __init__(self, cpu: CpuReader) -> None:
        self.cpu = cpu
        self.first = cpu()                      # before the comparison started
        self.begin: Optional[CpuTimes] = None
        self.end: Optional[CpuTimes] = None
        self._ended = False

    def watch(self, snapshot: Mapping[str, Any]) -> None:
        if self._ended:
            return
        if any(r.get("strategy") == "greedy" for r in snapshot.get("done") or ()):
            self.end, self._ended = self.cpu(), True
            return
        running = snapshot.get("running") or {}
        if self.begin is None and running.get("strategy") == "greedy" and not running.get("warming"):
            self.begin = self.cpu()

    def share(self, min_s: float = 0.0) -> Optional[float]:
        """Others' share of the cores over the window (closed now if no snapshot closed it)."""
        if not self._ended:
            self.end, self._ended = self.cpu(), True
        return others_share(self.begin or self.first, self.end, min_s)


# --------------------------------------------------------------------------- what greedy's steps cost

def decode_step_ms(result: Mapping[str, Any]) -> Optional[float]:
    """The median decode step of a greedy result, the prefill excluded however long the prompt. A ForwardPass
    event carries its bare forward's ms, not the loop's work around it (issue 47: the two differ), so the step is
    derived from the times the runner stamps on every event (``times_ms``):
    the gaps between consecutive target forwards (``harness/steps.decode_steps_ms``; the first stamp ends the
    prefill), each one forward and the loop's work around it, what the race pays and the probe measures
    (``harness/steps.greedy_steps_ms``). A result with no forward events at all (a stand-in, a trace without
    them) falls back on wall time per target forward, which counts the prefill; None when there is nothing to
    judge (a one-token run: its only forward is the prefill)."""
    events, times = result.get("events") or [], result.get("times_ms") or []
    if len(times) == len(events):
        found = median_step_ms(events, times)
        if found is not None:
            return found
    if any(isinstance(e, Mapping) and e.get("type") == "ForwardPass" for e in events):
        return None
    forwards, wall = result.get("target_forwards") or 0, result.get("wall_s") or 0.0
    return 1000.0 * wall / forwards if forwards and wall > 0 else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# --------------------------------------------------------------------------- the baseline and the verdict

@dataclass(frozen=True)
class QuietLimits:
    """When a run counts as timed quiet (``Limits.quiet`` in web/limits.py): (a) while greedy ran, other processes
    took at most ``cpu_share`` of the cores (/proc/stat less this process; a window under ``window_s`` cannot
    tell), and (b) greedy's median decode step (prefill excluded) cost at most ``slack`` x its baseline + ``ms``,
    the baseline being the same step measured quiet for that model and mode (measured again after ``remeasure``
    slow verdicts in a row with the cores free)."""
    cpu_share: float = 0.15     # (a) others' share of the cores, at most
    slack: float = 1.25         # (b) the median decode step, at most slack x baseline + ms
    ms: float = 3.0
    remeasure: int = 3          # slow verdicts in a row with the cores free before the baseline is measured again
    window_s: float = 0.25      # the shortest window /proc can judge


@dataclass(frozen=True)
class Measurement:
    ms: float
    share: Optional[float]      # others' share of the cores while it was taken (None: /proc could not tell)


@dataclass
class Baseline:
    """One (model, mode)'s median decode step on a quiet machine."""
    ms: Optional[float] = None
    source: str = ""            # probe | run
    slow: int = 0               # slow verdicts in a row while /proc said the cores were free


class QuietBaselines:
    """The quiet baselines of one app, per (model, fast mode), and the /proc reader its windows use."""

    def __init__(self, cpu: CpuReader = read_proc) -> None:
        self.cpu = cpu
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, Baseline] = {}

    def get(self, key: Hashable) -> Optional[float]:
        with self._lock:
            found = self._by_key.get(key)
            return None if found is None else found.ms

    def measure(self, probe: Callable[[], float], limits: QuietLimits) -> Optional[Measurement]:
        """``probe()`` (ms) inside a /proc window; None when it fails or gives no positive time."""
        before = self.cpu()
        try:
            ms = float(probe())
        except Exception:  # noqa: BLE001: a model whose forward cannot be timed alone has no probe
            return None
        share = others_share(before, self.cpu(), limits.window_s)
        return Measurement(ms, share) if _positive(ms) else None

    def seed(self, key: Hashable, probe: Callable[[], float], limits: QuietLimits) -> Optional[Measurement]:
        """Measure ``key``'s baseline now (the start does, so no visitor's run waits for the probe); one taken
        while others held the cores is not used."""
        with self._lock:
            return self._remeasure(self._by_key.setdefault(key, Baseline()), probe, limits)

    def judge(self, key: Hashable, step: float, share: Optional[float], probe: Callable[[], float],
              limits: QuietLimits) -> tuple[bool, str]:
        """(recorded, note) for a run whose greedy median decode step was ``step`` ms while others took ``share``
        of the cores. The note says which check failed, with its numbers (empty when recorded)."""
        if share is not None and share > limits.cpu_share:                       # (a)
            return False, (f" Not recorded: other processes used {share:.0%} of the cores while greedy ran "
                           f"(at most {limits.cpu_share:.0%} on a quiet machine); {QUIET_NOTE}")
        with self._lock:
            base = self._by_key.setdefault(key, Baseline())
            if base.ms is None:
                seed = self._remeasure(base, probe, limits)
                if seed is not None and base.ms is None:      # measured while others held the cores: not used
                    return False, (f" Not recorded: the machine was busy when its quiet speed was measured (other "
                                   f"processes used {seed.share:.0%} of the cores); {QUIET_NOTE}")
                if base.ms is None:                           # no probe: a run measured quiet seeds it
                    if share is None:
                        return True, ""                       # nothing could tell: as before, recorded
                    base.ms, base.source = step, "run"
            line = limits.slack * base.ms + limits.ms                            # (b)
            if step > line and share is not None:
                base.slow += 1
                if base.slow >= limits.remeasure:             # slow with the cores free, again: the baseline is off
                    base.slow = 0
                    self._remeasure(base, probe, limits, replace=True)
                    line = limits.slack * base.ms + limits.ms
            if step <= line:
                base.slow = 0
                if step < base.ms:                            # faster than quiet: the baseline was taken slow
                    base.ms, base.source = step, "run"
                return True, ""
            return False, (f" Not recorded: greedy's decode steps took {step:.0f} ms (median) against {base.ms:.0f} "
                           f"ms on a quiet machine (at most {line:.0f} ms), so something else was slowing the cores; "
                           f"{QUIET_NOTE}")

    def _remeasure(self, base: Baseline, probe: Callable[[], float], limits: QuietLimits,
                   replace: bool = False) -> Optional[Measurement]:
        """Probe; a measurement taken quiet (or where /proc cannot tell) becomes the baseline (when ``replace``,
        even above the current one); one taken busy is returned unused."""
        found = self.measure(probe, limits)
        if found is not None and (found.share is None or found.share <= limits.cpu_share):
            if base.ms is None or replace or found.ms < base.ms:
                base.ms, base.source = found.ms, "probe"
        return found


def baselines_of(app: Any) -> QuietBaselines:
    """``app``'s quiet baselines (``app.quiet_baselines``), made on first use: one app's, never a module's. A test
    sets its own (with a scripted /proc reader) before the first run."""
    if app.quiet_baselines is None:
        app.quiet_baselines = QuietBaselines()
    return app.quiet_baselines


def greedy_result(results: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The first greedy result that ran without error (the one whose timings are judged)."""
    return next((r for r in results if r.get("strategy") == "greedy" and not r.get("error")), None)
