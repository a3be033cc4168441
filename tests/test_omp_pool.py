"""A thread's OpenMP pool given back (decoding/runtime/omp_pool.py), and the app's threads that only watch or serve
giving theirs back before the computing thread runs.

What would break it: ``release`` pausing nothing (the watching thread's pool stays beside the computing one's, and
libgomp's throttled spin makes every step of a run ~1.5x slower: measured in BENCHMARKS.md), the run thread
starting its worker before it gave its pool back, or the app's main thread serving with a pool of its own.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from decoding.runtime import omp_pool
from web import run_thread
from web.loading import Prepared


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc here")
def test_release_frees_the_calling_threads_pool_and_only_its_own():
    if not omp_pool.available():
        pytest.skip("this PyTorch does not run on libgomp with omp_pause_resource_all")
    got, go_on, holder_ready = {}, threading.Event(), threading.Event()
    threads = torch.get_num_threads()   # make test's workers run 1 each: 2 here, so each region forms a pool

    def holder():                      # a second thread that keeps its pool while the first releases its own
        torch.set_num_threads(2)
        torch.ones(1 << 21).mul_(2)
        holder_ready.set()
        go_on.wait(30)

    def releaser():
        torch.set_num_threads(2)
        torch.ones(1 << 21).mul_(2)    # a parallel region: this thread now holds a pool of workers
        got["with_pool"] = _native_threads()
        got["released"] = omp_pool.release()
        got["without_pool"] = _native_threads()
        torch.ones(1 << 21).mul_(2)    # the next region builds it again
        got["again"] = _native_threads()

    other = threading.Thread(target=holder)
    other.start()
    assert holder_ready.wait(30)
    one = threading.Thread(target=releaser)
    one.start()
    one.join(30)
    after_holder = _native_threads()
    go_on.set()
    other.join(30)
    torch.set_num_threads(threads)
    assert got["released"] is True
    assert got["without_pool"] <= got["with_pool"] - 1           # its worker(s) gone
    assert got["again"] == got["with_pool"]
    assert after_holder >= got["without_pool"] - 1                # the holder's pool was left alone (still there)


def test_release_inside_nothing_it_can_pause_is_harmless(monkeypatch):
    monkeypatch.setattr(omp_pool, "_pause", lambda: None)          # no libgomp: nothing to pause, no error
    assert omp_pool.release() is False and omp_pool.available() is False


def test_the_run_thread_gives_its_pool_back_before_its_worker_computes(monkeypatch):
    order = []
    monkeypatch.setattr(run_thread.omp_pool, "release", lambda: order.append(("release", threading.current_thread().name)))

    def fake_run(*args, **kwargs):
        order.append(("compute", threading.current_thread().name))
        return []

    monkeypatch.setattr(run_thread, "run_comparison", fake_run)
    prep = Prepared(pair=None, prompt_ids=[1, 2], max_new=2, seed=0, model="m", note="")
    steps = list(run_thread.stream_comparison(prep, [("greedy", None)], stop=threading.Event(), poll_s=0.01))
    assert steps[-1] == ("done", [])
    watcher = threading.current_thread().name
    assert order == [("release", watcher), ("compute", "decoding-run")]


def test_the_apps_main_thread_gives_its_pool_back_before_it_serves(monkeypatch):
    import app
    calls = []

    class Demo:
        def launch(self, **kwargs):
            calls.append(("launch", kwargs))

    class Start:
        def __init__(self, *args, **kwargs):
            pass

        def start(self, then=None):
            calls.append(("start",))

    monkeypatch.setattr(app, "build_demo", lambda state: Demo())
    monkeypatch.setattr(app, "Startup", Start)
    monkeypatch.setattr(app.omp_pool, "release", lambda: calls.append(("release",)))
    monkeypatch.setattr(app.PlaygroundApp, "create", classmethod(lambda cls, *a, **k: type("S", (), {})()))
    monkeypatch.setattr("sys.argv", ["app.py", "--port", "7999", "--no-compile"])
    app.main()
    assert [c[0] for c in calls] == ["start", "release", "launch"]


def test_the_example_recorder_gives_its_pool_back_before_each_run_it_waits_for(monkeypatch):
    """The start's thread goes on to record the examples: it times and probes first (a pool of its own), then waits
    while each recording computes in another thread."""
    from types import SimpleNamespace
    from web import compute
    order, recorded = [], {}
    monkeypatch.setattr(compute.omp_pool, "release", lambda: order.append("release"))

    class Comp:
        done, preempted, result = threading.Event(), False, None

        def leave(self):
            pass

    Comp.done.set()

    def submit(app, req, background=False):
        order.append("submit")
        recorded[req.key] = True
        return Comp(), True

    monkeypatch.setattr(compute, "submit_run", submit)
    monkeypatch.setattr(compute, "default_request", lambda prompt, settings: SimpleNamespace(key=prompt))
    app = SimpleNamespace(line=SimpleNamespace(idle=lambda: True), settings=None,
                          recordings=SimpleNamespace(get=recorded.get))
    assert compute.record_examples(app, ["a", "b"], idle_s=0.01) == 2
    assert order == ["release", "submit", "release", "submit"]
