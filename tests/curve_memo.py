"""One forward-cost curve per real-sized model and test run (the suite's ``curve_once_per_run`` fixture).

A real-sized model's curve (``runtime/forward_cost.calibrate``: a dozen widths, each timed until two agree) costs
seconds on a fast CPU and several times that where memory is slow (an AMD EPYC Zen 3 streams float32 weights at a
sixth of a Xeon's rate). The app times it once per loaded model. A test that loads the bundled model afresh and runs
lookahead's or Jacobi's automatic width, or the prophet's budget, would time it again, though its subject is not
the curve (``tests/forward_clock.py`` found five such tests, ~50 s of a Xeon's run). So a worker keeps the curve
of each (model, dtype, device, mode, width, threads, linear kernels, compiled or not) it timed and hands a copy to
the next such load: measured on this machine, in this run, as the app would have measured it. Calls that pass
their own timer or repeats (the curve's own tests) and tiny models are timed every time.

The memo times ``REPEATS`` passes per width, never the adaptive extra ones (``MAX_REPEATS``, up to twice the
first passes' cost): beside another worker's forwards a width's fastest two times often disagree by more than 3 %,
and the extra passes made the suite's curves cost 35 s of a Xeon's forwards instead of 25, for tests whose subject
is not how sure the curve is. The adaptive rule has its own tests (``tests/test_forward_cost_repeats.py``, with
injected timers).

With ``shared`` (a folder one run's workers share: ``conftest.curve_once_per_run``) the workers time each key once
between them: the first to need it times it under a lock on the key's file and leaves it there, and a worker that
needs it meanwhile waits for it rather than timing the same curve beside it (the served app of each worker timed
the bundled model's curve, ~6 s of a Xeon's forwards apiece).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import pickle
from pathlib import Path
from typing import Any, Callable, Optional

MIN_HIDDEN = 512        # the bundled models' hidden sizes are 576 and 640; the tiny test models' are <= 128


def curve_key(lm: Any, max_width: int, fast: bool) -> tuple:
    import torch

    from decoding.runtime import compiled, kernels
    return (getattr(lm, "name", None), str(lm.dtype), str(lm.device), bool(fast), int(max_width),
            torch.get_num_threads(), kernels.label(lm.model), compiled.engine(lm) is not None)


def curve_memo(timed: Callable[..., Any], store: dict, min_hidden: int = MIN_HIDDEN,
               shared: Optional[Path] = None) -> Callable[..., Any]:
    """``forward_cost.calibrate`` that times a model of hidden size >= ``min_hidden`` once per key (``store``
    keeps the curves; ``shared``: a folder whose curves other processes timed, see the module docstring) and
    returns a copy each time: a loaded model's curve dies with the model, as the app's does
    (tests/test_model_state.py checks that)."""
    def fixed(lm: Any, max_width: int, fast: bool) -> Any:
        from decoding.runtime.forward_cost import REPEATS
        return timed(lm, max_width, fast=fast, max_repeats=REPEATS)

    def calibrate(lm: Any, max_width: int, *, fast: bool = False, **options: Any) -> Any:
        hidden = getattr(getattr(getattr(lm, "model", None), "config", None), "hidden_size", 0) or 0
        if options or hidden < min_hidden:
            return timed(lm, max_width, fast=fast, **options)
        key = curve_key(lm, max_width, fast)
        if key not in store:
            store[key] = fixed(lm, max_width, fast) if shared is None else _shared(shared, key,
                                                                                   lambda: fixed(lm, max_width, fast))
        return dataclasses.replace(store[key])
    return calibrate


def _shared(folder: Path, key: tuple, time_it: Callable[[], Any]) -> Any:
    """The curve of ``key`` from ``folder``, timed (by ``time_it``) and left there by the first process to ask."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (hashlib.sha256(repr(key).encode()).hexdigest()[:24] + ".pickle")
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # released when the file closes, an exception included
        if path.exists():
            return pickle.loads(path.read_bytes())
        curve = time_it()
        path.write_bytes(pickle.dumps(curve))
        return curve
