"""Where the suite's model time goes: an opt-in pytest plugin that clocks, per test, the seconds spent in the
decoder layers and LM heads of real-sized models (hidden size >= ``MIN_HIDDEN``: the bundled SmolLM2 and Gemma,
not the tiny random models), in this process (a subprocess the test starts, such as ``app.py``, is not seen).

    pytest -p forward_clock -n 2 --dist loadfile ...        # writes build/forward-clock/<worker>.json
    python tests/forward_clock.py build/forward-clock       # seconds per file, largest first

Why: a CPU with a third of the memory bandwidth (an AMD EPYC Zen 3 here reads float32 weights at ~7 GB/s where
an Intel Xeon reads ~40) spends most of the suite in these forwards, so a test that runs the bundled model for
more tokens than its check needs costs several times more there than on the machine it was written on. The
clock finds them on any machine. Compiled forwards (inductor graphs) are not clocked: the hooks stand aside
while the compiler traces.
"""

from __future__ import annotations

import json
import os
import sys
import time
import weakref
from collections import defaultdict
from pathlib import Path

MIN_HIDDEN = 512        # the bundled models: 576 (SmolLM2-135M) and 640 (Gemma 3 270M); the tiny ones are <= 128
MIN_HEAD = 10_000_000   # an LM head's weights: 49152 x 576 and 262144 x 640
FOLDER = Path(os.environ.get("FORWARD_CLOCK_DIR", "build/forward-clock"))

_state = {"test": None, "depth": 0, "start": 0.0}
_seconds: dict = defaultdict(float)
_calls: dict = defaultdict(int)
_curves: dict = defaultdict(float)   # seconds of it spent timing forward-cost curves (runtime/forward_cost.calibrate)
_clocked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # module -> clocked (a big layer or head)


def _is_clocked(module) -> bool:
    if module not in _clocked:
        name = type(module).__name__
        weight = getattr(module, "weight", None)
        if name.endswith("DecoderLayer"):
            norm = getattr(module, "input_layernorm", None)
            size = getattr(getattr(norm, "weight", None), "numel", lambda: 0)()
            _clocked[module] = size >= MIN_HIDDEN
        else:
            _clocked[module] = weight is not None and getattr(weight, "ndim", 0) == 2 and weight.numel() >= MIN_HEAD \
                and "Embedding" not in name
    return _clocked[module]


def _pre(module, args):
    import torch            # here, not at the top: `python tests/forward_clock.py` only sums JSON files
    if torch.compiler.is_compiling() or _state["test"] is None or not _is_clocked(module):
        return              # the compiler's check first: a graph guarded on _state would compile again
    if _state["depth"] == 0:
        _state["start"] = time.perf_counter()
    _state["depth"] += 1


def _post(module, args, output):
    import torch
    if torch.compiler.is_compiling() or _state["test"] is None or not _is_clocked(module) or _state["depth"] == 0:
        return
    _state["depth"] -= 1
    if _state["depth"] == 0:
        _seconds[_state["test"]] += time.perf_counter() - _state["start"]
        _calls[_state["test"]] += 1


def pytest_configure(config):
    import torch

    from decoding.runtime import forward_cost
    torch.nn.modules.module.register_module_forward_pre_hook(_pre)
    torch.nn.modules.module.register_module_forward_hook(_post)
    calibrate = forward_cost.calibrate

    def clocked(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return calibrate(*args, **kwargs)
        finally:
            if _state["test"] is not None:
                _curves[_state["test"]] += time.perf_counter() - t0
    forward_cost.calibrate = clocked


def pytest_runtest_setup(item):
    _state["test"], _state["depth"] = item.nodeid, 0


def pytest_runtest_teardown(item, nextitem):
    _state["test"] = item.nodeid            # a module fixture's teardown counts toward the file's last test


def pytest_unconfigure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    FOLDER.mkdir(parents=True, exist_ok=True)
    rows = {test: {"seconds": round(s, 3), "calls": _calls[test], "curve_s": round(_curves.get(test, 0.0), 3)}
            for test, s in _seconds.items()}
    (FOLDER / f"{worker}.json").write_text(json.dumps(rows, indent=1))


def by_file(folder: Path) -> list[tuple[str, float, int]]:
    """(file, seconds, clocked calls, of the seconds those timing forward-cost curves) summed over every worker's
    JSON in ``folder``, largest first."""
    total: dict = defaultdict(float)
    calls: dict = defaultdict(int)
    curves: dict = defaultdict(float)
    for path in sorted(folder.glob("*.json")):
        for test, row in json.loads(path.read_text()).items():
            total[test.split("::")[0]] += row["seconds"]
            calls[test.split("::")[0]] += row["calls"]
            curves[test.split("::")[0]] += row.get("curve_s", 0.0)
    return sorted(((f, s, calls[f], curves[f]) for f, s in total.items()), key=lambda r: -r[1])


if __name__ == "__main__":
    rows = by_file(Path(sys.argv[1] if len(sys.argv) > 1 else FOLDER))
    for file, seconds, n, curve in rows:
        print(f"{seconds:8.1f} s {n:8d} calls {curve:7.1f} s curves  {file}")
    print(f"{sum(r[1] for r in rows):8.1f} s in all, {sum(r[3] for r in rows):.1f} s of it timing curves")
