"""A crowd replaying one recorded race (issue 48 item 9): what a replay costs is what sending it costs.

A recording's replay (its views, the run's controls, its size in memory, its exported file) is built once however
many visitors press Run on it; the page's run sends it in one update; its wall-clock race is drawn once per frame
of the animation's cadence for every visitor, not once per visitor and tick; and what a replay shows is what the
live run showed.

What would break it: the replay rebuilt per visitor (a lost cache, a lock taken per visitor but the build outside
it), the trace file written per visitor or never again once its folder dropped it, a replay streamed as more than
one update, frames keyed per visitor, a last frame rounded off the race's end, or a replay that differs from the
live run (another top step, other strategies in the inspector, other views, other bytes in the download).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time

import pytest

from visualize.race import race_frame
from web import compute, handlers, playback
from web.page_names import RUN_VIEWS
from web.guards import TraceStore
from web.app_object import PlaygroundApp
from web.recordings import Recording, Recordings
from web.requests import run_request
from web.validation import GENERATION_FIELDS

BUNDLED = "smollm2-135m-instruct"


def _result(strategy: str, tokens: list[int], times: list[float], per_step: int = 1, drafts: bool = False) -> dict:
    """A finished result: token ``i`` committed at ``times[i]`` ms; with ``drafts``, one rejected draft per step
    and accepted lengths, so the inspector offers it."""
    events, stamps = [], []
    for i, (tok, t) in enumerate(zip(tokens, times)):
        step = i // per_step + 1
        events.append({"type": "ForwardPass", "step": step, "model": "target", "positions": per_step, "ms": 1.0,
                       "kind": "decode"})
        if drafts and i % per_step == 0:
            events.append({"type": "TokenVerified", "step": step, "position": i + 1, "token": tok + 100,
                           "accepted": False, "p": 0.1, "q": 0.6})
            stamps.append(t)
        events.append({"type": "TokenCommitted", "step": step, "position": i, "token": tok,
                       "source": "accepted" if drafts else "greedy", "prob": None})
        stamps += [t, t]
    stats = {"accepted_lengths": [per_step] * (len(tokens) // per_step)} if drafts else {}
    return {"strategy": strategy, "label": strategy, "params": {}, "token_ids": tokens, "pieces": [],
            "vocab": {str(t): f"w{t}" for t in tokens + [t + 100 for t in tokens]}, "events": events,
            "times_ms": stamps, "wall_s": times[-1] / 1e3, "error": None, "stats": stats,
            "stop_reason": "max_new_tokens"}


def _doc() -> dict:
    tokens = list(range(1, 25))
    return {"environment": {"cpu": "test CPU", "threads": 2},
            "results": [_result("greedy", tokens, [40.0 * (i + 1) for i in range(24)]),
                        _result("prompt_lookup", tokens, [15.0 * (i + 1) for i in range(24)], per_step=3,
                                drafts=True)]}


def _recording(doc: dict, key: str = "k") -> Recording:
    return Recording(key, doc, json.dumps(doc), "Ran 2 strategies.", time.time(), "test CPU")


@pytest.fixture
def counts(monkeypatch):
    """How often a replay's shared parts are built: its views, the pass over its events, its size, its file."""
    seen = {"draw": 0, "survey": 0, "size": 0, "write": 0}

    def counting(name, real):
        def wrapped(*args, **kwargs):
            seen[name] += 1
            time.sleep(0.02)                # long enough for visitors arriving together to overlap
            return real(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(compute, "draw_views", counting("draw", compute.draw_views))
    monkeypatch.setattr(playback, "survey", counting("survey", playback.survey))
    monkeypatch.setattr(playback, "held_bytes", counting("size", playback.held_bytes))
    return seen


def _crowd(fn, n: int = 16) -> list:
    outs: list = []
    threads = [threading.Thread(target=lambda: outs.append(fn())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


def test_sixteen_visitors_replaying_one_recording_build_it_once(counts, monkeypatch):
    state = PlaygroundApp(recordings=Recordings(2**22))
    rec = _recording(_doc())                 # as read from disk: no views yet
    real_write = state.trace_files.write
    monkeypatch.setattr(state.trace_files, "write", lambda text: (counts.__setitem__("write", counts["write"] + 1),
                                                                  real_write(text))[1])
    outs = _crowd(lambda: handlers._replayed(state, rec))
    assert counts == {"draw": 1, "survey": 1, "size": 1, "write": 1}
    keys = {o["key"] for o in outs}
    assert len(keys) == 16                                   # each visitor's own key into the store...
    for o in outs:
        doc, top = state.store.get(o["key"])
        assert doc is rec.doc and top == rec.replay.top and state.store.is_replay(o["key"])
        assert o["download"] == outs[0]["download"] and o["columns"] is outs[0]["columns"]   # ... the rest shared
    assert open(outs[0]["download"], encoding="utf-8").read() == rec.text


def test_a_replays_file_dropped_from_its_bounded_folder_is_written_again():
    state = PlaygroundApp(recordings=Recordings(2**22))
    state.trace_files.keep = 2
    rec = _recording(_doc())
    first = handlers._replayed(state, rec)["download"]
    assert handlers._replayed(state, rec)["download"] == first                  # written once, served twice
    for _ in range(2):
        state.trace_files.write("{}")                                           # two other exports push it out
    assert not os.path.exists(first)
    again = handlers._replayed(state, rec)["download"]
    assert again != first and open(again, encoding="utf-8").read() == rec.text


def test_the_replay_shows_what_the_live_run_showed(monkeypatch, tmp_path):
    """The live run's final views against its replay: from memory, and from disk after a restart (drawn again)."""
    doc = _doc()

    def fake(stop, req, budget_s=0):
        yield "done", doc, "Ran 2 strategies.", []
    monkeypatch.setattr(compute, "compute_run", fake)
    state = PlaygroundApp(recordings=Recordings(2**22, str(tmp_path)))
    req = run_request(BUNDLED, "none", ["greedy", "prompt_lookup"], "Faithful.", True, 24, 0, {},
                      [None] * len(GENERATION_FIELDS))
    comp, _ = compute.submit_run(state, req)
    assert comp.done.wait(30)
    outcome = comp.result
    live = handlers._outputs(state, outcome.doc, outcome.message, state.trace_files.write(outcome.text),
                             outcome.views)
    restarted = PlaygroundApp(recordings=Recordings(2**22, str(tmp_path)))
    for app, rec in ((state, state.recordings.get(req.key)), (restarted, restarted.recordings.get(req.key))):
        replayed = handlers._replayed(app, rec)
        assert replayed.keys() == live.keys()
        for name in live.keys() - {"key", "status", "download"}:
            assert _plain(replayed[name]) == _plain(live[name]), name
        (shown, top), (ran, live_top) = app.store.get(replayed["key"]), state.store.get(live["key"])
        assert shown["results"] == ran["results"] and top == live_top                # the same trace, top step
        assert open(replayed["download"], encoding="utf-8").read() == \
            open(live["download"], encoding="utf-8").read()
        assert replayed["inspect_strategy"]["choices"] == ["prompt_lookup"]            # not an empty inspector
    comp.leave()


def _plain(value):
    """A view as it is sent: a figure's serialized data, an update's fields."""
    return value.model_dump() if hasattr(value, "model_dump") else value


def test_the_page_gets_a_replay_in_one_update_with_every_view(monkeypatch):
    state = PlaygroundApp(recordings=Recordings(2**22))
    values = dict(model=BUNDLED, assistant="none", strategies=["greedy", "prompt_lookup"], prompt="One update.",
                  chat=True, max_new_tokens=24, seed=0, params={})
    req = run_request(*values.values(), [None] * len(GENERATION_FIELDS))
    state.recordings.put(_recording(_doc(), key=req.key))
    monkeypatch.setattr(compute, "compute_run", lambda *a, **k: pytest.fail("a recorded run was computed"))

    async def updates() -> list:
        return [u async for u in handlers.run_playground(state, **values)]
    got = asyncio.run(updates())
    assert len(got) == 1 and got[0]["status"].startswith("Replay of a recorded run")
    assert set(RUN_VIEWS) <= set(got[0])


def _ticks(state: PlaygroundApp, key: str, walls: list[float], speed: float = 1.0) -> list[dict]:
    return [playback.race_tick(state, key, {"wall": time.monotonic() - w, "from": 0.0}, speed) for w in walls]


def test_a_crowds_race_ticks_share_one_frame_per_tick_and_end_on_the_race(monkeypatch):
    drawn: list = []
    monkeypatch.setattr(playback, "race_frame", lambda results, at: (drawn.append(at), race_frame(results, at))[1])
    state = PlaygroundApp(recordings=Recordings(2**22))
    rec = _recording(_doc())
    keys = [handlers._replayed(state, rec)["key"] for _ in range(16)]
    total = playback.race_length_ms(rec.doc["results"])                          # 960 ms: greedy's 24 tokens
    # 16 visitors, each ticking at 0.31 s and 0.33 s of their replay (their anchors apart): one frame, at 0.3 s
    frames = [f for k in keys for f in _ticks(state, k, [0.31, 0.33])]
    assert drawn == [pytest.approx(300.0)]
    assert all(f["columns"] is frames[0]["columns"] for f in frames)
    assert frames[0]["columns"] == race_frame(rec.doc["results"], 300.0)        # the race as it stood at 0.3 s
    # at the end: the race's last frame, exactly the race at its end, once for all
    ends = [f for k in keys for f in _ticks(state, k, [5.0])]
    assert drawn[1:] == [total] and all(f["race_ticker"].active is False for f in ends)
    assert ends[0]["columns"] == race_frame(rec.doc["results"], total)
    assert f"data-ms='{total:.0f}'" in ends[0]["clock_readout"]
    # a speed of 4x: the cadence is 0.4 s of race time a tick
    _ticks(state, keys[0], [0.22], speed=4.0)
    assert drawn[2:] == [pytest.approx(800.0)]


def test_a_live_runs_ticks_are_drawn_for_their_visitor_alone(monkeypatch):
    """A run that is not a replay has no shared frames: its ticks draw the frame at the visitor's own time."""
    state = PlaygroundApp(recordings=Recordings(2**22))
    doc = _doc()
    key = handlers._outputs(state, doc, "Ran.", None, {})["key"]
    first = playback.race_tick(state, key, {"wall": time.monotonic() - 0.31, "from": 0.0}, 1.0)
    assert first["columns"] == race_frame(doc["results"], 300.0)                 # on the cadence all the same
    assert state.store.frame(key, 300.0, lambda: "drawn") == "drawn"             # ... but never kept


def test_a_replays_frames_are_bounded_in_memory():
    store = TraceStore(2**22, frame_bytes=4096)
    key = store.put(_doc(), 1, replay=True, shared="r1")
    for at in range(200):
        store.frame(key, float(at), lambda: "x" * 500)
    assert store._frames.held_bytes <= 4096 and len(store._frames) < 200


def test_the_presets_are_read_once_and_again_when_their_file_changes(tmp_path, monkeypatch):
    """Every request's check reads the presets (twice); parsing their YAML each time was most of a replay's own
    cost. They are read again when the file changes."""
    from decoding.runtime import models
    reads = []
    real = models.yaml.safe_load
    monkeypatch.setattr(models.yaml, "safe_load", lambda fh: (reads.append(1), real(fh))[1])
    first = models.load_presets()
    for _ in range(5):
        assert models.load_presets() == first
    assert len(reads) <= 1
    mine = tmp_path / "models.yaml"
    mine.write_text("models:\n  tiny:\n    hub_id: a/b\n", encoding="utf-8")
    assert set(models.load_presets(mine)) == {"tiny"}
    mine.write_text("models:\n  tiny:\n    hub_id: a/b\n  other:\n    hub_id: c/d\n", encoding="utf-8")
    assert set(models.load_presets(mine)) == {"tiny", "other"}                  # changed: read again
    models.load_presets(mine).pop("tiny")
    assert "tiny" in models.load_presets(mine)                                 # a caller's change stays its own


def test_a_call_that_names_no_session_is_admitted_without_a_throwaway_session_state(monkeypatch):
    """A plain HTTP client of ``/call/<api>`` names no session; Gradio 6.31 ran the queue validator for it with a
    full ``SessionState`` built for that call alone (every block's config: ~40 % of a crowd's replay). The queue
    guard names the session first: the validator's state is the lean one, and the call is answered as before."""
    import urllib.request

    import gradio as gr
    from gradio import route_utils
    from gradio.state_holder import SessionState

    from conftest import launch_local
    from web import gradio_overrides
    # what the override rests on: Gradio builds a throwaway state for a call without a session
    assert "SessionState(app.get_blocks())" in inspect.getsource(route_utils.restore_session_state)
    built = []
    real_init = SessionState.__init__
    monkeypatch.setattr(SessionState, "__init__", lambda self, blocks: (built.append(1), real_init(self, blocks))[1])
    admitted = []
    with gradio_overrides.GuardedBlocks() as demo:
        box, out = gr.Textbox(), gr.Textbox()
        for _ in range(40):                              # a page of some size: each block's config costs
            gr.Markdown("filler")
        gr.Button().click(lambda x: x.upper(), box, out, api_name="shout",
                          validator=lambda x: (admitted.append(x), gr.validate(True, ""))[1])
    gradio_overrides.install(demo)
    url = launch_local(demo)
    try:
        answers = []
        for word in ("one", "two"):
            req = urllib.request.Request(url + "gradio_api/call/shout", data=json.dumps({"data": [word]}).encode(),
                                         headers={"Content-Type": "application/json"})
            event_id = json.load(urllib.request.urlopen(req, timeout=30))["event_id"]
            with urllib.request.urlopen(f"{url}gradio_api/call/shout/{event_id}", timeout=30) as stream:
                answers.append([line for line in stream.read().decode().splitlines() if line.startswith("data:")])
        assert admitted == ["one", "two"] and answers == [['data: ["ONE"]'], ['data: ["TWO"]']]
        assert built == []
    finally:
        demo.close()


def test_a_module_gradio_imports_around_every_event_is_searched_for_once(monkeypatch):
    """Gradio 6.31 imports matplotlib entering and leaving every event; not installed, each import searched every
    folder of sys.path (about a third of a crowd's replay). Marked missing once, it fails at once, as it did; an
    installed module is never marked."""
    import importlib.util
    import sys

    import gradio as gr
    from gradio import utils as gradio_utils

    from web import gradio_overrides
    assert "import matplotlib" in inspect.getsource(gradio_utils.MatplotlibBackendMananger.__enter__)
    assert "matplotlib" in gradio_overrides.PER_EVENT_IMPORTS
    monkeypatch.delitem(sys.modules, "dp_not_installed_module", raising=False)
    monkeypatch.delitem(sys.modules, "json", raising=False)          # installed: found again, never marked
    assert gradio_overrides.mark_missing(("dp_not_installed_module", "json")) == ["dp_not_installed_module"]
    assert sys.modules["dp_not_installed_module"] is None and sys.modules.get("json", "absent") is not None
    with pytest.raises(ImportError):
        import dp_not_installed_module  # noqa: F401
    if importlib.util.find_spec("matplotlib") is None:  # as on this app's machines: what install() marks
        monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
        with gradio_overrides.GuardedBlocks() as demo:
            gr.Textbox()
        gradio_overrides.install(demo)
        assert sys.modules["matplotlib"] is None
        with gradio_utils.MatplotlibBackendMananger():   # what every event does: no error, as before
            pass
    monkeypatch.delitem(sys.modules, "dp_not_installed_module")
