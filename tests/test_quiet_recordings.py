"""A run timed while something else used the cores is not recorded, and the example recorder tries again later.

What would break it: recording whatever was timed (the old behaviour: a run timed under load replayed to every
visitor since), comparing against the wrong cost (an inverted test records only the busy runs), or the
recorder dropping an example whose run was refused for noise instead of recording it when the machine is quiet.
The decision reads the target's calibrated one-position forward (``forward_cost``), injected here: no timing
is asserted.
"""

from __future__ import annotations

import dataclasses
import threading

from decoding.runtime import omp_pool
from web import compute
from web.app_object import PlaygroundApp
from web.recordings import Recordings
from web.requests import default_request
from web.settings import DEFAULT_SETTINGS

from decoding.runtime.forward_cost import ForwardCost

QUIET = dataclasses.replace(DEFAULT_SETTINGS, quiet_recordings=True)


def _fake_run(step_ms: float, threads: int = 2):
    def fake(stop, req, budget_s=0):        # greedy: 10 forwards of step_ms each, on ``threads``
        result = {"strategy": "greedy", "token_ids": [1] * 10, "error": None, "stop_reason": "max_new_tokens",
                  "target_forwards": 10, "wall_s": step_ms * 10 / 1000.0, "events": []}
        yield "done", {"environment": {"cpu": "test CPU", "threads": threads}, "results": [result]}, "Ran 1.", []
    return fake


def _with_one_row_cost(monkeypatch, ms: float) -> None:
    monkeypatch.setattr(compute, "forward_cost", lambda lm, width, fast=False: ForwardCost({1: ms}))
    monkeypatch.setattr(type(QUIET), "load", lambda self, name: object())


def test_a_run_timed_under_load_is_served_but_not_recorded(monkeypatch, caplog):
    """... and the operator's log says why (``/race``'s document has no message; benchmarks/bench_start.py reads
    the log), without the prompt."""
    state = PlaygroundApp(QUIET, recordings=Recordings(2**20))
    _with_one_row_cost(monkeypatch, 20.0)
    for step_ms, recorded in ((24.0, True), (80.0, False)):      # 1.2x the quiet cost; 4x it
        monkeypatch.setattr(compute, "compute_run", _fake_run(step_ms))
        req = dataclasses.replace(default_request(f"Step {step_ms}.", QUIET))
        comp, _ = compute.submit_run(state, req)
        comp.done.wait(10)
        assert (state.recordings.get(req.key) is not None) == recorded, step_ms
        assert comp.result.quiet == recorded
        assert ("Not recorded" in comp.result.message) == (not recorded)
        assert comp.result.doc["results"][0]["token_ids"] == [1] * 10          # the visitor still gets the run
        logged = [r.getMessage() for r in caplog.records if compute.NOT_RECORDED in r.getMessage()]
        assert len(logged) == (0 if recorded else 1), step_ms
        if not recorded:
            assert "greedy's decode steps took 80 ms" in logged[0] and f"Step {step_ms}" not in logged[0]
            assert "recorded when the machine is quiet" not in logged[0]
        caplog.clear()
        comp.leave()


def test_a_run_sent_to_one_thread_by_a_busy_machine_is_not_recorded_however_quick(monkeypatch):
    """Other processes held the cores when it started, so it computed on one thread (web/contention.py): its steps
    came out within the quiet line (the compiled one-thread graph is ready from the start) and its /proc window was
    too short to tell, yet its timings are a busy machine's. The same run on every thread is recorded."""
    state = PlaygroundApp(QUIET, recordings=Recordings(2**20))
    _with_one_row_cost(monkeypatch, 20.0)
    with omp_pool.threads(2):
        for threads, recorded in ((1, False), (2, True)):
            monkeypatch.setattr(compute, "compute_run", _fake_run(21.0, threads))
            req = default_request(f"On {threads} threads.", QUIET)
            comp, _ = compute.submit_run(state, req)
            comp.done.wait(10)
            assert (state.recordings.get(req.key) is not None) == recorded, threads
            assert ("computed on 1 of this app's 2 threads" in comp.result.message) == (not recorded)
            comp.leave()


def test_without_the_setting_every_complete_run_is_recorded(monkeypatch):
    state = PlaygroundApp(recordings=Recordings(2**20))
    _with_one_row_cost(monkeypatch, 20.0)
    monkeypatch.setattr(compute, "compute_run", _fake_run(80.0))
    req = default_request("Any timing.")
    comp, _ = compute.submit_run(state, req)
    comp.done.wait(10)
    assert state.recordings.get(req.key) is not None and comp.result.quiet
    comp.leave()


def test_the_recorder_records_a_busy_example_again_when_the_machine_is_quiet(monkeypatch):
    soon = dataclasses.replace(QUIET, limits=dataclasses.replace(QUIET.limits, quiet_retry_idle=1))
    state = PlaygroundApp(soon, recordings=Recordings(2**20))
    _with_one_row_cost(monkeypatch, 20.0)
    steps = iter([90.0, 85.0, 22.0])                            # busy, busy, then quiet
    tries = []

    def fake(stop, req, budget_s=0):
        tries.append(1)
        yield from _fake_run(next(steps))(stop, req)
    monkeypatch.setattr(compute, "compute_run", fake)
    done = []
    recorder = threading.Thread(target=lambda: done.append(compute.record_examples(state, ["Busy."], idle_s=0.01)))
    recorder.start()
    recorder.join(20)
    assert done == [1] and len(tries) == 3
    assert state.recordings.get(default_request("Busy.", QUIET).key) is not None


def test_the_recorder_is_not_counted_as_a_visitor():
    """A visitor who joins the example recorder's run is told about visitors only: the recorder is not one."""
    from web.crowd import Computation
    recorded = Computation("k", lambda comp: None, background=True)
    recorded.subscribe()                      # the recorder
    assert recorded.visitors == 0
    recorded.subscribe()                      # a visitor asking for the same run
    assert recorded.visitors == 1 and not recorded.background
    visitors = Computation("k2", lambda comp: None)
    visitors.subscribe()
    visitors.subscribe()
    assert visitors.visitors == 2
