"""Which CPU linear kernel runs which row bucket: measured on this machine, cached per machine and model.

``configure(model, "auto", ...)`` times PyTorch's default kernel and oneDNN's
packed one (``decoding/runtime/kernels.py``) on the model's own linear layers, all of
them in module order (so weights stream from memory as in a real forward, the
LM head included), for one row count per bucket. The two kernels alternate
layer by layer, and each call counts its fastest time over a few repeats (a
busy machine only adds time): a dozen model-sized passes over the linear
weights per repeat. Each bucket then runs every layer on the kernel that was
faster over the whole model's linears (packed must win by ``MARGIN``; a tie
stays on PyTorch's kernel, which needs no packed copy).

The decision is written as JSON (``file``, next to the converted model)
under a key made of the CPU model name and flags, the torch thread count, the
torch version, the model's name, dtype and linear shapes; a changed key
measures again. Without a cache file (tiny test models) it is decided in
memory. ``"packed"`` and ``"default"`` force one kernel for every bucket.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from decoding.runtime import kernels
from decoding.runtime.cpu import CAPS_ENV, cpu_fingerprint, kernel_isa, pytorch_isa  # noqa: F401: re-exported
from decoding.runtime.cpu import cpuinfo as _cpuinfo
from decoding.runtime.kernels import BUCKETS, KINDS, PackedLinear, bucket_label, shape_of

MODES = ("auto", "packed", "default")
PROBE_ROWS = (1, 3, 6, 13, 32, 128)      # one row count inside each of kernels.BUCKETS
REPEATS = 3
BUDGET_S = 6.0                           # no new repeat starts after this long
MARGIN = 0.02
VERSION = 3                              # bump when the timing method changes: old decisions re-measure
KEEP_ENTRIES = 8                         # machines remembered per cache file
SHARED_FILES = 32                        # files kept in the shared folder (models not converted by us)

Timer = Callable[[PackedLinear, str, torch.Tensor], float]


@dataclass
class KernelChoice:
    """What ``configure`` decided, and from what."""
    mode: str                            # auto | packed | default
    source: str                          # measured | cache | forced | unavailable
    table: dict = field(default_factory=dict)          # (in, out) -> kernel per bucket
    bucket_ms: list = field(default_factory=list)      # per bucket: default/packed/chosen ms over all linears
    seconds: float = 0.0                 # time spent measuring

    def record(self) -> dict:
        return {"mode": self.mode, "source": self.source, "measure_s": round(self.seconds, 2),
                "bucket_ms": self.bucket_ms}


# --------------------------------------------------------------------------- machine key

def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_label() -> str:
    """The CPU as benchmark tables name it: the model name, family/model numbers (``AMD EPYC`` alone is
    several generations) and the widest vector ISA, e.g. ``AMD EPYC (family 26 model 2; AVX-512 + BF16)``."""
    flags = set(_cpuinfo("flags").split())
    isa = ("AMX" if "amx_bf16" in flags else "AVX-512 + BF16" if "avx512_bf16" in flags
           else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "")
    family, model = _cpuinfo("cpu family"), _cpuinfo("model")
    detail = "; ".join(x for x in (f"family {family} model {model}" if family else "", isa) if x)
    capped = pytorch_isa()
    if isa and isa != "AVX2" and capped.upper() in ("AVX2", "DEFAULT"):
        detail += f", kernels capped at {capped.upper()}"
    return f"{cpu_name()} ({detail})" if detail else cpu_name()


def machine_key(model: nn.Module, name: str) -> dict:
    counts: dict[tuple, int] = {}
    for _, _, layer in kernels.linear_layers(model):
        counts[shape_of(layer)] = counts.get(shape_of(layer), 0) + 1
    key = {"version": VERSION, "cpu": cpu_name(), "cpu_flags": cpu_fingerprint(),
           "threads": torch.get_num_threads(), "torch": torch.__version__, "model": name,
           "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
           "shapes": sorted([i, o, n] for (i, o), n in counts.items()),
           "buckets": [bucket_label(i) for i in range(len(BUCKETS))], "probe_rows": list(PROBE_ROWS)}
    return json.loads(json.dumps(key))


# --------------------------------------------------------------------------- measuring

def _time(layer: PackedLinear, kind: str, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    layer.run(kind, x)
    return time.perf_counter() - t0


def measure(model: nn.Module, repeats: int = REPEATS, timer: Optional[Timer] = None,
            budget_s: float = BUDGET_S) -> dict:
    """Seconds per ``(shape, bucket, kind)``: over the model's layers of that shape, the sum of
    each call's fastest time among the repeats (a busy machine only ever adds time).

    Every linear layer must be a ``PackedLinear`` (it holds both kernels). Repeats stop
    early, after the first, once ``budget_s`` seconds have gone (a slow or busy machine).
    """
    timer = timer or _time
    layers = [child for _, _, child in kernels.linear_layers(model) if isinstance(child, PackedLinear)]
    dtype = layers[0].weight.dtype
    inputs = {(rows, width): torch.randn(1, rows, width, dtype=dtype)              # [1, rows, in], as a model calls
              for rows in PROBE_ROWS for width in {layer.in_features for layer in layers}}
    fastest = {(i, b, kind): float("inf")
               for i in range(len(layers)) for b in range(len(BUCKETS)) for kind in KINDS}
    with torch.inference_mode():
        first = {shape_of(layer): layer for layer in reversed(layers)}     # warm-up: one layer per shape
        for layer in first.values():
            for rows in PROBE_ROWS:
                for kind in KINDS:
                    layer.run(kind, inputs[(rows, layer.in_features)])
        start = time.perf_counter()
        for rep in range(repeats):
            if rep and time.perf_counter() - start > budget_s:
                break
            for b, rows in enumerate(PROBE_ROWS):
                # both kernels on each layer in turn, their order alternating (a busy spell of the
                # machine hits both alike); each kernel reads its own copy of the weight from memory
                for i, layer in enumerate(layers):
                    x = inputs[(rows, layer.in_features)]
                    for kind in (KINDS if (rep + b + i) % 2 == 0 else KINDS[::-1]):
                        fastest[(i, b, kind)] = min(fastest[(i, b, kind)], timer(layer, kind, x))
    totals: dict = {}
    for (i, b, kind), seconds in fastest.items():
        key = (shape_of(layers[i]), b, kind)
        totals[key] = totals.get(key, 0.0) + seconds
    return totals


def decide(timings: dict, margin: float = MARGIN) -> dict:
    """``{(in, out): kernel per bucket}``: per bucket, one kernel for every layer, packed where the model's
    linears summed beat default by ``margin``.

    One kernel per bucket, not per weight shape: choosing per shape from these isolated timings
    mixed the kernels inside a forward, and the mix lost in whole forwards (the prophet's tree
    verify on 16 held-out prompts: 1.24x greedy mixed, 1.45x all packed, greedy itself unchanged;
    BENCHMARKS.md).
    """
    shapes = sorted({shape for shape, _, _ in timings})
    per_bucket = tuple(
        "packed" if sum(timings[(s, b, "packed")] for s in shapes) < (1 - margin) * sum(
            timings[(s, b, "default")] for s in shapes) else "default"
        for b in range(len(BUCKETS)))
    return {shape: per_bucket for shape in shapes}


def bucket_costs(timings: dict, table: dict) -> list[dict]:
    """Per bucket, the model's linears in ms: all default, all packed, as chosen."""
    rows = []
    for b in range(len(BUCKETS)):
        cost = {kind: 1000 * sum(timings[(shape, b, kind)] for shape in table) for kind in KINDS}
        chosen = 1000 * sum(timings[(shape, b, table[shape][b])] for shape in table)
        rows.append({"rows": bucket_label(b), "probe_rows": PROBE_ROWS[b], "default_ms": round(cost["default"], 3),
                     "packed_ms": round(cost["packed"], 3), "chosen_ms": round(chosen, 3)})
    return rows


# --------------------------------------------------------------------------- cache file

def cache_file(models_root: Path, name: str, converted: bool) -> Path:
    """Where a model's decisions live: inside its converted directory, else in a shared folder."""
    if converted:
        return models_root / name / "kernels.json"
    slug = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
    return models_root.parent / "kernels" / f"{slug}.json"


def prune_shared(folder: Path, keep: int = SHARED_FILES) -> list[Path]:
    """Delete all but the ``keep`` most recently written decision files of the shared folder.

    Every local directory or Hub model gets its own file there (``cache_file``), so a
    process that loads many of them would grow the folder without bound. Returns what it deleted.
    """
    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0
    files = sorted(folder.glob("*.json"), key=mtime, reverse=True)
    gone = []
    for old in files[keep:]:
        try:
            old.unlink()
            gone.append(old)
        except OSError:
            pass
    return gone


def read_entries(path: Path, version: int) -> list:
    """The entries (objects) of a decision file (``{"version", "entries": [...]}``) written at ``version``; []
    otherwise (a file cut short or edited by hand loses what is not an object, never the caller's decision)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        entries = list(doc.get("entries", [])) if doc.get("version") == version else []
        return [entry for entry in entries if isinstance(entry, dict)]
    except (OSError, ValueError, AttributeError, TypeError):      # TypeError: "entries" not a list
        return []


def write_entries(path: Path, version: int, entries: list, keep: int) -> None:
    """Write a decision file atomically, keeping the ``keep`` newest entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": version, "entries": entries[-keep:]}, fh, indent=1)
    tmp.replace(path)


def _read(path: Path) -> list:
    return read_entries(path, VERSION)


def read_cache(path: Path, key: dict) -> Optional[dict]:
    for entry in _read(path):
        if entry.get("key") == key:
            return entry
    return None


def write_cache(path: Path, key: dict, choice: KernelChoice) -> None:
    entries = [e for e in _read(path) if e.get("key") != key]
    entries.append({"key": key, "table": [[i, o, list(c)] for (i, o), c in sorted(choice.table.items())],
                    "bucket_ms": choice.bucket_ms, "measure_s": round(choice.seconds, 2),
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None})
    write_entries(path, VERSION, entries, KEEP_ENTRIES)


# --------------------------------------------------------------------------- choosing

def configure(model: nn.Module, mode: str = "auto", *, name: str = "model", file: Optional[Path] = None,
              timer: Optional[Timer] = None, repeats: int = REPEATS, budget_s: float = BUDGET_S,
              remeasure: bool = False, progress: Optional[Callable[[str], None]] = None) -> KernelChoice:
    """Put the model's linear layers on the kernels ``mode`` asks for (see the module docstring).

    ``remeasure`` times the kernels even when ``file`` holds a decision for this key
    (for example one taken while the machine was busy) and replaces it.
    """
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {MODES}, got {mode!r}")
    if kernels.packable_dtype(model) is None:
        return KernelChoice(mode, "unavailable")
    if mode != "auto":
        return KernelChoice(mode, "forced" if kernels.apply(model, mode) or mode == "default" else "unavailable")
    key = machine_key(model, name)
    entry = read_cache(file, key) if file is not None and not remeasure else None
    if entry is not None:
        table = {(i, o): tuple(c) for i, o, c in entry["table"]}
        kernels.apply(model, table)
        return KernelChoice(mode, "cache", table, entry.get("bucket_ms", []), entry.get("measure_s", 0.0))
    if progress:
        progress("timing both CPU linear kernels on this machine (once per machine and model)")
    t0 = time.perf_counter()
    if not kernels.apply(model, "packed"):            # every layer holds both kernels while timing
        return KernelChoice(mode, "unavailable")
    timings = measure(model, repeats=repeats, timer=timer, budget_s=budget_s)
    table = decide(timings)
    kernels.apply(model, table)                       # drops the packed copies no bucket uses
    choice = KernelChoice(mode, "measured", table, bucket_costs(timings, table), time.perf_counter() - t0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if progress and load > (os.cpu_count() or 1):
        progress(f"the machine was busy while timing (load {load:.1f} on {os.cpu_count()} CPUs); the kernel "
                 f"choice may be off: `python benchmarks/bench_forward_cost.py --remeasure` times them again")
    if file is not None:
        try:
            write_cache(file, key, choice)
            if file.name != "kernels.json":           # the shared folder (cache_file): bounded
                prune_shared(file.parent)
        except OSError:
            pass                                      # a read-only cache: decide again next time
    return choice
