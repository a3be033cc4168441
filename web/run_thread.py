"""The run thread: a comparison runs in a worker thread while the caller watches what it has produced so far."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

from decoding.context import RunContext
from decoding.harness.runner import planned_lanes, run_comparison
from decoding.runtime import omp_pool
from web.live import Live
from web.loading import Prepared


def stream_comparison(prep: Prepared, plan: list[tuple[str, Any]], *, stop: threading.Event,
                      context: Optional[RunContext] = None, time_limit_s: Optional[float] = None,
                      poll_s: float = 0.2, quiet_s: float = 1.0, rivals: Sequence[Prepared] = (),
                      threads: Optional[int] = None) -> Any:
    """Run the comparison in a worker thread; yield ``("live", Live.snapshot())`` while it runs, then
    ``("done", [RunResult])``.

    ``rivals``: the same request prepared on other models (a race of two models). The plan runs on ``prep``'s
    model, then on each rival's, each with its own greedy reference, all within ``time_limit_s``; every result
    names its model (``RunResult.model``), and the rivals' lanes show as waiting from the start.

    A snapshot is yielded every ``poll_s`` when something changed (a token, a new strategy), else every ``quiet_s``.
    Strategies still run one after the other, so their timings are what each gets alone. Closing the generator early
    (the browser left) sets ``stop`` and waits for the run to end at its next event. ``threads``: PyTorch's thread
    count for the whole run (``web.contention``: one where other processes hold the cores); None keeps the default.
    """
    live, box = Live(), {}
    preps = [prep, *rivals]
    for rival in rivals:
        live.then(planned_lanes(plan, rival.model))
    deadline = time.perf_counter() + time_limit_s if time_limit_s else None

    def work() -> None:
        try:
            results: list = []
            with omp_pool.threads(threads):
                for one in preps:
                    if results and stop.is_set():
                        break
                    left = None if deadline is None else max(deadline - time.perf_counter(), 1e-3)
                    results += run_comparison(one.prompt_ids, one.pair, plan, max_new_tokens=one.max_new,
                                              seed=one.seed, should_stop=stop.is_set, time_limit_s=left,
                                              context=context, live=live, model=one.model if rivals else None)
            box["results"] = results
        except BaseException as exc:    # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="decoding-run", daemon=True)
    omp_pool.release()         # this thread only watches now: its OpenMP pool would slow every step (runtime/omp_pool)
    thread.start()
    last, shown = None, 0.0
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if not thread.is_alive():
                break
            snap = live.snapshot()
            running = snap["running"] or {}
            sig = (len(snap["done"]), running.get("strategy"), running.get("warming"),
                   len(running.get("events") or ()))
            if sig != last or time.monotonic() - shown >= quiet_s:
                last, shown = sig, time.monotonic()
                yield "live", snap
    finally:
        if thread.is_alive():
            stop.set()
            thread.join()
    if "error" in box:
        raise box["error"]
    yield "done", box["results"]
