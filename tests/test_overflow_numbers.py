"""A number too large for a float in an imported trace (issue 39): a named error, never an OverflowError.

JSON integers have no size limit; ``math.isfinite`` (and ``float()``) raise OverflowError on one of about 309
digits or more. Every number field of a trace is checked by ``visualize/checks.py``; such a number must be
refused there like any other bad number, with the field in the message, and reach the browser as that message
(an OverflowError escaped the upload handler, and Gradio answered ``{'error': None}``).
"""

from __future__ import annotations

import asyncio
import json

import gradio as gr
import pytest

from visualize import traces
from web import handlers
from web.app_object import PlaygroundApp

HUGE = [2**1024, -(2**1100)]


def _trace() -> dict:
    events = [{"type": "ForwardPass", "step": 1, "model": "target", "positions": 4, "ms": 2.0, "kind": "prefill"},
              {"type": "TokenCommitted", "step": 1, "position": 0, "token": 5, "source": "greedy", "prob": 0.5}]
    result = {"strategy": "greedy", "label": "Greedy", "params": {"draft_tokens": 4}, "token_ids": [5],
              "pieces": ["a"], "vocab": {"5": "a"}, "wall_s": 0.1, "stats": {"alpha": 0.5}, "lossless": True,
              "times_ms": [0.5, 1.0], "events": events}
    return {"format": traces.FORMAT, "version": 2, "prompt": "p", "generation": {"temperature": 1.0},
            "results": [result]}


def _set(doc: dict, field: str, value) -> None:
    r = doc["results"][0]
    if field == "wall_s":
        r["wall_s"] = value
    elif field == "stats.alpha":
        r["stats"]["alpha"] = value
    elif field == "stats.other":                  # a stat the views do not format as a number
        r["stats"]["other"] = value
    elif field == "params.draft_tokens":
        r["params"]["draft_tokens"] = value
    elif field == "events[0].ms":
        r["events"][0]["ms"] = value
    elif field == "events[1].prob":
        r["events"][1]["prob"] = value
    elif field == "times_ms[1]":
        r["times_ms"][1] = value
    elif field == "generation.temperature":
        doc["generation"]["temperature"] = value
    else:
        raise AssertionError(field)


FIELDS = {"wall_s": "results[0].wall_s", "stats.alpha": "results[0].stats.alpha",
          "stats.other": "results[0].stats.other", "params.draft_tokens": "results[0].params.draft_tokens",
          "events[0].ms": "results[0].events[0].ms", "events[1].prob": "results[0].events[1].prob",
          "times_ms[1]": "results[0].times_ms[1]", "generation.temperature": "generation.temperature"}


def test_the_trace_is_accepted_with_ordinary_numbers():
    doc = traces.import_trace(json.dumps(_trace()))
    assert doc["results"][0]["wall_s"] == 0.1


@pytest.mark.parametrize("value", HUGE, ids=["2**1024", "-2**1100"])
@pytest.mark.parametrize("field", list(FIELDS))
def test_a_number_too_large_for_a_float_is_refused_naming_its_field(field, value):
    doc = _trace()
    _set(doc, field, value)
    with pytest.raises(ValueError) as err:
        traces.import_trace(json.dumps(doc))
    assert f"{FIELDS[field]} must be a finite number, got an integer of about" in str(err.value)


def test_the_largest_integer_a_float_holds_is_still_a_number():
    doc = _trace()
    _set(doc, "wall_s", int(1.7976931348623157e308))     # float's largest finite value, as a JSON integer
    assert traces.import_trace(json.dumps(doc))["results"][0]["wall_s"] == int(1.7976931348623157e308)


@pytest.mark.parametrize("field", ["wall_s", "events[1].prob", "times_ms[1]"])
def test_the_upload_handler_sends_the_message_to_the_browser(tmp_path, field):
    """``import_file`` turns a refusal into ``gr.Error`` (shown to the visitor); any other exception would
    reach the browser as ``{'error': None}``."""
    doc = _trace()
    _set(doc, field, 2**1024)
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(gr.Error) as err:
        asyncio.run(handlers.import_file(PlaygroundApp(), str(path)))
    assert f"trace: {FIELDS[field]} must be a finite number, got an integer of about 309 digits" in str(err.value)
