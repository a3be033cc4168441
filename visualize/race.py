"""The race: columns while a comparison runs, and the replay by wall-clock time. Never imports torch.

Two clocks replay a run. The step clock (``tokens.columns_html(results, step)``)
lines strategies up by target forward passes. The wall clock here lets every
column advance by its own measured timeline (``tokens.event_times``): at time
``t`` a column shows what its strategy had produced ``t`` ms after it started,
so the fastest strategy finishes first on screen, as it did when it ran alone.

While a comparison runs, ``live_columns_html`` draws ``decoding.live.Live``'s
snapshot: finished strategies in full, the running one as it stands (marked),
the rest waiting.
"""

from __future__ import annotations

import html
import math
from typing import Any, Optional

from .tokens import columns_html, duration_ms, number

SPEEDS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)   # replay speed factors offered (1 = real time)


def race_length_ms(results: list[dict]) -> float:
    """How long the replay lasts: the slowest strategy's run, rounded up to a whole millisecond.

    The clock slider holds whole milliseconds; a fractional length would leave its last value just
    short of the end (the slowest column never shown finished, and ▶ replaying from there instead of 0).
    """
    return float(math.ceil(max((duration_ms(r) for r in results), default=0.0)))


def finish_order(results: list[dict]) -> list[tuple[str, float]]:
    """(label, ms) of each strategy that finished without error, fastest first."""
    done = [(str(r.get("label") or r.get("strategy", "?")), duration_ms(r)) for r in results if not r.get("error")]
    return sorted(done, key=lambda x: x[1])


def clamp_ms(value: Any, total: float) -> float:
    """A clock value from the browser, clamped to [0, total]; 0 when it is not a number."""
    v = number(value, None)
    if v is None or v != v:
        return 0.0
    return min(max(float(v), 0.0), float(total))


def race_frame(results: list[dict], at_ms: float) -> str:
    """Every column at ``at_ms`` ms of its own run (``#columns``' content in the wall-clock replay)."""
    return columns_html(results, at_ms=max(0.0, float(at_ms)))


def clock_html(at_ms: float, total_ms: float, speed: Optional[float] = None, results: Optional[list] = None) -> str:
    """The clock readout: elapsed / total, the speed factor, and who has finished by now."""
    at = min(max(at_ms, 0.0), total_ms)
    factor = "" if speed is None else f" · replay at {speed:g}×"
    order = [(name, ms) for name, ms in finish_order(results or []) if ms <= at]
    finished = ""
    if order:
        finished = " · finished: " + ", ".join(f"{i}. {html.escape(name)} ({ms / 1e3:.2f} s)"
                                             for i, (name, ms) in enumerate(order, 1))
    return (f"<div class='dp-clock' data-ms='{at:.0f}'><b>t = {at / 1e3:.2f} s</b> of {total_ms / 1e3:.2f} s"
            f"{factor}{finished}</div>")


def live_columns_html(snapshot: dict) -> str:
    """``Live.snapshot()`` as columns: finished, running (marked), waiting."""
    results = list(snapshot.get("done") or [])
    if snapshot.get("running"):
        results.append(snapshot["running"])
    results += [{"strategy": name, "label": label, "waiting": True, "events": [], "token_ids": []}
                for name, label in snapshot.get("waiting") or []]
    if not results:
        return "<div class='dp-muted'>Loading the model…</div>"
    return columns_html(results)


def live_status(snapshot: dict, max_new: int) -> str:
    """One line for the status: which strategy is running and how far it is."""
    done = len(snapshot.get("done") or [])
    total = done + bool(snapshot.get("running")) + len(snapshot.get("waiting") or [])
    running = snapshot.get("running")
    if not running:
        return f"Finished {done} of {total} strategies."
    name = html.escape(str(running.get("label") or running.get("strategy")), quote=False)
    if running.get("warming"):
        return f"Strategy {done + 1} of {total}: warming up {name} (untimed)…"
    n = len(running.get("token_ids") or ())
    return f"Strategy {done + 1} of {total}: {name} running, {n}/{max_new} tokens…"
