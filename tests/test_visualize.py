"""Pure views: frames, escaping, legend, charts, trace import validation, no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from visualize.charts import forward_timeline, source_counts, speed_chart
from visualize.iterations import jacobi_heatmap
from visualize.acceptance import accepted_length_histogram, inspector
from visualize.tokens import LEGEND, columns_html, max_step, token_items, tokens_html
from visualize.traces import MAX_BYTES, export_trace, import_trace


def _result(**over):
    r = {"strategy": "prompt_lookup", "label": "Prompt lookup", "params": {}, "token_ids": [5, 6, 7],
         "pieces": ["<script>", " b", "\n"], "vocab": {"5": "<script>", "6": " b", "7": "\n", "9": "x"},
         "wall_s": 1.0, "tokens_per_s": 3.0, "speedup": 1.2, "target_forwards": 2, "draft_forwards": 0,
         "stats": {"accepted_lengths": [1]}, "lossless": True, "matches_greedy": True, "error": None,
         "events": [
             {"type": "ForwardPass", "step": 1, "model": "target", "positions": 4, "ms": 3.0, "kind": "prefill"},
             {"type": "TokenCommitted", "step": 1, "position": 0, "token": 5, "source": "greedy", "prob": 0.5},
             {"type": "DraftProposed", "step": 2, "position": 1, "tokens": [6, 9], "q": [1.0, 1.0],
              "source": "prompt_lookup"},
             {"type": "TokenVerified", "step": 2, "position": 1, "token": 6, "accepted": True,
              "p_target": 0.9, "q_draft": 1.0, "u": None},
             {"type": "TokenVerified", "step": 2, "position": 2, "token": 9, "accepted": False,
              "p_target": 0.1, "q_draft": 1.0, "u": None},
             {"type": "Distribution", "step": 2, "position": 2, "tokens": [7, 9], "p_target": [0.8, 0.1],
              "q_draft": [], "residual": []},
             {"type": "StepTiming", "step": 2, "draft_ms": 0.1, "verify_ms": 3.0, "overhead_ms": 0.2,
              "drafted": 2, "accepted": 1},
             {"type": "TokenCommitted", "step": 2, "position": 1, "token": 6, "source": "accepted"},
             {"type": "TokenCommitted", "step": 2, "position": 2, "token": 7, "source": "correction"},
             {"type": "JacobiIteration", "step": 2, "block": 1, "iteration": 1, "start": 1, "guess": [6, 7],
              "converged": 2, "probs": [0.9, 0.8]}]}
    r.update(over)
    return r


def test_frames_follow_the_replay_clock():
    r = _result()
    assert max_step(r) == 2
    assert [it["source"] for it in token_items(r, 1)] == ["greedy"]
    items = token_items(r, 2)
    assert [it["source"] for it in items] == ["greedy", "accepted", "rejected", "correction"]
    assert items[2]["struck"] and items[2]["text"] == "x"


def test_token_text_is_escaped():
    html = tokens_html(_result())
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "↵" in html  # newlines visible
    page = columns_html([_result(), _result(strategy="greedy", label="<b>evil</b>")])
    assert "<b>evil</b>" not in page and page.count("class='dp-col'") == 2
    assert "identical to greedy" in page


def test_legend_is_one_palette():
    assert {"greedy", "accepted", "rejected", "correction", "bonus", "jacobi", "ngram"} <= set(LEGEND)
    assert len({c for _, c in LEGEND.values()}) == len(LEGEND)


def test_charts_build():
    results = [_result(), _result(strategy="greedy", label="Greedy", speedup=1.0)]
    assert speed_chart(results).data[0].type == "bar"
    assert forward_timeline(results).data
    assert source_counts(results).data
    assert accepted_length_histogram(results).data
    fig = inspector(_result(), 2)
    assert "rejected" in fig.layout.title.text
    assert jacobi_heatmap(_result()).data[0].type == "heatmap"


def test_trace_round_trip_and_bad_uploads():
    doc = {"prompt": "p", "prompt_ids": [1], "results": [_result()]}
    back = import_trace(export_trace(doc))
    assert back["version"] == 2 and import_trace(export_trace(back)) == back
    for got, sent in zip(back["results"][0]["events"], json.loads(json.dumps(_result()))["events"]):
        assert got == {**got, **sent}          # every field kept; missing ones got their defaults
    assert back["results"][0]["events"][7]["prob"] is None
    bad = [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"format": "other"}), "not a decoding-playground trace"),
        (json.dumps({"format": "decoding-playground-trace", "version": 9}), "unsupported trace version"),
        (json.dumps({"format": "decoding-playground-trace", "version": 1, "results": []}), "no results"),
        (json.dumps({"format": "decoding-playground-trace", "version": 1, "results": [{"strategy": "x"}]}),
         "results[0].token_ids is missing"),
        (json.dumps({"format": "decoding-playground-trace", "version": 1, "results": [
            {"strategy": "x", "token_ids": [1], "events": [{"type": "Pickle", "step": 1}]}]}), "unknown event type"),
        ("[" * 5000 + "]" * 5000, "nested deeper"),
        (b" " * (MAX_BYTES + 1), "the limit is 20 MB"),
    ]
    for data, msg in bad:
        with pytest.raises(ValueError) as err:
            import_trace(data)
        assert msg in str(err.value)


def test_visualize_imports_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import visualize.tokens, visualize.charts, visualize.traces, visualize.acceptance, visualize.iterations\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=".")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=4), max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(payload=st.one_of(st.binary(max_size=200), json_values.map(json.dumps),
                         st.fixed_dictionaries({"format": st.just("decoding-playground-trace"),
                                                "version": st.just(1), "results": json_values}).map(json.dumps)))
def test_fuzzed_trace_import_never_crashes(payload):
    try:
        doc = import_trace(payload)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(doc["results"], list)
        columns_html(doc["results"])  # and whatever it accepted, the views can draw


# --------------------------------------------------------------------------- hostile values reaching HTML

def _unvalidated(**over) -> dict:
    """A result as a view might get it without import validation (a future caller, a bug upstream)."""
    r = _result(**over)
    r["events"] = [dict(e) for e in r["events"]]
    return r


def test_every_value_reaching_html_is_escaped_even_without_validation():
    r = _unvalidated(matches_greedy=False, first_divergence="<img src=x onerror=alert(1)>",
                     divergence_margin=0.5, params={"<b>k</b>": "<i>v</i>"}, error=None)
    r["events"][1]["source"] = "x' onmouseover='alert(1)"
    page = columns_html([r], 2)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "' onmouseover=" not in page and "data-source='x&#x27; onmouseover=&#x27;alert(1)'" in page
    assert "<b>k</b>" not in page and "<i>v</i>" not in page
    r["events"][1]["prob"] = "<script>"            # a string where a probability belongs: no crash, not shown
    assert "<script>" not in tokens_html(r)


def test_plot_labels_are_escaped():
    from visualize.charts import sweep_figure
    evil = _result(label="<a href='https://evil.example'>x</a>")
    assert speed_chart([evil]).data[0].x[0].startswith("&lt;a href=")
    assert accepted_length_histogram([evil]).data[0].name.startswith("&lt;a")
    assert "<" not in inspector(_result(vocab={"7": "<b>", "9": "x"}), 2).data[0].x[0]
    fig = sweep_figure({"strategy": "<b>s</b>", "keys": ["<i>k</i>"], "points": [{"values": [1], "speedup": 1.0}]})
    assert "<" not in fig.layout.title.text and "<" not in fig.layout.xaxis.title.text


def test_frames_are_bounded_and_show_the_newest_tokens():
    from visualize.tokens import MAX_FRAME_ITEMS
    n = 3 * MAX_FRAME_ITEMS
    big = _result(token_ids=[5] * n, pieces=[f"t{i} " for i in range(n)], events=[
        {"type": "TokenCommitted", "step": i, "position": i, "token": 5, "source": "greedy"} for i in range(n)])
    page = columns_html([big], n)
    assert page.count("class='dp-tok'") == MAX_FRAME_ITEMS
    assert f"{n - MAX_FRAME_ITEMS} earlier items not shown" in page
    assert f"t{n - 1}&nbsp;" in page and "t0&nbsp;" not in page           # the newest stay in view
    two = columns_html([big, _result()], n)
    assert two.count("class='dp-tok'") <= MAX_FRAME_ITEMS + 3


def test_histogram_of_a_huge_accepted_length_stays_small():
    r = _result(events=[], stats={"accepted_lengths": [1, 10**6]})
    assert len(accepted_length_histogram([r]).data[0].x) <= 65


def test_version_one_is_upgraded_through_the_legacy_module(monkeypatch):
    import types
    import visualize.traces as traces
    seen = []

    def upgrade(doc):
        seen.append(doc["version"])
        return dict(doc, version=2, results=[dict(r, label="upgraded") for r in doc["results"]])
    monkeypatch.setattr(traces.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(traces.importlib, "import_module", lambda name: types.SimpleNamespace(upgrade=upgrade))
    doc = json.loads(export_trace({"results": [_result()]}))
    doc["version"] = 1
    back = import_trace(json.dumps(doc))
    assert seen == [1] and back["version"] == 2 and back["results"][0]["label"] == "upgraded"
    doc["version"] = 2
    assert import_trace(json.dumps(doc))["results"][0]["label"] == "Prompt lookup" and seen == [1]


def test_every_event_type_has_an_import_check():
    from decoding.events import EVENT_TYPES
    from visualize.traces import SPECS
    assert set(SPECS) == set(EVENT_TYPES)       # a new event type without a check fails at import time


def test_a_draft_tree_is_checked():
    tree = {"type": "DraftTree", "step": 1, "position": 0, "tokens": [5, 6, 7], "parents": [-1, 0, 0],
            "q": [0.5, 0.4, 0.3], "accepted": [0, 1], "next_token": 9, "mask_size": 4, "source": "prophet"}
    ok = _result(events=[tree])
    import_trace(export_trace({"results": [ok]}))
    for bad, msg in [({"parents": [-1, 0]}, "parents must give each node"),
                     ({"q": [0.5]}, "q must be empty or hold one probability per node"),
                     ({"accepted": [2]}, "accepted must be a path"),
                     ({"source": "<b>"}, "source must be one of"),
                     ({"next_token": -2}, "next_token must be an integer in [-1,")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            import_trace(export_trace({"results": [_result(events=[{**tree, **bad}])]}))


def test_a_version_one_jacobi_trace_is_renamed_by_the_legacy_module():
    pytest.importorskip("visualize.legacy")
    it = {"type": "JacobiIteration", "step": 1, "block": 0, "iteration": 0, "start": 0, "guess": [5, 6],
          "converged": 2, "probs": [0.5, 0.5]}
    old = _result(strategy="jacobi", label="Jacobi", params={"variant": "gs_jacobi"}, events=[
        it, {"type": "TokenCommitted", "step": 1, "position": 0, "token": 5, "source": "jacobi"}])
    doc = json.loads(export_trace({"results": [old]}))
    doc["version"] = 1
    back = import_trace(json.dumps(doc))["results"][0]
    assert back["params"]["variant"] == "sliding" and back["upgraded_from"]["variant"] == "gs_jacobi"
    assert back["events"][0]["committed"] == 1           # filled in from the iteration's committed tokens
