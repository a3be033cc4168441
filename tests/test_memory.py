"""The Space stays within its memory: sessions, stores and uploads bounded by what they really hold (issue 39).

What would break it, and the test that fails:
- Gradio's per-session config copies back (a fresh session 0.41 MB: 1,600 cost 660 MB) or no session limit:
  ``test_fresh_sessions_cost_little_and_are_bounded``;
- a store that estimates its documents from their JSON size (an object-heavy trace holds 18x its JSON):
  ``test_held_bytes_agrees_with_tracemalloc`` and ``test_the_trace_store_holds_what_it_says``;
- a trace's ``environment`` unchecked (995,000 empty objects in 3 MB): ``test_an_environment_bomb_is_refused_*``;
- an import drawn beside a timed run: ``test_an_import_waits_in_the_line_behind_a_run``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import tracemalloc
import urllib.request

import pytest

from visualize.checks import MAX_ENV_NODES
from visualize.traces import import_trace
from web import compute, handlers
from web.app_object import PlaygroundApp
from web.crowd import Computation
from web.recordings import Recording, Recordings
from web.gradio_overrides import LeanStateHolder
from web.guards import TraceStore
from web.memory import held_bytes
from web.limits import DEFAULT_LIMITS


def _traced(build):
    gc.collect()
    tracemalloc.start()
    try:
        value = build()
        return value, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


SHAPES = {
    "events": lambda: json.loads(json.dumps({"results": [{"events": [
        {"type": "forward", "step": i, "token": i * 7, "ms": 1.5, "prob": 0.25} for i in range(20_000)],
        "token_ids": list(range(5000))}]})),
    "empty objects": lambda: json.loads(json.dumps({"environment": {"x": [{} for _ in range(100_000)]}})),
    "nested lists": lambda: json.loads(json.dumps([[[i, j, 0.5] for j in range(40)] for i in range(400)])),
    "strings": lambda: json.loads(json.dumps({"pieces": [f"piece{i}" * 3 for i in range(30_000)]})),
    "large object": lambda: json.loads(json.dumps({"vocab": {str(i): f"p{i}" for i in range(30_000)}})),
    "uneven trees": lambda: json.loads(json.dumps([{"tokens": list(range(i % 40)), "q": [0.5] * (i % 40)}
                                                   for i in range(5000)])),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_held_bytes_agrees_with_tracemalloc(shape):
    doc, traced = _traced(SHAPES[shape])
    assert 0.85 * traced <= held_bytes(doc) <= 1.15 * traced, (shape, held_bytes(doc), traced)


def test_the_trace_store_holds_what_it_says():
    """Filled with object-heavy documents, the store's real memory stays within its bound (a JSON-size estimate
    would let it hold 18x its bound: 2 bytes of JSON per 64-byte object)."""
    bound = 8 << 20
    store = TraceStore(bound)
    docs, traced = _traced(lambda: [store.put({"results": [], "environment": {"x": [{} for _ in range(20_000)]}}, 0)
                                    for _ in range(20)])
    assert store.held_bytes <= bound and len(store) < 20
    kept = [store.get(k)[0] for k in docs if store.get(k) is not None]
    assert held_bytes(*kept) <= bound
    assert 0.85 * held_bytes(*kept) <= traced             # what tracemalloc saw is what was kept (the rest freed)


def test_a_recording_counts_its_views_once_drawn():
    store = Recordings(1 << 30)
    doc = {"results": [{"strategy": "greedy", "token_ids": [1, 2]}]}
    rec = Recording("k", doc, json.dumps(doc), "Ran 1.", 0.0, "test CPU")
    store.put(rec)
    before = store.held_bytes
    rec.views = {"columns": "x" * 100_000}
    store.remeasure(rec)
    assert store.held_bytes >= before + 100_000


def _bomb(n: int = 995_000) -> dict:
    """The issue's upload: ~995,000 empty objects in the environment (3 MB of JSON, ~60 MB parsed), in lists
    under the parser's cap of 200,000 entries each."""
    return {"format": "decoding-playground-trace", "version": 2,
            "environment": {f"x{i}": [{} for _ in range(n // 5)] for i in range(5)}, "results": [
        {"strategy": "greedy", "token_ids": [1], "events": []}]}


def test_an_environment_bomb_is_refused_by_name():
    with pytest.raises(ValueError, match=rf"environment.x\d brings it over {MAX_ENV_NODES} values"):
        import_trace(json.dumps(_bomb()))
    with pytest.raises(ValueError, match="environment.a.b.c.d.e.f.g.h.i nests deeper than 8"):
        import_trace(json.dumps({**_bomb(1), "environment": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {
            "i": 1}}}}}}}}}}))
    ok = {**_bomb(1), "environment": {"cpu": "Intel", "target": {"kernel_choice": {"rows": [1, 2, 3]}}}}
    assert import_trace(json.dumps(ok))["environment"]["target"]["kernel_choice"]["rows"] == [1, 2, 3]


def test_environment_bomb_uploads_leave_the_store_empty(tmp_path):
    path = tmp_path / "bomb.json"
    path.write_text(json.dumps(_bomb()))
    state = PlaygroundApp()
    for _ in range(3):
        with pytest.raises(Exception, match="environment"):
            asyncio.run(handlers.import_file(state, str(path)))
    assert len(state.store) == 0 and state.store.held_bytes == 0


def test_an_import_waits_in_the_line_behind_a_run(tmp_path, monkeypatch):
    """No upload is read or drawn while a run holds the compute slot: it waits its turn in the same line."""
    gate, order = threading.Event(), []
    state = PlaygroundApp()
    run = Computation("run", lambda c: (order.append("run"), gate.wait(10), order.append("run done")))
    run.subscribe()
    state.line.submit(run)
    real = compute.imported
    monkeypatch.setattr(compute, "imported", lambda path, max_bytes: (order.append("import"), real(path, max_bytes))[1])
    doc = {"format": "decoding-playground-trace", "version": 2,
           "results": [{"strategy": "greedy", "token_ids": [5, 6], "events": []}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    out = []
    importer = threading.Thread(target=lambda: out.append(asyncio.run(handlers.import_file(state, str(path)))))
    importer.start()
    while state.line.counts()["waiting"] < 1:
        threading.Event().wait(0.01)
    assert order == ["run"]                               # the import waits while the run holds the slot
    gate.set()
    importer.join(30)
    assert order == ["run", "run done", "import"] and out[0]["status"].startswith("Imported a trace")


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_fresh_sessions_cost_little_and_are_bounded(served):
    """1,600 Stops, each from a new session id (what a crowd of one-off visitors or a script does): Gradio keeps a
    state per session; it must stay small (issue 39: 0.41 MB each before, +650 MB) and bounded in number."""
    demo, url = served
    holder = demo.server_app.state_holder
    assert type(holder) is LeanStateHolder and holder.capacity == DEFAULT_LIMITS.sessions

    def stop(session: str) -> None:
        req = urllib.request.Request(url + "gradio_api/run/stop", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"data": [], "session_hash": session}).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.load(resp)["data"][0] == "Nothing to stop."
    for i in range(100):                                  # warm: allocator pools, Gradio's lazy imports
        stop(f"warm-{i}")
    gc.collect()
    before = _rss_mb()
    for i in range(1600):
        stop(f"fresh-{i}")
    gc.collect()
    grown = _rss_mb() - before
    print(f"\n[memory] 1,600 fresh sessions: +{grown:.1f} MB of RSS")
    assert grown <= 100, grown
    assert all(not s.config_values for s in list(holder.session_data.values())[-50:])
