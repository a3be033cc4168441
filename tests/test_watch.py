"""The one watched-computation primitive (``web/watch.watch``): submit, watch, leave, settle, and QueueFull.

Each path is driven on a real app's line with small stand-in work (no model), and after each one the line's
occupancy is counted: a computation that keeps its slot or its place after its watcher is gone would hold every
later visitor up. The last test drives every handler that computes once and fails if one of them puts work in
the line by any other way than the primitive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import types

import gradio as gr
import pytest

from web import api, batch_panel, compute, handlers
from web.crowd import Computation
from web.app_object import PlaygroundApp
from web.recordings import Recording
from web.watch import Settled, alone, watch

BUNDLED = "smollm2-135m-instruct"


def _empty(app: PlaygroundApp) -> bool:
    counts = app.line.counts()
    return counts["running"] == 0 and counts["waiting"] == 0


def _released(app: PlaygroundApp, comp: Computation, within_s: float = 10.0) -> bool:
    """The computation is done and, within ``within_s``, the line holds no slot and no place for anyone (its
    thread may end a moment after its watcher did: a closed watcher does not wait; and the line hands the freed
    slot to the next waiter, whose own run takes a moment more to end)."""
    deadline = time.monotonic() + within_s
    if not comp.done.wait(within_s):
        return False
    while not _empty(app):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def _items(app: PlaygroundApp, job, stop: threading.Event, **kw) -> list:
    async with contextlib.aclosing(watch(app, job, stop, **kw)) as updates:
        return [item async for item in updates]


def _until_stopped(comp: Computation) -> str:
    """Work that publishes a frame, then runs until it is asked to stop (a run's loop, minus the model)."""
    comp.publish({"frame": 1})
    while not comp.stop.wait(0.01):
        pass
    return "partial"


def _held(gate: threading.Event) -> Computation:
    """A computation that holds the line's one slot until ``gate`` is set."""
    return alone("blocker", lambda c: gate.wait(30))


# --------------------------------------------------------------------------- settle: a result, and the slot back
def test_a_finished_computation_settles_into_its_result_and_frees_its_slot():
    app, stop = PlaygroundApp(), threading.Event()
    comp = alone("work", lambda c: (c.publish("half"), 42)[1])
    items = asyncio.run(_items(app, comp, stop, frame=lambda c: {"status": c.live}))
    end = items[-1]
    assert isinstance(end, Settled) and end.result == 42 and not end.left and not end.cancelled
    assert all(isinstance(i, dict) for i in items[:-1])
    assert comp.subscribers == 0 and _released(app, comp)


# --------------------------------------------------------------------------- leave: Stop, and a closed page
def test_stop_leaves_a_running_computation_promptly_and_settles_what_it_made():
    """Bug caught: Stop not reaching the computation (its flag never set: the generator waits forever and the slot
    stays taken), or the watcher not leaving (the last watcher gone, yet it runs on)."""
    app, stop = PlaygroundApp(), threading.Event()
    comp = alone("run", _until_stopped)

    async def main() -> list:
        seen = []
        async with contextlib.aclosing(watch(app, comp, stop, frame=lambda c: {"status": "frame"})) as updates:
            async for item in updates:
                seen.append(item)
                if item == {"status": "frame"}:
                    stop.set()                          # the visitor pressed Stop while it ran
        return seen
    began = time.monotonic()
    items = asyncio.run(asyncio.wait_for(main(), 10))
    assert time.monotonic() - began < 5
    assert comp.stop.is_set()                           # its cancel flag: the work was told to end
    end = items[-1]
    assert isinstance(end, Settled) and end.left and not end.cancelled and end.result == "partial"
    assert _released(app, comp)


def test_closing_the_watcher_leaves_the_computation():
    """The client went away: the generator is closed mid-watch. Bug caught: leaving only on Stop, so a closed
    page's computation keeps the slot until it finishes on its own."""
    app, stop = PlaygroundApp(), threading.Event()
    comp = alone("run", _until_stopped)

    async def main() -> None:
        async with contextlib.aclosing(watch(app, comp, stop, frame=lambda c: {"status": "frame"})) as updates:
            async for item in updates:
                if item == {"status": "frame"}:
                    return                              # aclosing closes it here
    asyncio.run(asyncio.wait_for(main(), 10))
    assert comp.stop.is_set() and comp.subscribers == 0
    assert _released(app, comp) and comp.result == "partial"


def test_stop_while_waiting_takes_it_out_of_line():
    app, stop, gate = PlaygroundApp(), threading.Event(), threading.Event()
    blocker = _held(gate)
    blocker.subscribe()
    app.line.submit(blocker)
    comp = alone("sweep", lambda c: "never")

    async def main() -> list:
        seen = []
        async with contextlib.aclosing(watch(app, comp, stop)) as updates:
            async for item in updates:
                seen.append(item)
                if isinstance(item, dict) and item["status"].startswith("Waiting for the compute slot"):
                    stop.set()
        return seen
    try:
        items = asyncio.run(asyncio.wait_for(main(), 10))
        assert isinstance(items[-1], Settled) and items[-1].cancelled and items[-1].result is None
        assert comp.state == "cancelled" and app.line.counts()["waiting"] == 0
    finally:
        gate.set()
    assert _released(app, blocker)


def test_a_watcher_who_leaves_a_shared_computation_leaves_it_running_for_the_others():
    app, stop = PlaygroundApp(), threading.Event()
    comp = alone("run", _until_stopped)
    comp.subscribe()                                    # another visitor watches it too

    async def main() -> list:
        seen = []
        async with contextlib.aclosing(watch(app, comp, stop, frame=lambda c: {"status": "frame"})) as updates:
            async for item in updates:
                seen.append(item)
                stop.set()
        return seen
    items = asyncio.run(asyncio.wait_for(main(), 10))
    assert isinstance(items[-1], Settled) and items[-1].others == 1 and items[-1].result is None
    assert not comp.stop.is_set() and not comp.done.is_set()      # it goes on for the other visitor
    assert comp.leave() == 0                            # the other one leaves too: now it stops
    assert _released(app, comp)


# --------------------------------------------------------------------------- settle: errors by name
def test_a_refused_request_settles_into_the_handlers_named_error():
    """Bug caught: the computation's own exception raised as it was (Gradio would show its generic "error"), the
    prefix or the escaping lost, or a server path reaching the visitor."""
    app = PlaygroundApp()

    def bad(c):
        raise ValueError("spec: <b>window</b> must be 2 to 8, not 99 (see /srv/app/secret.py)")
    with pytest.raises(gr.Error) as page:
        asyncio.run(_items(app, alone("sweep", bad), threading.Event(), prefix="sweep: "))
    assert page.value.message == ("sweep: spec: &lt;b&gt;window&lt;/b&gt; must be 2 to 8, not 99 (see [path])")
    with pytest.raises(gr.Error) as client:
        asyncio.run(_items(app, alone("sweep", bad), threading.Event(), page=False))
    assert client.value.message == "spec: <b>window</b> must be 2 to 8, not 99 (see [path])"
    assert _empty(app)


def test_a_failure_that_is_not_the_visitors_is_raised_as_it_was():
    app = PlaygroundApp()

    def broken(c):
        raise KeyError("a bug")
    with pytest.raises(KeyError, match="a bug"):
        asyncio.run(_items(app, alone("sweep", broken), threading.Event()))
    with pytest.raises(gr.Error, match=r"trace: \[Errno 2\] No such file"):   # a handler may widen what it refuses
        asyncio.run(_items(app, alone("import", lambda c: open("/nonexistent/x.json")), threading.Event(),
                           refused=(OSError,), prefix="trace: ", page=False))
    assert _empty(app)


def test_an_export_that_fails_is_its_handlers_refusal_for_an_api_client(monkeypatch):
    app = PlaygroundApp()
    doc = {"results": [{"strategy": "greedy", "token_ids": [1], "events": []}], "environment": {}}
    rec = Recording("k", doc, json.dumps(doc), "Ran 1.", 1.7e9, "cpu")
    app.recordings.put(rec)

    def too_long(*args, **kwargs):
        raise ValueError("mode: this race is too long to draw in real time")
    monkeypatch.setattr(handlers, "render", too_long)
    with pytest.raises(gr.Error) as err:
        asyncio.run(handlers.export_race(app, rec.share, "gif", "time"))
    assert err.value.message == "mode: this race is too long to draw in real time"
    assert _empty(app)


# --------------------------------------------------------------------------- QueueFull
def test_a_full_line_is_the_refusal_message_and_nothing_is_left_in_it():
    app, gate = PlaygroundApp(), threading.Event()
    app.line.capacity = 1
    blocker, waiter = _held(gate), alone("waits", lambda c: None)
    for comp in (blocker, waiter):
        comp.subscribe()
        app.line.submit(comp)                           # one runs, one waits: the line is full
    refused = alone("sweep", lambda c: "never")
    try:
        with pytest.raises(gr.Error) as err:
            asyncio.run(_items(app, refused, threading.Event()))
        assert err.value.message == ("queue full: 1 runs are waiting for the compute slot; try again in a few "
                                     "minutes")
        assert refused.state == "waiting" and not refused.done.is_set() and app.line.counts()["waiting"] == 1
    finally:
        gate.set()
    assert _released(app, blocker) and _released(app, waiter)


# --------------------------------------------------------------------------- every handler goes through it
def _fake_run(stop, req, budget_s=0):
    result = {"strategy": "greedy", "label": "Greedy", "token_ids": [5, 6, 7], "error": None,
              "stop_reason": "max_new_tokens", "target_forwards": 3, "wall_s": 0.03, "events": [],
              "times_ms": [10.0, 20.0, 30.0]}
    doc = {"environment": {"cpu": "test CPU", "threads": 2}, "prompt": req.inputs.prompt, "chat": True,
           "prompt_ids": [1, 2], "max_new_tokens": 3, "results": [result]}
    yield "done", doc, "Ran 1.", [[5, 6, 7]]


async def _drain(agen) -> list:
    async with contextlib.aclosing(agen) as items:
        return [item async for item in items]


def _drive_every_handler(app: PlaygroundApp, tmp_path, monkeypatch) -> dict:
    """Each handler that computes, once, with stand-in work; what each returned."""
    monkeypatch.setattr(compute, "compute_run", _fake_run)
    monkeypatch.setattr(compute, "compute_sweep", lambda stop, req, budget_s=0: (
        {"strategy": req.strategy, "keys": req.keys, "points": []}, "Swept 0 settings."))
    monkeypatch.setattr(batch_panel, "batch_race", lambda *values, settings, progress: "<p>race</p>")

    def fake_render(doc, fmt, mode, note, files, key=None):
        path = files.new_path("." + fmt)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(mode)
        return files.add(key, path)
    monkeypatch.setattr(handlers, "render", fake_render)
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"format": "decoding-playground-trace", "version": 2,
                                 "results": [{"strategy": "greedy", "token_ids": [5, 6], "events": []}]}))
    doc = {"results": [{"strategy": "greedy", "token_ids": [1], "events": []}], "environment": {}}
    rec = Recording("recorded", doc, json.dumps(doc), "Ran 1.", 1.7e9, "cpu")
    app.recordings.put(rec)
    visitor = types.SimpleNamespace(session_hash="visitor", request=None)
    return {
        "run": asyncio.run(_drain(handlers.run_playground(app, BUNDLED, "none", ["greedy"], "One.", True, 3, 0, {},
                                                          request=visitor)))[-1]["status"],
        "race": asyncio.run(api.run_race(app, "Two.", ["greedy"], BUNDLED, "none", 3, 0, True, None))["results"],
        "sweep": asyncio.run(_drain(handlers.run_sweep(app, BUNDLED, "none", "Three.", True, 3, 0, "lookahead",
                                                       "window=2,3")))[-1][1],
        "import": asyncio.run(handlers.import_file(app, str(trace)))["status"],
        "export": asyncio.run(handlers.export_race(app, rec.share, "gif", "steps")),
        "batch": asyncio.run(batch_panel.shown(app, BUNDLED, "none", ["greedy"], "Four.", True, 8, 2))["value"],
    }


def test_every_handler_that_computes_goes_through_the_primitive(tmp_path, monkeypatch):
    """Bug caught: a handler (run, /race, sweep, import, export, the batch race) that submits to the line and
    follows its computation with a loop of its own (as each once did): its computation is not one the primitive
    submitted, and the test names it."""
    app = PlaygroundApp()
    in_line, watched, callers = [], [], []
    real_submit = app.line.submit
    monkeypatch.setattr(app.line, "submit", lambda comp: (in_line.append(comp), real_submit(comp))[1])

    def spy(app_, job, stop, **kw):
        callers.append(job.key.split("-")[0] if isinstance(job, Computation) else "run")

        def submitted() -> Computation:
            comp = job() if not isinstance(job, Computation) else (job.subscribe(), real_submit(job), job)[2]
            watched.append(comp)
            return comp
        return real_watch(app_, submitted, stop, **kw)
    real_watch = handlers.watch
    monkeypatch.setattr(handlers, "watch", spy)
    monkeypatch.setattr(batch_panel, "watch", spy)
    out = _drive_every_handler(app, tmp_path, monkeypatch)
    assert out["run"].startswith("Ran 1.") and out["race"][0]["token_ids"] == [5, 6, 7]
    assert out["sweep"] == "Swept 0 settings." and out["import"].startswith("Imported a trace with 1 strategies")
    assert open(out["export"], encoding="utf-8").read() == "steps" and out["batch"] == "<p>race</p>"
    assert sorted(callers) == ["batch", "export", "import", "run", "run", "sweep"]
    bypassed = [c.key for c in in_line if not any(c is w for w in watched)]
    assert not bypassed, f"submitted to the line without web/watch.watch: {bypassed}"
    assert len(watched) == 6 and all(c.done.is_set() for c in watched) and _empty(app)
