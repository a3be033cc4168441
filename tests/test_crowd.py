"""Serving a crowd (issue 25): the line in front of the compute slot, shared computations, recorded runs.

The pieces of web/crowd.py are tested alone with work functions the test controls; then through the app:
identical requests computed once, a recording replayed, the page's default example recorded in the
background and replayed, a visitor's Stop on a shared run, a full line.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from gradio_client import Client

from web import compute, handlers
from web.app_object import PlaygroundApp
from web.crowd import Board, Computation, Estimator, Line, QueueFull, request_key
from web.recordings import Recording, Recordings
from decoding.runtime.models import default_target
from web.page_client import page_run, page_submit
from web.requests import default_request, run_request, ui_default
from web.settings import DEFAULT_STRATEGIES
from web.validation import GENERATION_FIELDS, param_fields

from holding import hold_runs, wait_for

BUNDLED = "smollm2-135m-instruct"


def gate_work(gate: threading.Event, log: list, name: str):
    """A work function that records when it starts and runs until ``gate`` opens (or it is stopped)."""
    def work(comp: Computation) -> str:
        log.append(name)
        while not gate.wait(0.01):
            if comp.stop.is_set():
                return f"{name} stopped"
        return f"{name} done"
    return work


# --------------------------------------------------------------------------- the line
def test_the_line_serves_first_come_first_and_tells_each_its_place():
    line, gate, log = Line(slots=1, capacity=8, estimator=Estimator(per_unit_s=1.0, start_s=0.0)), threading.Event(), []
    comps = [Computation(f"k{i}", gate_work(gate, log, f"c{i}"), units=10) for i in range(4)]
    for c in comps:
        c.subscribe()
        line.submit(c)
    wait_for(lambda: comps[0].state == "running")
    assert line.place(comps[0]) is None                              # running: not in line
    places = [line.place(c) for c in comps[1:]]
    assert [p[0] for p in places] == [1, 2, 3] and all(p[1] == 3 for p in places)
    etas = [p[2] for p in places]
    assert etas == sorted(etas) and etas[2] - etas[1] == pytest.approx(10.0, abs=0.1)   # one computation of 10 units apart
    gate.set()
    for c in comps:
        assert c.done.wait(5) and c.state == "finished"
    assert log == ["c0", "c1", "c2", "c3"] and comps[3].result == "c3 done"


def test_a_full_line_refuses_visitors_but_not_background_work():
    line, gate = Line(slots=1, capacity=2), threading.Event()
    running = Computation("a", gate_work(gate, [], "a"))
    line.submit(running)
    wait_for(lambda: running.state == "running")
    for key in ("b", "c"):
        line.submit(Computation(key, gate_work(gate, [], key)))
    with pytest.raises(QueueFull, match="queue full: 2 runs are waiting"):
        line.submit(Computation("d", gate_work(gate, [], "d")))
    line.submit(Computation("e", gate_work(gate, [], "e"), background=True))   # background work has no cap here
    gate.set()


def test_a_stop_while_waiting_takes_the_computation_out_of_line_unrun():
    line, gate, log = Line(slots=1, capacity=4), threading.Event(), []
    first, second = Computation("a", gate_work(gate, log, "a")), Computation("b", gate_work(gate, log, "b"))
    for c in (first, second):
        c.subscribe()
        line.submit(c)
    wait_for(lambda: first.state == "running")
    assert second.leave() == 0 and second.stop.is_set()             # its last watcher left: it stops
    assert second.done.wait(5) and second.state == "cancelled"
    assert line.counts()["waiting"] == 0
    gate.set()
    assert first.done.wait(5) and log == ["a"]


def test_background_work_waits_for_visitors_and_gives_its_slot_up():
    line, gate, log = Line(slots=1, capacity=4), threading.Event(), []
    background = Computation("bg", gate_work(gate, log, "bg"), background=True)
    line.submit(background)
    wait_for(lambda: background.state == "running")
    assert line.idle()
    visitor = Computation("v", gate_work(gate, log, "v"))
    line.submit(visitor)                                             # the visitor stops the background run
    assert background.done.wait(5) and background.result == "bg stopped"
    wait_for(lambda: visitor.state == "running")
    assert not line.idle()
    later = Computation("bg2", gate_work(gate, log, "bg2"), background=True)
    line.submit(later)                                               # waits while a visitor's runs
    time.sleep(0.3)
    assert later.state == "waiting"
    gate.set()
    assert later.done.wait(5) and log == ["bg", "v", "bg2"]


def _holder(line: Line, log: list, sections: int, first_held: threading.Event) -> threading.Thread:
    """A thread that holds the line ``sections`` times back to back (as the start times its versions)."""
    def hold() -> None:
        for i in range(sections):
            with line.exclusive():
                log.append(f"held {i}")
                first_held.set()
                time.sleep(0.1)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


def test_a_visitor_waiting_through_one_exclusive_hold_runs_before_the_next():
    """The start holds the line once per timing, one after the other: a visitor who came during one runs before
    the next (it used to wait through all of them: 192 s for a first run on a busy machine)."""
    line, log, first_held = Line(slots=1, capacity=4), [], threading.Event()
    holder = _holder(line, log, 4, first_held)
    assert first_held.wait(5)
    visitor = Computation("v", lambda comp: log.append("visitor"))
    line.submit(visitor)
    assert visitor.done.wait(10) and visitor.state == "finished"
    holder.join(10)
    assert log == ["held 0", "visitor", "held 1", "held 2", "held 3"]


def test_a_visitor_coming_after_an_exclusive_call_waits_for_it_and_background_work_for_every_one():
    line, gate, log = Line(slots=1, capacity=4), threading.Event(), []
    running = Computation("a", gate_work(gate, log, "a"))
    line.submit(running)
    wait_for(lambda: running.state == "running")
    holder = _holder(line, log, 1, threading.Event())
    wait_for(lambda: line._tickets)                                  # the hold waits for the running computation
    later = Computation("b", lambda comp: log.append("b"))
    background = Computation("bg", lambda comp: log.append("bg"), background=True)
    line.submit(background)
    line.submit(later)
    gate.set()
    assert later.done.wait(10) and background.done.wait(10)
    holder.join(10)
    assert log == ["a", "held 0", "b", "bg"]


def test_a_visitor_joining_background_work_keeps_it_from_being_stopped():
    comp = Computation("k", lambda c: None, background=True)
    comp.subscribe()                     # the recorder
    assert comp.background
    comp.subscribe()                     # a visitor asks for the same run
    assert not comp.background


def test_the_estimate_learns_from_finished_computations():
    est = Estimator(per_unit_s=1.0, start_s=0.0, weight=0.5)
    est.learn(units=100, seconds=10.0)                               # 0.1 s a unit measured
    assert est.expect(100) == pytest.approx(55.0)                    # halfway from 100 s towards 10 s
    est.learn(units=100, seconds=10.0)
    assert est.expect(100) < 55.0


# --------------------------------------------------------------------------- the board
def test_identical_requests_share_one_computation_and_the_last_to_leave_stops_it():
    line, board, gate, log = Line(slots=1), Board(), threading.Event(), []
    made = []

    def make() -> Computation:
        made.append(Computation("same", gate_work(gate, log, "run")))
        return made[-1]
    (a, started_a), (b, started_b) = board.join("same", make, line), board.join("same", make, line)
    assert a is b and started_a and not started_b and len(made) == 1 and a.joined == 2
    wait_for(lambda: a.state == "running")
    assert a.leave() == 1 and not a.stop.is_set()                   # one watcher left: it goes on
    assert b.leave() == 0 and a.stop.is_set()                       # the last one: it stops
    assert a.done.wait(5) and a.result == "run stopped"
    c, started_c = board.join("same", make, line)                   # a stopped one is not joined again
    assert started_c and c is not a
    gate.set()
    assert c.done.wait(5)
    wait_for(lambda: len(board) == 0)


# --------------------------------------------------------------------------- recordings
def _recording(key: str, size: int) -> Recording:
    return Recording(key, {"results": []}, "x" * size, "Ran 1 strategies.", 1.7e9, "a CPU")


def test_recordings_are_bounded_least_recently_used_first():
    recs = Recordings(max_bytes=6 * 250)
    for key in ("a", "b", "c"):
        recs.put(_recording(key, 100))
    assert len(recs) == 2 and recs.get("a") is None and recs.held_bytes <= recs.max_bytes
    recs.get("b")                                                    # b used: c goes first
    recs.put(_recording("d", 100))
    assert recs.get("c") is None and recs.get("b") is not None
    recs.put(_recording("huge", 10_000))                             # larger than the budget: not held
    assert recs.get("huge") is None and recs.held_bytes <= recs.max_bytes


def test_recordings_outlive_a_restart_on_disk(tmp_path):
    first = Recordings(max_bytes=2**20, directory=str(tmp_path), max_files=2)
    for key in ("a", "b", "c"):
        first.put(Recording(key, {"results": [1]}, json.dumps({"results": [1]}), f"msg {key}", 1.7e9, "cpu"))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["b.json", "c.json"]   # at most max_files
    again = Recordings(max_bytes=2**20, directory=str(tmp_path))
    rec = again.get("c")
    assert rec is not None and rec.doc == {"results": [1]} and rec.message == "msg c" and rec.device == "cpu"
    (tmp_path / "b.json").write_text("not json")
    assert again.get("b") is None and again.get("zzz") is None


def test_request_keys_are_the_same_exactly_when_the_run_would_be():
    fields = param_fields()
    base = dict(model=BUNDLED, assistant="none", strategies=["greedy", "prompt_lookup"], prompt="Hi.", chat=True,
                max_new_tokens=8, seed=0, generation=[None] * len(GENERATION_FIELDS))
    key = run_request(**base, params={}).key
    # what the page sends: every field, numbers as floats, the defaults spelled out
    page = {(s, f): (float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
            for (s, f) in fields for v in [ui_default(s, f)]}
    assert run_request(**{**base, "max_new_tokens": 8.0}, params=page).key == key
    for change in ({"seed": 1}, {"prompt": "Hi!"}, {"chat": False}, {"max_new_tokens": 9},
                   {"strategies": ["prompt_lookup", "greedy"]},
                   {"generation": [1.2] + [None] * (len(GENERATION_FIELDS) - 1)}):
        assert run_request(**{**base, **change}, params={}).key != key, change
    assert run_request(**base, params={("prompt_lookup", "ngram_size"): 2}).key != key
    # an assistant no chosen strategy drafts with does not change the run
    assert run_request(**{**base, "assistant": "prophet"}, params={}).key == key
    assert request_key({"a": 1, "b": 2}) == request_key({"b": 2, "a": 1})


def test_a_run_that_drafts_from_the_visitors_history_is_private():
    base = dict(model=BUNDLED, assistant="none", strategies=["suffix"], prompt="Hi.", chat=True, max_new_tokens=8,
                seed=0, params={}, generation=[None] * len(GENERATION_FIELDS))
    assert not run_request(**base, history=[]).private
    assert run_request(**base, history=[[1, 2, 3]]).private
    unused = {**base, "params": {("suffix", "history"): False}}
    assert not run_request(**unused, history=[[1, 2, 3]]).private
    assert run_request(**base, history=[[1, 2, 3]]).key != run_request(**base, history=[[1, 2, 4]]).key
    assert run_request(**unused, history=[[1, 2, 3]]).key == run_request(**unused, history=None).key


def test_zero_gpu_durations_follow_the_request():
    short = run_request(BUNDLED, "none", ["greedy"], "Hi.", True, 8, 0, {}, [None] * len(GENERATION_FIELDS))
    long = run_request(BUNDLED, "none", ["greedy", "jacobi"], "Hi.", True, 256, 0, {},
                       [None] * len(GENERATION_FIELDS))
    state = PlaygroundApp()
    assert (compute.budget_seconds(state, short.units) < compute.budget_seconds(state, long.units)
            <= state.limits.time_limit_s)


def test_the_recorder_yields_to_a_visitor_and_records_again_later(monkeypatch):
    """A visitor arriving while an example is recorded stops that recording; it is recorded once idle."""
    gate, calls = threading.Event(), []

    def fake(stop, req, budget_s=0):                     # a run that lasts until the gate opens (or a Stop)
        calls.append(req.inputs.prompt)
        while not gate.wait(0.01) and not stop.is_set():
            pass
        result = {"strategy": "greedy", "token_ids": [1], "error": None,
                  "stop_reason": "cancelled" if stop.is_set() else "max_new_tokens"}
        yield "done", {"environment": {"cpu": "test CPU", "threads": 2}, "results": [result]}, "Ran 1.", []
    monkeypatch.setattr(compute, "compute_run", fake)
    state = PlaygroundApp(recordings=Recordings(2**20))
    recorder = threading.Thread(target=lambda: calls.append(compute.record_examples(state, ["Example."], idle_s=0.05)))
    recorder.start()
    wait_for(lambda: calls == ["Example."])
    visitor, _ = compute.submit_run(state, run_request(BUNDLED, "none", ["greedy"], "Mine.", True, 4, 0, {},
                                                 [None] * len(GENERATION_FIELDS)))
    wait_for(lambda: visitor.state == "running")         # the recording gave its slot up
    assert state.recordings.get(default_request("Example.").key) is None
    gate.set()
    recorder.join(10)
    assert calls[:3] == ["Example.", "Mine.", "Example."] and calls[3] == 1      # recorded on the second try
    assert state.recordings.get(default_request("Example.").key).message == "Ran 1."
    visitor.leave()


def test_a_recording_is_drawn_once_for_every_replay(monkeypatch):
    """A run's views are drawn in its computation and kept with its recording; replays of a recording read from
    disk (no views yet) that arrive together draw it once, not once each (16 at once took 10 s on 2 cores)."""
    drawn = []
    real = compute.draw_views

    def counting(doc):
        drawn.append(1)
        time.sleep(0.05)                    # long enough for the replays below to overlap
        return real(doc)
    monkeypatch.setattr(compute, "draw_views", counting)      # where a run draws them
    monkeypatch.setattr(handlers, "draw_views", counting)     # where a replay read from disk draws them
    state = PlaygroundApp(recordings=Recordings(2**20))
    doc = {"environment": {"cpu": "test CPU", "threads": 2},
           "results": [{"strategy": "greedy", "token_ids": [1, 2], "error": None, "stop_reason": "max_new_tokens",
                        "events": [], "wall_s": 0.1}]}
    rec = Recording("k", doc, json.dumps(doc), "Ran 1.", time.time(), "test CPU")
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(handlers._replayed(state, rec))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(drawn) == 1 and len(outs) == 8 and all(o["status"].startswith("Replay") for o in outs)

    def fake(stop, req, budget_s=0):
        yield "done", doc, "Ran 1.", []
    monkeypatch.setattr(compute, "compute_run", fake)
    req = run_request(BUNDLED, "none", ["greedy"], "Drawn once.", True, 4, 0, {}, [None] * len(GENERATION_FIELDS))
    comp, _ = compute.submit_run(state, req)
    wait_for(comp.done.is_set)
    assert len(drawn) == 2 and state.recordings.get(req.key).views is comp.result.views        # drawn with the run
    handlers._replayed(state, state.recordings.get(req.key))
    assert len(drawn) == 2                                                                      # not again
    comp.leave()


# --------------------------------------------------------------------------- through the app
def _values(strategies=("greedy",), prompt="Say hi.", max_new=8, seed=0, model=BUNDLED) -> dict:
    """A run by name, page_run's keyword arguments (/run is off the API page: the helper sends every value)."""
    return dict(model=model, strategies=list(strategies), prompt=prompt, max_new_tokens=max_new, seed=seed)


def _doc(out) -> dict:
    return out.document()


@pytest.fixture
def counted(monkeypatch):
    """How many times a run was really computed."""
    calls = []
    real = compute.compute_run

    def counting(stop, req, budget_s=0):
        calls.append(req.key)
        yield from real(stop, req, budget_s)
    monkeypatch.setattr(compute, "compute_run", counting)
    return calls


def test_identical_requests_at_once_are_computed_once_then_replayed(app_url, counted):
    values = _values(("greedy", "prompt_lookup"), prompt="Name four colours of the rainbow.", max_new=16, seed=7)
    clients = [Client(app_url, verbose=False) for _ in range(4)]
    jobs = [page_submit(c, **values) for c in clients]
    outs = [j.result(timeout=300) for j in jobs]
    assert len(counted) == 1
    docs = [_doc(o) for o in outs]
    assert all(d["results"][0]["token_ids"] == docs[0]["results"][0]["token_ids"] for d in docs)
    assert all("4 visitors asked for this same run" in o.status for o in outs)
    again = page_run(Client(app_url, verbose=False), **values)
    assert len(counted) == 1                                         # replayed, not computed
    assert again.status.startswith("Replay of a recorded run") and "Ran 2 strategies" in again.status
    replayed = _doc(again)
    assert [r["token_ids"] for r in replayed["results"]] == [r["token_ids"] for r in docs[0]["results"]]
    assert [r["wall_s"] for r in replayed["results"]] == [r["wall_s"] for r in docs[0]["results"]]  # its timings
    page_run(Client(app_url, verbose=False), **_values(("greedy", "prompt_lookup"), prompt="Name four colours of "
                                                       "the rainbow.", max_new=16, seed=8))
    assert len(counted) == 2                                         # another seed is another run


def test_the_default_example_is_recorded_and_a_visitor_sees_it_replayed(app_url, app_state, counted, monkeypatch):
    from web import requests as web_requests
    prompt = "Reply with one word: yes."
    # the page's default, shortened for the test: four tokens of the four default strategies (16 cost ~2x the time
    # and caught nothing more: the claim is about which request is recorded, not how long it runs)
    monkeypatch.setattr(web_requests, "DEFAULT_MAX_NEW", 4)
    assert compute.record_examples(app_state, [prompt], idle_s=0.05) == 1 and len(counted) == 1
    assert compute.record_examples(app_state, [prompt], idle_s=0.05) == 0       # already recorded
    req = default_request(prompt)
    # exactly what the page sends when the visitor only picks the example and presses Run
    page = dict(model=default_target(), assistant="prophet", strategies=list(DEFAULT_STRATEGIES), prompt=prompt,
                max_new_tokens=4, seed=0, page_defaults=True)
    t0 = time.perf_counter()
    out = page_run(Client(app_url, verbose=False), **page)
    took = time.perf_counter() - t0
    assert len(counted) == 1 and out.status.startswith("Replay of a recorded run")
    assert [r["strategy"] for r in _doc(out)["results"]] == list(DEFAULT_STRATEGIES)
    assert app_state.recordings.get(req.key) is not None
    print(f"\n[crowd] a recorded example replayed in {took:.2f} s")


def test_a_visitor_who_stops_a_shared_run_leaves_it_to_the_others(app_url, counted, monkeypatch, tiny_model):
    """The shared run is held a few steps in until the visitor who leaves has left (``holding.hold_runs``): the second
    visitor joins a run that is sure to be going on any machine, and a leave that stopped it would cut it short
    (it once took 160 tokens to outlast them). Held so, it needs no slow model: the tiny preset's
    (tests/tiny_preset.py)."""
    left = threading.Event()
    hold_runs(monkeypatch, left)
    values = _values(("greedy",), prompt="Write a very long story about a lighthouse.", max_new=24, seed=3,
                     model=tiny_model)
    stays, leaves = Client(app_url, verbose=False), Client(app_url, verbose=False)
    kept = page_submit(stays, **values)
    wait_for(lambda: len(counted) == 1, timeout=120)
    gone = page_submit(leaves, **values)
    wait_for(lambda: len(gone.outputs()) > 0, timeout=60)
    leaves.predict(api_name="/stop")
    out = gone.result(timeout=120)
    left.set()
    assert "1 other visitor asked for this same run, so it goes on for them" in out.status
    full = kept.result(timeout=300)
    result = _doc(full)["results"][0]
    assert len(counted) == 1 and result["stop_reason"] != "cancelled" and len(result["token_ids"]) == 24


def test_a_full_line_answers_queue_full_and_keeps_serving(app_url, app_state, monkeypatch):
    """The holder's run is held a few steps in (``holding.hold_runs``) until the waiter has stopped its queued run: a
    300-token answer once ended before the waiter's Stop on a fast machine, and the queued run had started."""
    monkeypatch.setattr(app_state.line, "capacity", 1)
    release = threading.Event()
    hold_runs(monkeypatch, release)
    holder, waiter, late = (Client(app_url, verbose=False) for _ in range(3))
    long = page_submit(holder, **_values(prompt="Write a long poem about rivers.", max_new=300, seed=11))
    wait_for(lambda: app_state.line.counts()["running"] == 1, timeout=120)
    queued = page_submit(waiter, **_values(prompt="Write a long poem about hills.", max_new=300, seed=11))
    wait_for(lambda: app_state.line.counts()["waiting"] == 1, timeout=60)
    with pytest.raises(Exception, match="queue full: 1 runs are waiting"):
        page_run(late, **_values(prompt="Write a long poem about lakes.", max_new=4, seed=11))
    waiter.predict(api_name="/stop")
    release.set()
    holder.predict(api_name="/stop")
    assert queued.result(timeout=120).status == "Stopped the queued run before it started."
    assert "Ran 1 strategies" in long.result(timeout=120).status
    assert "Ran 1 strategies" in page_run(late, **_values(prompt="Name a lake.", max_new=2, seed=11)).status
