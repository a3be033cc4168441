"""Issue 25 item 4, "A queue that cannot die": runs pressed at once while Stop is called in a loop through
every route Gradio offers are all answered, the queue keeps serving (a run afterwards gives greedy's tokens)
and ``GET /healthz`` says so; and if the queue's loop dies anyway, the app restarts it by itself.

The trigger (web/queue_guard.py has it with Gradio's lines): Gradio keeps each session's messages in an
``LRUCache(2000)`` that evicts the oldest session even while it waits or runs; every ``/call/stop`` is a new
session, so after 2000 of them the waiting clients' sessions are gone and ``Queue.send_message`` raises
``KeyError`` in the queue's own loops: the queue stops (every call answered ``503 Queue is stopped.``) or a
run is dropped without an answer. The test shrinks that bound to SESSIONS so a few hundred Stop calls do
what 2000 did; the eviction is Gradio's own code either way.

The runs are the tiny preset's (tests/tiny_preset.py), held a few steps in (``holding.hold_runs``) until the Stop
loops have pushed every waiting session out twice over: the load meets runs that are sure to be waiting, on any
machine, without a real model's forwards.
"""

from __future__ import annotations

import json
import threading
import time
import types
import urllib.error
import urllib.request

import pytest
from gradio_client import Client

from web import queue_guard
from web.page_client import page_run, page_submit

import app
from conftest import launch_local
from holding import hold_runs, wait_for
from stop_traffic import post, stop_loop, stop_routes

CLIENTS, TOKENS = 8, 6
SESSIONS = 40          # Gradio's bound is 2000; shrunk so the Stop loop pushes sessions out within seconds
STOP_CALLS = 100       # calls per Stop loop (enough to push every waiting session out twice over)


def _run(model: str, prompt: str, max_new: int, seed: int) -> dict:
    """A greedy run by name (page_run's keyword arguments)."""
    return dict(model=model, strategies=["greedy"], prompt=prompt, max_new_tokens=max_new, seed=seed)


def _doc(out) -> dict:
    return out.document()


def _health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.startswith(b"{") else {"body": body.decode(errors="replace")}


@pytest.fixture(scope="module")
def served():
    demo = app.build_demo()
    url = launch_local(demo)
    demo._queue.pending_messages_per_session.max_size = SESSIONS
    yield demo, url
    demo.close()


@pytest.fixture
def expected(tiny_model):
    """Greedy's tokens for a prompt on the tiny preset, computed without the server."""
    from decoding.harness.runner import encode_prompt
    from decoding.params import GreedyParams
    from decoding.runtime.models import load_model
    from decoding.runtime.pair import ModelPair
    from decoding.strategies.baselines import greedy
    lm = load_model(tiny_model)

    def tokens(prompt: str, max_new: int) -> list[int]:
        ids = encode_prompt(lm.tokenizer, prompt, chat=True)
        return greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=max_new).token_ids
    return tokens


def test_sessions_with_waiting_events_are_never_evicted():
    class Ev:
        def __init__(self, session):
            self.session_hash = session

    class FakeQueue:
        event_ids_to_events = {"e1": Ev("old-waiting")}
        active_jobs = [[Ev("old-running")], None]

    messages = queue_guard.SessionMessages(3, queue=FakeQueue())
    for key in ("old-waiting", "old-running", "idle-1", "idle-2", "new"):
        messages[key] = object()
    assert list(messages) == ["old-waiting", "old-running", "new"]      # the idle ones went, oldest first
    assert messages.evicted == 2 and messages.spared == 4
    FakeQueue.event_ids_to_events, FakeQueue.active_jobs = {}, [None]     # all idle: plain LRU again
    messages["newer"] = object()
    assert list(messages) == ["old-running", "new", "newer"]


def _idle_queue(pending: dict = None):
    """A queue with nothing waiting or running; ``pending``: Gradio's undelivered event ids per session."""
    return types.SimpleNamespace(event_ids_to_events={}, active_jobs=[None],
                                 pending_event_ids_session=dict(pending or {}))


def test_a_finished_runs_unread_answer_keeps_its_session_for_the_grace():
    """A run that has finished but whose answer its stream has not read yet (Gradio keeps its event id in
    ``pending_event_ids_session`` until then) is spared for the grace; past it, or once read, it is idle."""
    queue = _idle_queue({"answered": {"e1"}, "dropped": {"e2"}, "read": set()})
    messages = queue_guard.SessionMessages(3, queue=queue, grace_s=30.0)
    for key in ("answered", "dropped", "read"):
        messages[key] = object()
    now = time.monotonic()
    messages.mark_answered("answered", now)          # sent a moment ago, not read
    messages.mark_answered("dropped", now - 31.0)    # a caller that never reads: past the grace
    messages.mark_answered("read", now)              # read: Gradio removed its id
    messages.mark_answered("never-held", now)        # not a session here: ignored
    assert "never-held" not in messages.answered
    messages["new-1"] = object()
    assert list(messages) == ["answered", "read", "new-1"]              # past the grace: the oldest idle one
    messages["new-2"] = object()
    assert list(messages) == ["answered", "new-1", "new-2"]             # read: idle too
    assert "dropped" not in queue.pending_event_ids_session          # its unreadable ids went with it
    assert "dropped" not in messages.answered
    del messages["answered"]                                           # Gradio's own delete forgets it too
    assert "answered" not in messages.answered


def test_the_grace_holds_at_most_the_bound_again():
    """A storm of calls whose answers nobody reads cannot grow the sessions past twice the bound."""
    queue = _idle_queue()
    messages = queue_guard.SessionMessages(4, queue=queue, grace_s=30.0)
    for i in range(40):
        key = f"call-{i}"
        messages[key] = object()
        queue.pending_event_ids_session[key] = {f"e{i}"}
        messages.mark_answered(key)
        assert len(messages) <= 8
    assert len(messages) == 8 and list(messages)[0] == "call-32"      # the oldest unread ones went
    assert len(queue.pending_event_ids_session) == 8


def test_a_session_with_an_open_stream_is_kept_and_the_cap_drops_the_oldest_answers_first():
    """A session whose messages are being read (an open stream, counted by the Health middleware) is never
    evicted; past twice the bound, the unread sessions answered longest ago go first, whatever their age."""
    queue = _idle_queue()
    messages = queue_guard.SessionMessages(2, queue=queue, grace_s=30.0)
    now = time.monotonic()
    messages["client"] = object()                   # the oldest session, answered last, its stream not open yet
    queue.pending_event_ids_session["client"] = {"run"}
    messages.mark_answered("client", now)
    messages["reader"] = object()                   # idle, but a stream reads it
    messages.listen("reader", +1)
    for i in range(6):
        key = f"call-{i}"
        messages[key] = object()
        queue.pending_event_ids_session[key] = {key}
        messages.mark_answered(key, now - 10 + i)
    messages["one-more"] = object()
    assert len(messages) <= 4 and "reader" in messages and "client" in messages
    assert "call-0" not in messages                 # answered longest ago
    messages.listen("reader", -1)
    assert "reader" not in messages.listening
    messages["and-another"] = object()
    assert "reader" not in messages                 # closed and idle: the first to go


@pytest.mark.parametrize("path, query, want", [
    ("/gradio_api/queue/data", b"session_hash=abc%2Dd", "abc-d"),
    ("/gradio_api/queue/data", b"x=1", None),
    ("/gradio_api/call/stop/ev1", b"", "held-by"),       # the session that holds the event, as Gradio finds it
    ("/gradio_api/call/stop/ev9", b"", "ev9"),           # a call without a session: its event id
    ("/gradio_api/info", b"", None),
])
def test_the_health_middleware_names_the_session_a_stream_reads(path, query, want):
    class FakeQueue:
        pending_event_ids_session = {"held-by": {"ev1"}}
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query}
    assert queue_guard.stream_session(scope, FakeQueue()) == want
    assert queue_guard.stream_session({**scope, "method": "POST"}, FakeQueue()) is None


def _new_sessions(counts: dict) -> int:
    return sum(v for k, v in list(counts.items()) if k.startswith("call") and k.endswith("200"))


def test_runs_are_answered_while_stop_is_called_in_a_loop(served, expected, tiny_model, monkeypatch):
    demo, url = served
    release = threading.Event()
    hold_runs(monkeypatch, release)
    prompts = [f"Name fruit number {i}." for i in range(CLIENTS)]
    # the clients are kept: a collected Client stops its heartbeat, and Gradio then cancels its run (as it should
    # for a closed tab), which a busy machine's garbage collector turned into a flaky CancelledError here
    clients = [Client(url, verbose=False) for _ in prompts]
    jobs = [page_submit(c, **_run(tiny_model, p, TOKENS, i))
            for i, (c, p) in enumerate(zip(clients, prompts))]
    # a client that gives up on its run (gradio_client's job.cancel()) is part of the traffic
    quitter_client = Client(url, verbose=False)
    quitter = page_submit(quitter_client, **_run(tiny_model, "Count to five.", 64, 0))
    counts: dict[str, int] = {}
    done = threading.Event()
    t0 = time.perf_counter()
    stoppers = [threading.Thread(target=loop, args=(url, done, counts, STOP_CALLS), daemon=True)
                for loop in (stop_loop, stop_loop, stop_routes)]
    for stopper in stoppers:
        stopper.start()
    time.sleep(0.5)
    quitter.cancel()
    try:           # the runs stay held until the loops have pushed every waiting session out twice over
        wait_for(lambda: _new_sessions(counts) > 2 * SESSIONS or not any(s.is_alive() for s in stoppers),
                 timeout=120)
        held = sum(not j.done() for j in jobs)
    finally:
        release.set()
    deadline = time.time() + 150
    while time.time() < deadline and not all(j.done() for j in jobs) and not demo._queue.stopped:
        time.sleep(0.2)
    answered = time.perf_counter() - t0
    done.set()
    for stopper in stoppers:
        stopper.join(timeout=60)
    new_sessions = _new_sessions(counts)
    finished = sum(j.done() and j.exception() is None for j in jobs)
    print(f"\n[queue] {CLIENTS} runs with Stop in a loop ({counts}): {finished}/{CLIENTS} answered in "
          f"{answered:.1f} s; {new_sessions} new sessions against a bound of {SESSIONS}; "
          f"{held} runs still held when the loops had done that; queue stopped: {demo._queue.stopped}")
    assert not demo._queue.stopped             # Gradio's own state: 503 "Queue is stopped." to every call
    assert finished == CLIENTS, [j.exception() if j.done() else "no answer" for j in jobs]
    assert new_sessions > 2 * SESSIONS          # the load did push sessions out
    assert held == CLIENTS                     # ... while every run was still waiting for its answer
    for prompt, job in zip(prompts, jobs):
        doc = _doc(job.result())
        assert doc["prompt"] == prompt and doc["results"][0]["token_ids"] == expected(prompt, TOKENS)
    # the queue goes on serving: a run afterwards gives greedy's tokens
    out = page_run(Client(url, verbose=False), **_run(tiny_model, "Name a planet.", 4, 1))
    assert _doc(out)["results"][0]["token_ids"] == expected("Name a planet.", 4)
    status, health = _health(url)
    assert status == 200 and health["ok"], health
    queue = health["queue"]
    assert queue["state"] == "running" and set(queue["loops"].values()) == {"running"}
    assert queue["sessions_spared"] > 0 and queue["restarts"] == 0       # the guard kept a waiting client's session


def test_a_stopped_queue_is_restarted_and_its_running_job_answered(served, monkeypatch, tiny_model):
    demo, url = served
    queue = demo._queue
    monkeypatch.setattr(queue_guard, "WATCH_S", 2.0)        # long enough to see the 503 before the restart
    release = threading.Event()                            # the run is held until the queue has come back
    hold_runs(monkeypatch, release)
    try:
        _kill_and_recover(demo, url, tiny_model, release)
    finally:
        release.set()


def _kill_and_recover(demo, url: str, model: str, release: threading.Event) -> None:
    queue = demo._queue
    time.sleep(1.2)                                        # the watchdog's current sleep (1 s) ends first
    client = Client(url, verbose=False)                    # kept: a collected client's run is cancelled
    job = page_submit(client, **_run(model, "Write a long story about a fox.", 256, 0))
    while not queue.get_active_worker_count():
        time.sleep(0.1)
    restarts = queue.guard_restarts

    def boom():                                            # an unforeseen failure in Gradio's processing loop
        del queue.get_events
        raise RuntimeError("injected")
    queue.get_events = boom
    post(url, "gradio_api/call/stop", {"data": []})        # something to dispatch: the loop calls get_events
    statuses = []
    t0 = time.time()
    while time.time() - t0 < 10:
        status, health = _health(url)
        statuses.append(status)
        if status == 200 and queue.guard_restarts > restarts:
            break
        time.sleep(0.1)
    recovered = time.time() - t0
    assert 503 in statuses and statuses[-1] == 200, statuses
    assert health["queue"]["restarts"] == restarts + 1
    assert {"processing": "RuntimeError('injected')"}.items() <= {f["loop"]: f["error"] for f in
                                                                  health["queue"]["failures"]}.items()
    # the run the dying loop cancelled is answered with an error rather than left waiting
    with pytest.raises(Exception) as failed:
        job.result(timeout=30)
    assert not isinstance(failed.value, TimeoutError)
    release.set()                                          # the cancelled run's thread ends; the next run is not held
    out = page_run(Client(url, verbose=False), **_run(model, "Name a planet.", 2, 1))
    assert _doc(out)["results"][0]["token_ids"]
    print(f"\n[queue] processing loop killed: /healthz said 503 then 200 after {recovered:.1f} s "
          f"({statuses.count(503)} probes refused); the running job was answered with an error")
