"""One forward-cost curve per real-sized model and worker (the suite's ``curve_once_per_worker`` fixture).

A real-sized model's curve (``runtime/forward_cost.calibrate``: a dozen widths, each timed until two agree) costs
seconds on a fast CPU and several times that where memory is slow (an AMD EPYC Zen 3 streams float32 weights at a
sixth of a Xeon's rate). The app times it once per loaded model. A test that loads the bundled model afresh and runs
lookahead's or Jacobi's automatic width, or the prophet's budget, would time it again, though its subject is not
the curve (``tests/forward_clock.py`` found five such tests, ~50 s of a Xeon's run). So a worker keeps the curve
of each (model, dtype, device, mode, width, threads, linear kernels, compiled or not) it timed and hands a copy to
the next such load: measured on this machine, by this process, as the app would have measured it. Calls that pass
their own timer or repeats (the curve's own tests) and tiny models are timed every time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

MIN_HIDDEN = 512        # the bundled models' hidden sizes are 576 and 640; the tiny test models' are <= 128


def curve_key(lm: Any, max_width: int, fast: bool) -> tuple:
    import torch

    from decoding.runtime import compiled, kernels
    return (getattr(lm, "name", None), str(lm.dtype), str(lm.device), bool(fast), int(max_width),
            torch.get_num_threads(), kernels.label(lm.model), compiled.engine(lm) is not None)


def curve_memo(timed: Callable[..., Any], store: dict, min_hidden: int = MIN_HIDDEN) -> Callable[..., Any]:
    """``forward_cost.calibrate`` that times a model of hidden size >= ``min_hidden`` once per key (``store``
    keeps the curves) and returns a copy each time: a loaded model's curve dies with the model, as the app's does
    (tests/test_model_state.py checks that)."""
    def calibrate(lm: Any, max_width: int, *, fast: bool = False, **options: Any) -> Any:
        hidden = getattr(getattr(getattr(lm, "model", None), "config", None), "hidden_size", 0) or 0
        if options or hidden < min_hidden:
            return timed(lm, max_width, fast=fast, **options)
        key = curve_key(lm, max_width, fast)
        if key not in store:
            store[key] = timed(lm, max_width, fast=fast)
        return dataclasses.replace(store[key])
    return calibrate
