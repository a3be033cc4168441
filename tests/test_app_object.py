"""One app object owns every store (``web/app_object.PlaygroundApp``): two apps in one process share nothing.

What would break it: a store kept at module level again (every app would share it: a run in one would show up in
the other's recordings or histories, its Stop would end the other's jobs), or a handler reaching past the app it
was given. The run here is a stand-in for the compute (no model is loaded): what is checked is where its
bookkeeping lands.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import types

import pytest

import app
import web
from web import compute, handlers
from web.app_object import PlaygroundApp
from web.crowd import Board, Line
from web.recordings import Recordings
from web.export import ExportFiles
from web.guards import Histories, TraceFiles, TraceStore
from web.jobs import Jobs

BUNDLED = "smollm2-135m-instruct"
STORES = (Jobs, Line, Board, Recordings, TraceStore, TraceFiles, Histories, ExportFiles, PlaygroundApp)


def _fake_run(stop, req, budget_s=0):
    result = {"strategy": "greedy", "label": "Greedy", "token_ids": [5, 6, 7], "error": None,
              "stop_reason": "max_new_tokens", "target_forwards": 3, "wall_s": 0.03, "events": [],
              "times_ms": [10.0, 20.0, 30.0]}
    doc = {"environment": {"cpu": "test CPU", "threads": 2}, "results": [result]}
    yield "done", doc, "Ran 1 strategies.", [[5, 6, 7]]


async def _drain(agen) -> list:
    return [item async for item in agen]


def _request(session: str):
    return types.SimpleNamespace(session_hash=session, request=None)


def _footprint(state: PlaygroundApp) -> dict:
    return {"line": state.line.counts(), "estimate": state.line.estimator.expect(1.0), "board": len(state.board),
            "recordings": len(state.recordings._items), "histories": len(state.histories),
            "jobs": len(state.jobs), "store": len(state.store), "files": state.trace_files.count()}


def test_a_run_in_one_app_leaves_the_other_untouched(monkeypatch):
    monkeypatch.setattr(compute, "compute_run", _fake_run)
    one, other = PlaygroundApp(), PlaygroundApp()
    untouched = _footprint(other)
    outs = asyncio.run(_drain(handlers.run_playground(
        one, BUNDLED, "none", ["greedy"], "Two apps.", True, 3, 0, {}, request=_request("visitor"))))
    assert outs[-1]["status"].startswith("Ran 1 strategies")
    ran = _footprint(one)
    assert ran["recordings"] == 1 and ran["histories"] == 1 and ran["store"] == 1 and ran["files"] == 1
    assert ran["estimate"] != untouched["estimate"]            # the line learned how long a unit takes
    assert _footprint(other) == untouched
    assert not other.histories.items("visitor") and one.histories.items("visitor") == [[5, 6, 7]]
    # the same request in the other app is computed there, not replayed from the first app's recording
    again = asyncio.run(_drain(handlers.run_playground(
        other, BUNDLED, "none", ["greedy"], "Two apps.", True, 3, 0, {}, request=_request("visitor"))))
    assert not again[-1]["status"].startswith("Replay")
    replayed = asyncio.run(_drain(handlers.run_playground(
        one, BUNDLED, "none", ["greedy"], "Two apps.", True, 3, 0, {}, request=_request("visitor"))))
    assert replayed[-1]["status"].startswith("Replay")


def test_a_stop_in_one_app_does_not_reach_the_others_jobs():
    one, other = PlaygroundApp(), PlaygroundApp()
    ticket = other.jobs.admit("visitor")
    key, flag = other.jobs.start(ticket, "visitor")
    assert handlers.stop_run(one, _request("visitor"))[0] == "Nothing to stop."
    assert not flag.is_set()
    handlers.stop_run(other, _request("visitor"))
    assert flag.is_set()
    other.jobs.finish(key)


def test_two_pages_get_two_apps():
    first, second = app.build_demo(), app.build_demo()
    a, b = first.playground, second.playground
    for name in ("jobs", "line", "board", "recordings", "store", "trace_files", "histories", "exports"):
        assert getattr(a, name) is not getattr(b, name), name
    shared = PlaygroundApp()
    assert app.build_demo(state=shared).playground is shared


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.iter_modules(web.__path__)))
def test_no_web_module_keeps_a_store_at_module_level(name):
    module = importlib.import_module(f"web.{name}")
    held = [attr for attr, value in vars(module).items() if isinstance(value, STORES)]
    assert not held, f"web.{name} keeps {held} at module level: stores belong to an app (web/app_object.py)"
