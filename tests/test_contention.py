"""A run computes on one thread while other processes hold the cores (web/contention.py).

What would break it: the share read the wrong way round (a quiet machine drops to one thread, a busy one keeps
two), the count not put back after a run (every later run on one thread), the count set after the run began
computing, or a busy run that does not say why it computed on one thread.
"""

from __future__ import annotations

import threading

import pytest
import torch

from decoding.runtime import omp_pool
from web import compute, contention, run_thread
from web.loading import Prepared
from web.quiet import CpuTimes


def test_a_run_computes_on_one_thread_only_where_others_hold_the_cores():
    assert contention.run_threads(2, None) == 2                  # /proc cannot tell: as the app runs
    assert contention.run_threads(2, 0.0) == 2
    assert contention.run_threads(2, contention.BUSY_SHARE - 0.01) == 2
    assert contention.run_threads(2, contention.BUSY_SHARE) == 1
    assert contention.run_threads(4, 1.0) == 1
    assert contention.run_threads(1, 1.0) == 1


def test_the_watch_reads_others_share_over_its_window():
    """Scripted /proc readings, 100 jiffies a step over 2 cores: this process took 40 of each step's busy jiffies,
    others the rest."""
    clock = {"busy": 0, "own": 0, "total": 0}

    def step(busy: int, own: int) -> None:
        clock["total"] += 200
        clock["busy"] += busy
        clock["own"] += own

    reader = lambda: CpuTimes(clock["total"], clock["busy"], clock["own"], 2)   # noqa: E731
    watch = contention.CpuWatch(cpu=reader, period_s=3600, span_s=3600)      # every reading kept
    watch._thread = threading.current_thread()                  # no sampler thread: readings by hand
    watch._sample()
    step(busy=60, own=40)                                        # others: 20 of 200 jiffies
    assert watch.share() == pytest.approx(0.1)
    assert contention.run_threads(2, watch.share()) == 2
    step(busy=200, own=20)                                       # two busy loops: others 180 of 200
    assert watch.share() == pytest.approx(0.5)                   # over both steps: 200 of 400
    assert contention.run_threads(2, watch.share()) == 1


def test_a_runs_count_holds_for_the_run_and_is_put_back():
    before = torch.get_num_threads()
    with omp_pool.threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with omp_pool.threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("a run that fails")
    assert torch.get_num_threads() == before


def test_the_run_thread_sets_its_count_before_it_computes(monkeypatch):
    seen = []
    monkeypatch.setattr(run_thread, "run_comparison",
                        lambda *args, **kwargs: seen.append(torch.get_num_threads()) or [])
    prep = Prepared(pair=None, prompt_ids=[1, 2], max_new=2, seed=0, model="m", note="")
    steps = list(run_thread.stream_comparison(prep, [("greedy", None)], stop=threading.Event(), poll_s=0.01,
                                              threads=1))
    assert steps[-1] == ("done", []) and seen == [1]


def test_a_busy_run_says_it_computed_on_one_thread(monkeypatch):
    """Through ``compute_run``: the count ``contention.choose`` gives reaches the run's thread, and the status line
    says why the run used one thread; a quiet run's line says nothing of it."""
    counts = []

    def fake_stream(prep, plan, **kwargs):
        counts.append(kwargs.get("threads"))
        yield "done", []
    monkeypatch.setattr(compute, "stream_comparison", fake_stream)
    monkeypatch.setattr(compute, "prepare_checked", lambda *args, **kwargs: Prepared(
        pair=None, prompt_ids=[1, 2], max_new=2, seed=0, model="m", note=""))
    monkeypatch.setattr(compute, "run_document", lambda *args: ({"environment": {"threads": 2}, "results": []},
                                                                 "Ran greedy."))
    monkeypatch.setattr(compute, "history_outputs", lambda results: [])

    class Inputs:
        prompt, chat = "hi", False

        @staticmethod
        def rival():
            return None

    class Limits:
        history_tokens, time_limit_s = 0, 10

    class Settings:
        limits, load = Limits(), None

    class Generation:
        active = False

    class Req:
        plan, inputs, settings, generation, history = [("greedy", {})], Inputs(), Settings(), Generation(), None
    with omp_pool.threads(2):               # the app's count (the suite's workers run on one each)
        for busy in (True, False):
            monkeypatch.setattr(contention, "choose", lambda busy=busy: 1 if busy else 2)
            *_, done = list(compute.compute_run.__wrapped__(threading.Event(), Req()) if hasattr(
                compute.compute_run, "__wrapped__") else compute.compute_run(threading.Event(), Req()))
            assert done[0] == "done"
            assert (contention.BUSY_NOTE in done[2]) == busy
            # the document says the count the run computed on (the process's is back to 2 by then)
            assert done[1]["environment"]["threads"] == (1 if busy else 2)
    assert counts == [1, 2]


def test_the_watch_forgets_what_is_older_than_its_window(monkeypatch):
    """Busy a while ago, quiet for the last second: the share is the last second's (a run is not sent to one thread
    for a load that has gone)."""
    now = {"t": 0.0}
    monkeypatch.setattr(contention.time, "monotonic", lambda: now["t"])
    clock = {"busy": 0, "own": 0, "total": 0}
    reader = lambda: CpuTimes(clock["total"], clock["busy"], clock["own"], 2)   # noqa: E731
    watch = contention.CpuWatch(cpu=reader, period_s=3600, span_s=1.0)
    watch._thread = threading.current_thread()
    for busy in (True, True, False, False, False):               # readings every half second
        watch._sample()
        now["t"] += 0.5
        clock["total"] += 100
        clock["busy"] += 100 if busy else 0
    assert watch.share() == pytest.approx(0.0)
    for _ in range(2):                                           # busy again for a second
        watch._sample()
        now["t"] += 0.5
        clock["total"] += 100
        clock["busy"] += 100
    assert watch.share() > contention.BUSY_SHARE
