"""Large imports reach the page fast (issue 39) without checking less or drawing differently.

- The event checks compiled per type (``visualize.checks.COMPILED``) accept exactly what ``_check_event``
  accepts, with the same defaults filled in and the same number count, and leave every refusal (and its
  message) to it: checked against each other on the view-limit traces' events and on broken ones.
- The cheaper string removal of ``jsonstream._text_depth`` measures the depth the old one did.
- The token columns, built newest-first up to what is shown, are the ones built from every item.
- The figures built from plain dicts are the JSON plotly's validating setters write.
- The import handler streams: every view but the token columns first, the columns after them (drawn later),
  and its last update is the whole page; Stop between the two still leaves a replayable trace.

Speed itself is measured by ``benchmarks/bench_import.py``, never asserted here.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import json
import math
import random
import re
import threading

import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import view_limits_cases as V
from visualize import charts, checks, page, tokens
from visualize.checks import COMPILED, Invalid, _check_event, check_events
from visualize.jsonstream import _text_depth
from visualize.traces import import_trace, import_trace_file
from web import compute, handlers, playback
from web.app_object import PlaygroundApp


# --------------------------------------------------------------------------- the compiled checks
def _slow(e):
    """(number count or the refusal's message, the event afterwards) by the rule as written."""
    e = copy.deepcopy(e)
    try:
        return _check_event(e), e
    except Invalid as exc:
        return str(exc), e


def _agree(e) -> None:
    """The compiled check of ``e``'s type accepts it only as ``_check_event`` does, and otherwise changes nothing;
    ``check_events`` gives ``_check_event``'s answer either way."""
    want, after = _slow(e)
    name = e.get("type") if isinstance(e, dict) else None
    fast = COMPILED.get(name) if isinstance(name, str) else None
    if fast is not None:
        mine = copy.deepcopy(e)
        try:
            got = fast(mine)
        except Invalid as exc:              # only the type's own checks after the fields (tree, filter, q)
            assert str(exc) == want and mine == after, (e, want)
        else:
            if got is None:
                assert mine == e, "a declined event must be left as it was"
            else:
                assert isinstance(want, int) and got == want and mine == after and list(mine) == list(after), e
    mine = copy.deepcopy(e)
    try:
        check_events([mine])
        assert isinstance(want, int) and mine == after, (e, want)
    except Invalid as exc:
        assert str(exc) == f"[0]{want}", (str(exc), want)


@functools.cache
def events() -> tuple[dict, ...]:
    """One of each shape the view-limit traces hold (the largest events the checks allow included). Built on first
    use, not at import: every pytest worker collects this file, and building them takes seconds."""
    seen, out = {}, []
    for build in (V.chains_and_trees, V.beams_and_sampling, V.jacobi_copies_crosstok, V.lookahead_shapes,
                  V.longest_strings, V.most_events, V.crafted_many):
        for r in build()["results"]:
            for e in r["events"]:
                key = (e["type"], tuple(sorted(e)), len(json.dumps(e)) // 4096)
                if seen.setdefault(key, 0) < 2:
                    seen[key] += 1
                    out.append(e)
    out.append({"type": "WidthChosen", "step": 0, "name": "window", "value": 4, "source": "curve",
                "tokens_per_forward": 1.5, "cost_ratio": 1.1, "predicted_speedup": 1.3})
    out.append({"type": "CorrectionToken", "step": 2, "position": 3, "token": 4, "kind": "bonus", "p_target": 1})
    out.append({"type": "DraftTranslated", "step": 1, "position": 0, "assistant_tokens": [1, 2],
                "assistant_ends": [1, 2], "target_tokens": [3], "target_ends": [2], "text": [65, 66],
                "assistant_q": [0.5, 0.25], "intersection": True})
    return tuple(out)


HOSTILE = [None, True, False, 0, 1, -1, 7, 2**31, -(2**31), 10**6, 10**6 + 1, 4096, 4097, 2**1024, 10**400, 0.5, -0.0,
           1e308, math.inf, -math.inf, math.nan, "x", "greedy", "target", "window", "", "\ud800", [], [1], [-1],
           [True], [0.5], [math.nan], [math.inf], [2**31], [1, "a"], [[1]], [[1, 2], [3]], [[True]], [[]], {}, {"a": 1},
           [1e308, 1e308], list(range(70_000))]


def test_every_event_type_has_a_compiled_check():
    assert set(COMPILED) == set(checks.SPECS)
    for name in COMPILED:                          # and its source reads as the rule (for review)
        source, _ = checks.compiled_source(name)
        assert source.startswith(f"def check_{name}(e):") and "return n" in source


def test_the_view_limit_events_pass_both_checks_alike():
    assert len(events()) > 40
    for e in events():
        _agree(e)


def test_every_field_given_every_hostile_value_is_judged_alike():
    rng = random.Random(39)
    for e in events():
        small = {k: (v[:64] if isinstance(v, list) else v) for k, v in e.items()}   # quick, same shapes
        for key in [k for k in small if k != "type"]:
            for value in rng.sample(HOSTILE, 12):
                _agree({**small, key: value})
            _agree({k: v for k, v in small.items() if k != key})                  # a field missing
        _agree({**small, "extra": 1})
        _agree({**small, "type": "NoSuchEvent"})
        _agree({**small, "type": ["TokenCommitted"]})


def test_events_that_only_the_types_own_checks_refuse():
    tree = V.draft_tree(2, 4, True)
    _agree({**tree, "parents": [-1, 0, 5, 2]})                     # a later parent
    _agree({**tree, "accepted": [0, 2]})                           # not a path
    _agree({**tree, "q": [0.5]})                                   # q per node or none
    _agree({"type": "DraftProposed", "step": 1, "position": 1, "tokens": [1, 2], "q": [0.5]})
    _agree({"type": "SamplingFilter", "step": 1, "position": 1, "tokens": [1, 2], "p_raw": [0.5, 1.5]})
    _agree({"type": "SamplingFilter", "step": 1, "position": 1, "tokens": [1, 2], "p_final": [0.5]})
    big = {"type": "DraftProposed", "step": 1, "position": 1, "tokens": [1] * 40_000, "q": [0.5] * 30_000}
    _agree(big)                                                     # over the numbers cap by its lists


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.sampled_from(["greedy", "target", "window", "x", "prompt"]))
_value = st.one_of(_scalar, st.lists(_scalar, max_size=5),
                   st.lists(st.lists(st.integers(-2, 9), max_size=3), max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.deferred(lambda: st.sampled_from(events())),
       st.deferred(lambda: st.dictionaries(st.sampled_from(sorted({k for e in events() for k in e} - {"type"})),
                                           _value, max_size=3)))
def test_random_changes_are_judged_alike(event, changes):
    small = {k: (v[:16] if isinstance(v, list) else v) for k, v in event.items()}
    _agree({**small, **changes})


def test_a_refusal_names_the_event_and_field_as_before(tmp_path):
    doc = V.make_doc(V.make_result("a", [{"type": "TokenCommitted", "step": 1, "position": 0, "token": 1,
                                          "source": "greedy"}] * 3),
                     V.make_result("b", [{"type": "ForwardPass", "step": 1, "model": "target", "positions": 1,
                                          "ms": 0.5}] * 5 + [{"type": "ForwardPass", "step": True, "model": "target",
                                                              "positions": 1, "ms": 0.5}]))
    with pytest.raises(ValueError, match=re.escape("results[1].events[5].step must be an integer in [0, 1000000], "
                                                   "got True")):
        import_trace(json.dumps(doc))


# --------------------------------------------------------------------------- reading: the depth of a batch
def _depth(text: str) -> int:
    """Nesting depth of JSON text, the long way: a walk over its parsed value."""
    def walk(v):
        if isinstance(v, dict):
            return 1 + max(map(walk, v.values()), default=0)
        if isinstance(v, list):
            return 1 + max(map(walk, v), default=0)
        return 0
    return walk(json.loads(text))


_json = st.recursive(st.one_of(st.none(), st.integers(), st.text(alphabet='[]{}"\\ab\u00e9\ud7ff', max_size=6)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), inner,
                                                             max_size=3)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_the_text_depth_is_the_values_depth(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)     # brackets, quotes and backslashes inside strings too
    want = _depth(text)
    for limit in (0, 1, want, want + 3):
        assert _text_depth(text, limit) == min(want, limit + 1)


# --------------------------------------------------------------------------- drawing
def _items_from_everything(result, step, at_ms, limit):
    """The token items as they were built before issue 39: every item ordered, then the newest ``limit``."""
    committed, rejected = tokens._gather(result, step, at_ms)
    order = []
    for pos in sorted(set(committed) | set(rejected)):
        order.extend((pos, e, "rejected") for e in rejected.get(pos, ()))
        if pos in committed:
            order.append((pos, committed[pos], "committed"))
    if step is None and at_ms is None and not committed and result.get("token_ids"):
        order.extend((pos, tok, "token") for pos, tok in enumerate(result["token_ids"]))
    hidden = 0 if limit is None else max(0, len(order) - limit)
    return [(pos, what, e if what == "token" else id(e)) for pos, e, what in order[hidden:]], hidden


def test_the_newest_items_are_those_of_the_whole_order():
    rng = random.Random(7)
    for _ in range(300):
        events = []
        for _ in range(rng.randint(0, 120)):
            kind = rng.random()
            step, pos = rng.randint(0, 20), rng.randint(0, 40)
            if kind < 0.5:
                events.append({"type": "TokenCommitted", "step": step, "position": pos, "token": 1, "source": "greedy"})
            elif kind < 0.85:
                events.append({"type": "TokenVerified", "step": step, "position": pos, "token": 2,
                               "accepted": rng.random() < 0.4, "p_target": 0.5, "q_draft": 0.5})
            else:
                events.append({"type": "ForwardPass", "step": step, "model": "target", "positions": 1, "ms": 1.0})
        result = {"strategy": "s", "events": events, "token_ids": [3] * rng.randint(0, 9), "vocab": {"1": "a"}}
        for step in (None, 0, 7, 50):
            for limit in (None, 0, 1, 3, 30, 500):
                items, hidden = tokens._items(result, step, None, limit)
                want, want_hidden = _items_from_everything(result, step, None, limit)
                assert hidden == want_hidden
                assert [(it["position"], it["struck"], it["token"]) for it in items] == \
                    [(p, what == "rejected", 3 if what == "token" else next(
                        e["token"] for e in events if id(e) == ref)) for p, what, ref in want]


def _figures(doc):
    results = doc["results"]
    return {"speed": charts.speed_chart(results), "timeline": charts.forward_timeline(results),
            "breakdown": charts.time_breakdown(results), "sources": charts.source_counts(results),
            "leviathan": charts.leviathan_chart(results), "placeholder": page.placeholder(V.EVIL)}


def test_the_figures_from_plain_dicts_are_what_plotly_validates():
    spec = V.make_result(V.EVIL, [{"type": "ForwardPass", "step": 1, "model": "draft", "positions": 3, "ms": 1.5,
                                   "kind": "draft"},
                                  {"type": "ForwardPass", "step": 1, "model": "target", "positions": 4, "ms": 2.5,
                                   "kind": "verify"},
                                  {"type": "TokenCommitted", "step": 1, "position": 0, "token": 1,
                                   "source": "accepted"}],
                         stats={"predicted_speedup": 1.7, "alpha": 0.6, "gamma": 4, "cost_ratio": 0.1})
    docs = [V.make_doc(spec, V.make_result("g", [], reference=True, error="x"), V.make_result("h", [], speedup=None)),
            V.chains_and_trees()]
    for doc in docs:
        for name, fig in _figures(doc).items():
            assert isinstance(fig, go.Figure), name
            validated = go.Figure(fig.to_dict())      # every property through plotly's validators: same JSON
            assert json.loads(validated.to_json()) == json.loads(fig.to_json()), name
            assert "<img" not in fig.to_json(), name  # markup from the trace stays escaped
    assert charts.speed_chart(docs[0]["results"]).data[0].x[0].startswith("&lt;img")


# --------------------------------------------------------------------------- the streamed import
def _trace(tmp_path, n: int = 3):
    doc = V.make_doc(*(V.make_result(f"s{k}", [{"type": "TokenCommitted", "step": i + 1, "position": i,
                                                "token": i, "source": "greedy"} for i in range(40)], n=40)
                       for k in range(n)))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return path


async def _first_views(updates) -> dict:
    """The import's first update that holds the views (``timeline``), the generator left where it was."""
    async for update in updates:
        if "timeline" in update:
            return update
    raise AssertionError("the import ended without its first views")


def test_the_import_streams_its_first_views_before_the_token_columns(tmp_path, monkeypatch):
    gate, drawn = threading.Event(), []
    real = compute.column_views

    def columns_later(doc, step):           # the columns are drawn only once the first views were seen
        assert gate.wait(60)
        drawn.append(step)
        return real(doc, step)
    monkeypatch.setattr(compute, "column_views", columns_later)
    app = PlaygroundApp()

    async def main() -> tuple[dict, list]:
        updates = handlers.import_views(app, str(_trace(tmp_path)))
        first = await _first_views(updates)
        assert drawn == [] and first["columns"] == handlers.DRAWING
        assert first["status"] == "Imported a trace with 3 strategies (no model needed). Drawing the token columns…"
        assert app.store.get(first["key"]) is not None            # the step slider works already
        gate.set()
        return first, [u async for u in updates]
    first, rest = asyncio.run(main())
    assert drawn == [40] and len(rest) == 1
    last = rest[0]
    assert set(last) == set(first) and last["status"] == "Imported a trace with 3 strategies (no model needed)."
    assert last["columns"].count("class='dp-col") == 3 and "Drawing" not in last["columns"]
    doc = import_trace_file(_trace(tmp_path))
    assert {k: v for k, v in last.items() if k in compute.draw_views(doc)} == \
        {k: v for k, v in compute.draw_views(doc).items()}   # the same views as drawn in one go
    assert asyncio.run(handlers.import_file(app, str(_trace(tmp_path))))["columns"] == last["columns"]


def test_stop_between_the_first_views_and_the_columns(tmp_path, monkeypatch):
    gate, held = threading.Event(), []
    real_columns, real_alone = compute.column_views, handlers.alone
    monkeypatch.setattr(compute, "column_views", lambda doc, step: (gate.wait(60), real_columns(doc, step))[1])
    monkeypatch.setattr(handlers, "alone", lambda *a, **k: held.append(real_alone(*a, **k)) or held[0])
    app = PlaygroundApp()

    async def main() -> tuple[dict, list]:
        updates = handlers.import_views(app, str(_trace(tmp_path)))
        first = await _first_views(updates)
        assert handlers.stop_run(app)[0] == "Stopping after the current step…"
        rest = asyncio.ensure_future(_drain(updates))
        assert await asyncio.to_thread(held[0].stop.wait, 30)   # the handler saw Stop while the columns were drawn
        gate.set()
        return first, await asyncio.wait_for(rest, 30)
    first, rest = asyncio.run(main())
    assert rest[-1]["status"] == ("Imported a trace with 3 strategies (no model needed). Stopped before its token "
                                  "columns were shown.")
    assert rest[-1]["columns"] == handlers.STOPPED
    assert "step 40 / 40" in playback.replay(app, first["key"], 40)["columns"]   # still replayable


async def _drain(updates) -> list:
    return [u async for u in updates]


def test_a_refused_upload_still_raises_its_message(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(V.over_the_cap()))
    with pytest.raises(Exception, match="holds 65537 numbers; the limit is 65536"):
        asyncio.run(_drain(handlers.import_views(PlaygroundApp(), str(path))))


def test_garbage_collection_pauses_nest_and_restore():
    assert gc.isenabled()
    with compute.paused_gc():
        with compute.paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with compute.paused_gc():
            pass
        assert not gc.isenabled()            # left as it was found
    finally:
        gc.enable()
