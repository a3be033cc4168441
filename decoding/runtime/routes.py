"""Which version of the default model this machine runs: measured at start, never assumed from the CPU's name.

A preset can have reduced-weight siblings (``weights: fp16`` / ``bf16`` in ``presets/models.yaml``): other
models, each exact against its own greedy, whose forwards cost differently on each CPU. On an Intel Xeon
with AMX a bfloat16-weight forward over 10 positions costs about 1.1x one position, where float32 costs
1.7x; on an AMD EPYC float16 weights make a one-position forward 1.5x faster (BENCHMARKS.md). No single
version is right everywhere, so :func:`choose` times each candidate's verify forward (``forward_cost``:
one position, and ``WIDTH`` positions, a typical tree or window) and picks the one whose *race step*, one
greedy step plus one verify forward, costs least; the base preset keeps the default unless a sibling beats
it by ``MARGIN``. The decision is cached per machine (CPU name and flags, threads, torch version, candidates),
so only the first start pays for it (a few seconds per candidate).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from decoding.runtime.forward_cost import calibrate
from decoding.runtime.kernel_choice import _cpuinfo, cpu_label, cpu_name, read_entries, write_entries
from decoding.runtime.models import ModelPreset, runs_here

WIDTH = 10            # a typical verify forward: the prophet's 8-node tree with its root and a spare row
MARGIN = 0.05         # a sibling must make the race step this much cheaper to replace the base preset
VERSION = 1
KEEP_ENTRIES = 8

Measure = Callable[[str], dict]       # preset name -> {1: ms, WIDTH: ms}


@dataclass(frozen=True)
class RouteChoice:
    """The preset the app runs by default here, and why."""
    target: str
    base: str
    source: str                               # measured | cache | only-one
    costs: dict = field(default_factory=dict)  # candidate -> {"c1_ms", "cW_ms", "step_ms"}
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        """One line for the page and the log."""
        if len(self.costs) < 2:
            return f"{self.target}: the only version of {self.base} that runs on this machine"
        parts = [f"{name} {c['c1_ms']:.0f} + {c['cW_ms']:.0f} ms" for name, c in self.costs.items()]
        return (f"{self.target} runs by default on this CPU ({cpu_label()}): a greedy step plus a {WIDTH}-position "
                f"verify forward costs {'; '.join(parts)}" + (" (timed at start)" if self.source == "measured"
                                                                  else " (timed at an earlier start)"))


def candidates(base: str, presets: dict[str, ModelPreset], device: str = "cpu") -> list[str]:
    """The base preset and its reduced-weight siblings that load on ``device``."""
    if base not in presets or torch.device(device).type != "cpu":
        return [base]
    return [base] + [name for name, p in presets.items()
                     if p.base == base and p.weights != "full" and not p.adapter and runs_here(p, device)]


def measured_costs(load: Callable[[str], Any]) -> Measure:
    """A ``Measure`` that loads a preset and times its verify forwards (``forward_cost.calibrate``)."""
    def measure(name: str) -> dict:
        curve = calibrate(load(name), WIDTH)
        return {1: curve(1), WIDTH: curve(WIDTH)}
    return measure


def decide(costs: dict[str, dict], base: str, margin: float = MARGIN) -> str:
    """The candidate with the cheapest race step (``c(1) + c(WIDTH)``); the base unless beaten by ``margin``."""
    step = {name: c[1] + c[WIDTH] for name, c in costs.items()}
    best = min(step, key=step.get)
    return best if best != base and step[best] < (1 - margin) * step[base] else base


def machine_key(names: list[str]) -> dict:
    return {"version": VERSION, "cpu": cpu_name(),
            "cpu_flags": hashlib.sha1(_cpuinfo("flags").encode()).hexdigest()[:16],
            "threads": torch.get_num_threads(), "torch": torch.__version__, "candidates": sorted(names),
            "width": WIDTH}


def _write(path: Path, key: dict, choice: RouteChoice) -> None:
    entries = [e for e in read_entries(path, VERSION) if e.get("key") != key]
    entries.append({"key": key, "target": choice.target, "costs": choice.costs,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    write_entries(path, VERSION, entries, KEEP_ENTRIES)


def choose(base: str, presets: dict[str, ModelPreset], *, measure: Measure, file: Optional[Path] = None,
           remeasure: bool = False, progress: Optional[Callable[[str], None]] = None) -> RouteChoice:
    """The version of ``base`` to run by default on this machine (see the module docstring)."""
    names = candidates(base, presets)
    if len(names) == 1:
        return RouteChoice(base, base, "only-one")
    key = machine_key(names)
    if file is not None and not remeasure:
        for entry in read_entries(file, VERSION):
            if entry.get("key") == key and entry.get("target") in names:
                return RouteChoice(entry["target"], base, "cache", entry.get("costs", {}))
    if progress:
        progress(f"timing {', '.join(names)} on this CPU to choose the default target (once per machine)")
    t0 = time.perf_counter()
    raw = {name: measure(name) for name in names}
    costs = {name: {"c1_ms": round(c[1], 2), "cW_ms": round(c[WIDTH], 2), "step_ms": round(c[1] + c[WIDTH], 2)}
             for name, c in raw.items()}
    choice = RouteChoice(decide(raw, base), base, "measured", costs, time.perf_counter() - t0)
    if file is not None:
        try:
            _write(file, key, choice)
        except OSError:
            pass                                  # a read-only cache: decide again next time
    return choice
