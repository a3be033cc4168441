"""Which version of the default model this machine serves, and in which mode: measured, never assumed.

A preset can have reduced-weight siblings (``weights: fp16`` / ``bf16`` in ``presets/models.yaml``): other
models, each exact against its own greedy, whose forwards cost differently on each CPU. Each version can also
run eagerly or compiled (``runtime/compiled.py``; where a C++ compiler exists and the version's linears compile).
No pair is right everywhere: on an Intel Xeon with AMX the compiled bfloat16-weight version won; on an AMD EPYC
Zen 3 the float16-weight version's bare forward measured 40 % cheaper than float32's at start, yet in the race
both ran at ~80 ms a token. So a :class:`Config` (version x mode) is ranked by its **race step**, timed as the
race runs it (``Measure``: ``harness/steps.race_costs`` runs the race's own greedy loop and a verify forward in
that mode), never by a bare forward: one greedy step plus one ``WIDTH``-position verify forward (a typical tree
or window). The base preset, eager, keeps the default unless another config beats it by ``MARGIN``.

Measuring a compiled config needs its graphs compiled (a minute or two on 2 cores the first time), so the app
measures the eager configs first, serves the best of them at once, and finishes the ranking in the background
(``web/startup.py``). The decision is cached per machine: CPU name, flags and the kernels' instruction set,
threads, torch version, the candidates; a changed key measures again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from decoding.runtime.kernel_choice import cpu_fingerprint, cpu_label, cpu_name, read_entries, write_entries
from decoding.runtime.models import ModelPreset, runs_here

WIDTH = 10            # a typical verify forward: the prophet's 8-node tree with its root and a spare row
MARGIN = 0.05         # another config must make the race step this much cheaper to replace the base, eager
VERSION = 2           # 2: configs (version x mode) ranked by the race's own step
KEEP_ENTRIES = 8
COMPILED_WEIGHTS = ("full", "bf16", "fp16", "int8", "w8a8")   # weights the compiled forward can take (compiled.why_not has the word)


@dataclass(frozen=True, order=True)
class Config:
    """One way to serve the default model: a version (preset) and a mode (eager or compiled)."""
    preset: str
    compiled: bool = False

    @property
    def label(self) -> str:
        return f"{self.preset} ({'compiled' if self.compiled else 'eager'})"

    @property
    def key(self) -> str:
        return f"{self.preset}|{'compiled' if self.compiled else 'eager'}"

    @staticmethod
    def parse(key: str) -> "Config":
        preset, _, mode = str(key).rpartition("|")
        if not preset or mode not in ("eager", "compiled"):
            raise ValueError(f"not a config key: {key!r}")
        return Config(preset, mode == "compiled")


Measure = Callable[[Config], dict]       # config -> {1: a greedy step's ms, WIDTH: a verify forward's ms}


@dataclass(frozen=True)
class RouteChoice:
    """The config the app serves by default here, and why."""
    config: Config
    base: str
    source: str                               # measured | cache | only-one | partial (compiled still to come)
    costs: dict = field(default_factory=dict)  # config key -> {"c1_ms", "cW_ms", "step_ms"}
    seconds: float = 0.0

    @property
    def target(self) -> str:
        return self.config.preset

    @property
    def reason(self) -> str:
        """One line for the page and the log."""
        if len(self.costs) < 2:
            return f"{self.config.label}: the only way {self.base} runs on this machine"
        ranked = sorted(self.costs.items(), key=lambda kv: kv[1]["step_ms"])
        parts = [f"{Config.parse(k).label} {c['c1_ms']:.0f} + {c['cW_ms']:.0f} ms" for k, c in ranked]
        when = {"measured": " (timed at start)", "partial": " (timed at start; compiled versions still to come)"}
        return (f"{self.config.label} serves by default on this CPU ({cpu_label()}): a greedy step as the race runs "
                f"it plus a {WIDTH}-position verify forward costs {'; '.join(parts)}"
                + when.get(self.source, " (timed at an earlier start)"))


def versions(base: str, presets: dict[str, ModelPreset], device: str = "cpu") -> list[str]:
    """The base preset and its reduced-weight siblings that load on ``device``."""
    if base not in presets or torch.device(device).type != "cpu":
        return [base]
    return [base] + [name for name, p in presets.items()
                     if p.base == base and p.weights != "full" and not p.adapter and runs_here(p, device)]


def candidates(base: str, presets: dict[str, ModelPreset], device: str = "cpu", *,
               can_compile: bool = False) -> list[Config]:
    """Every config of ``base``: each version eager, and compiled where ``can_compile`` (a compiler here)."""
    names = versions(base, presets, device)
    configs = [Config(name) for name in names]
    if can_compile and torch.device(device).type == "cpu":
        configs += [Config(name, True) for name in names
                    if (presets[name].weights if name in presets else "full") in COMPILED_WEIGHTS]
    return configs


def decide(costs: dict[Config, dict], base: Config, margin: float = MARGIN) -> Config:
    """The config with the cheapest race step (``c(1) + c(WIDTH)``); ``base`` unless beaten by ``margin``."""
    step = {config: c[1] + c[WIDTH] for config, c in costs.items()}
    best = min(step, key=lambda config: (step[config], config))
    if base not in step:
        return best
    return best if best != base and step[best] < (1 - margin) * step[base] else base


def machine_key(configs: Sequence[Config]) -> dict:
    return {"version": VERSION, "cpu": cpu_name(), "cpu_flags": cpu_fingerprint(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "candidates": sorted(c.key for c in configs), "width": WIDTH}


def cached(base: str, configs: Sequence[Config], file: Optional[Path]) -> Optional[RouteChoice]:
    """The decision an earlier start took on this machine for these configs, if any."""
    if file is None:
        return None
    key, keys = machine_key(configs), {c.key for c in configs}
    for entry in read_entries(file, VERSION):
        if entry.get("key") == key and entry.get("config") in keys:
            return RouteChoice(Config.parse(entry["config"]), base, "cache", entry.get("costs", {}))
    return None


def _write(path: Path, key: dict, choice: RouteChoice) -> None:
    entries = [e for e in read_entries(path, VERSION) if e.get("key") != key]
    entries.append({"key": key, "config": choice.config.key, "costs": choice.costs,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    write_entries(path, VERSION, entries, KEEP_ENTRIES)


def cost_entry(c1: float, cw: float) -> dict:
    """A config's cached costs: a greedy step, a ``WIDTH``-position verify forward, and their sum (ms)."""
    return {"c1_ms": round(c1, 2), "cW_ms": round(cw, 2), "step_ms": round(c1 + cw, 2)}


def rank(base: str, configs: Sequence[Config], *, measure: Measure, earlier: Optional[dict] = None,
         progress: Optional[Callable[[str], None]] = None, final: bool = True) -> RouteChoice:
    """Measure each config of ``configs`` not in ``earlier`` (config key -> costs already measured) and pick."""
    t0 = time.perf_counter()
    costs = dict(earlier or {})
    for config in configs:
        if config.key in costs:
            continue
        if progress:
            progress(f"timing {config.label}'s race step on this CPU")
        c = measure(config)
        costs[config.key] = cost_entry(c[1], c[WIDTH])
    raw = {Config.parse(k): {1: c["c1_ms"], WIDTH: c["cW_ms"]} for k, c in costs.items()}
    chosen = decide(raw, Config(base))
    return RouteChoice(chosen, base, "measured" if final else "partial", costs, time.perf_counter() - t0)


def choose(base: str, presets: dict[str, ModelPreset], *, measure: Measure, file: Optional[Path] = None,
           remeasure: bool = False, can_compile: bool = False,
           progress: Optional[Callable[[str], None]] = None) -> RouteChoice:
    """The config of ``base`` to serve by default on this machine, every candidate measured in one go (the CLI
    and benchmarks; the app splits it in two, ``web/startup.py``)."""
    configs = candidates(base, presets, can_compile=can_compile)
    if len(configs) == 1:
        return RouteChoice(configs[0], base, "only-one")
    hit = None if remeasure else cached(base, configs, file)
    if hit is not None:
        return hit
    choice = rank(base, configs, measure=measure, progress=progress)
    remember(file, configs, choice)
    return choice


def remember(file: Optional[Path], configs: Sequence[Config], choice: RouteChoice) -> None:
    """Cache a final decision for this machine (a read-only cache: decided again next time)."""
    if file is None or choice.source != "measured":
        return
    try:
        _write(file, machine_key(configs), choice)
    except OSError:
        pass


def measured_by(run: Callable[[Any, bool], dict], load: Callable[[str], Any]) -> Measure:
    """A ``Measure`` that loads a config's version and times it with ``run(lm, compiled)``."""
    return lambda config: run(load(config.preset), config.compiled)
