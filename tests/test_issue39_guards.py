"""Tests for small bugs the suite let through (issue 39): each fails when its bug is put back.

* the request key without the model, or without the assistant a strategy drafts with: a recording made on
  one model would be replayed for another;
* ``Board.join`` joining a run that is stopping but not yet done (its visitor gets a cut-short run);
* the queue guard no longer raising Gradio's analytics cache frequency (a pandas summary after every job);
* ``jsonstream``'s C-scanner fast path, or its number-run fast path for non-negative numbers, never taken:
  the same output, only slower, so these tests watch which path is taken rather than time it;
* ``Pools.answered`` without its held-out / training filter: held-out answers feeding training follow-ups;
* the path filter taking the ``/script`` of ``</script>`` for a path in an error message.
"""

from __future__ import annotations

import io
import json
import threading

import gradio as gr
import pytest
import torch

from playground.training import prophet_data
from visualize import jsonstream as js
from visualize import traces
from web import handlers, queue_guard
from web.crowd import Board, Computation, Line
from web.redact import redact_paths
from web.requests import run_request
from web.validation import GENERATION_FIELDS

BUNDLED = "smollm2-135m-instruct"
OTHER = "distilgpt2"


# --------------------------------------------------------------------------- the request key
def _key(**change) -> str:
    values = dict(model=BUNDLED, assistant="none", strategies=["greedy"], prompt="Hi.", chat=True, max_new_tokens=8,
                  seed=0, params={}, generation=[None] * len(GENERATION_FIELDS))
    values.update(change)
    return run_request(**values).key


def test_the_request_key_depends_on_the_target_model():
    assert _key() == _key()
    assert _key(model=OTHER) != _key()


def test_the_request_key_depends_on_the_assistant_a_strategy_drafts_with():
    spec = dict(strategies=["speculative"])
    assert _key(assistant=BUNDLED, **spec) == _key(assistant=BUNDLED, **spec)
    assert _key(assistant=OTHER, **spec) != _key(assistant=BUNDLED, **spec)
    assert _key(assistant="prophet", **spec) != _key(assistant=BUNDLED, **spec)


# --------------------------------------------------------------------------- the board
def test_a_request_does_not_join_a_run_that_is_stopping():
    """A run whose Stop is set but whose work has not returned yet is not joined: a new one starts."""
    line, board, gate = Line(slots=2), Board(), threading.Event()

    def make() -> Computation:
        return Computation("same", lambda comp: gate.wait(10) and "done")    # notices Stop only at its end
    try:
        a, started_a = board.join("same", make, line)
        assert started_a
        a.stop.set()
        assert not a.done.is_set()
        b, started_b = board.join("same", make, line)
        assert started_b and b is not a
    finally:
        gate.set()
    assert a.done.wait(5) and b.done.wait(5)


# --------------------------------------------------------------------------- the queue guard
def test_the_queue_guard_raises_gradios_analytics_cache_frequency(monkeypatch):
    monkeypatch.delenv("GRADIO_ANALYTICS_CACHE_FREQUENCY", raising=False)
    blocks = gr.Blocks()
    assert blocks._queue.ANAYLTICS_CACHE_FREQUENCY == 1          # Gradio's default: a summary after every job
    assert queue_guard.install(blocks)
    assert isinstance(blocks._queue, queue_guard.GuardedQueue)
    assert blocks._queue.ANAYLTICS_CACHE_FREQUENCY >= 100


# --------------------------------------------------------------------------- jsonstream's fast paths
def _spy(monkeypatch, name: str) -> list:
    """Record what ``_Parser.<name>`` did: for ``_scan`` each value it returned, for ``_run`` how many
    numbers each call appended."""
    seen: list = []
    real = getattr(js._Parser, name)
    if name == "_scan":
        def spy(self, text, wrapped=False):
            value = real(self, text, wrapped)
            seen.append(value)
            return value
    else:
        def spy(self, items, buf, pos):
            before = len(items)
            end = real(self, items, buf, pos)
            seen.append(len(items) - before)
            return end
    monkeypatch.setattr(js._Parser, name, spy)
    return seen


def test_a_trace_import_parses_its_events_with_the_c_scanner(monkeypatch):
    events = [{"type": "TokenCommitted", "step": i + 1, "position": i, "token": 5, "source": "greedy",
               "prob": None} for i in range(50)]
    doc = {"format": traces.FORMAT, "version": 2, "prompt": "p",
           "results": [{"strategy": "greedy", "token_ids": [5] * 50, "events": events}]}
    scanned = _spy(monkeypatch, "_scan")
    got = traces.import_trace(json.dumps(doc))
    assert got["results"][0]["events"] == events
    assert sum(len(v) for v in scanned if isinstance(v, list)) >= 40     # the events, a batch at a time


def test_a_long_run_of_non_negative_numbers_takes_the_number_run_path(monkeypatch):
    """A list too long for the C scanner (over FAST characters): its numbers are read a run at a time."""
    numbers = [i * 7919 % 100_000 for i in range(20_000)]            # about 120,000 characters, none negative
    text = json.dumps({"xs": numbers}).encode()
    assert len(text) > js.FAST
    appended = _spy(monkeypatch, "_run")
    doc, _ = js.read_json(io.BytesIO(text), js.Limits(max_bytes=1 << 22, max_depth=8))
    assert doc == {"xs": numbers}
    assert sum(appended) >= len(numbers) - 1         # every number but the last (no comma after it)


# --------------------------------------------------------------------------- the prophet's data pools
def test_answered_prompts_stay_on_their_side_of_the_hold_out(tmp_path):
    held, train = prophet_data.HELD[0].name, "magpie-t0.7"
    assert held in prophet_data.HELD_NAMES and train not in prophet_data.HELD_NAMES

    def record(source: str, text: str) -> dict:
        return {"source": source, "conversation": [{"role": "user", "content": text}], "answer": f"{text}!"}
    torch.save([record(held, "held one"), record(held, "held two")], tmp_path / "u0000-held.pt")
    torch.save([record(train, "train one"), record(train, "train two")], tmp_path / "u0005-train.pt")
    pools = prophet_data.Pools(tmp_path)
    assert sorted(r["answer"] for r in pools.answered(False)) == ["train one!", "train two!"]
    assert sorted(r["answer"] for r in pools.answered(True)) == ["held one!", "held two!"]


# --------------------------------------------------------------------------- the path filter
def test_a_closing_tag_in_an_error_is_escaped_not_taken_for_a_path():
    message = "bad label <script>alert(1)</script> in /home/someone/trace.json"
    assert redact_paths(message) == "bad label <script>alert(1)</script> in [path]"
    shown = handlers.user_error(ValueError(message)).message
    assert shown == "bad label &lt;script&gt;alert(1)&lt;/script&gt; in [path]"
    # a path in angle brackets is still a path
    assert redact_paths("no file </etc/passwd> or <~/models/x>") == "no file <[path]> or <[path]>"
