"""The page's wiring by name (issue 38): handlers read each input by its name, never by its position.

The page is built with its inputs in another order (``build_demo(run_order=...)``: the prompt moved from the
fourth place to the last but the generation settings, the seed to the first); the run's and the sweep's
handlers still get every value under the right name. With the old positional slicing (``values[:7]``) the
prompt would have gone to ``chat`` and the seed to ``model``. No server and no model: the request each handler
builds is caught where it would enter the compute line.
"""

from __future__ import annotations

import asyncio

import gradio as gr
import pytest

import app
from web import handlers
from web.crowd import QueueFull
from web.page_names import SWEEP_INPUTS, generation_input, param_input, run_inputs
from web.validation import GENERATION_FIELDS

BUNDLED = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def moved():
    order = list(run_inputs())
    assert order[3] == "prompt" and order[6] == "seed"       # /run's order, which API callers send by position
    order.insert(len(order) - len(GENERATION_FIELDS), order.pop(3))
    order.insert(0, order.pop(order.index("seed")))
    return tuple(order), app.build_demo(run_order=tuple(order))


def _event(demo, api_name):
    return next(fn for fn in demo.fns.values() if fn.api_name == api_name)


async def _drain(agen):
    async for _ in agen:
        pass


def test_the_run_event_takes_its_inputs_in_the_order_given(moved):
    order, demo = moved
    names = {c._id: n for n, c in demo.inputs.items()}
    assert [names[c._id] for c in _event(demo, "run").inputs] == list(order)
    assert [names[c._id] for c in _event(demo, "sweep").inputs] == list(SWEEP_INPUTS)
    with pytest.raises(ValueError, match="run_order must name each"):
        app.build_demo(run_order=order[1:])


def test_the_runs_handler_gets_every_value_under_its_name(moved, monkeypatch):
    order, demo = moved
    sent = dict.fromkeys(order)
    sent.update({"model": BUNDLED, "assistant": "none", "strategies": ["greedy", "beam", "lookahead"],
                 "prompt": "A prompt that moved.", "chat": False, "max_new_tokens": 7, "seed": 5,
                 param_input("beam", "num_beams"): 3, param_input("lookahead", "window"): 4,
                 generation_input("repetition_penalty"): 1.5, generation_input("min_new_tokens"): 2})
    caught = []

    def submit(state, req, background=False):
        caught.append(req)
        raise QueueFull("caught before the line")
    monkeypatch.setattr(handlers, "submit_run", submit)
    with pytest.raises(gr.Error, match="caught before the line"):
        asyncio.run(_drain(_event(demo, "run").fn(None, None, *[sent[name] for name in order])))
    (req,) = caught
    assert (req.inputs.model, req.inputs.prompt, req.inputs.chat, req.inputs.max_new, req.inputs.seed) == \
        (BUNDLED, "A prompt that moved.", False, 7, 5)
    plan = dict(req.plan)
    assert list(plan) == ["greedy", "beam", "lookahead"]
    assert plan["beam"].num_beams == 3 and plan["lookahead"].window == 4
    assert req.generation.repetition_penalty == 1.5 and req.generation.min_new_tokens == 2


def test_the_sweeps_handler_gets_every_value_under_its_name(moved, monkeypatch):
    _, demo = moved
    caught = []

    def sweep_request(*args, **kwargs):
        caught.append(args)
        raise ValueError("caught before the line")
    monkeypatch.setattr(handlers, "sweep_request", sweep_request)
    sent = {"model": BUNDLED, "assistant": "none", "prompt": "Sweep this.", "chat": True, "max_new_tokens": 9,
            "seed": 11, "sweep_strategy": "lookahead", "sweep_spec": "window=2,3"}
    with pytest.raises(gr.Error, match="caught before the line"):
        asyncio.run(_drain(_event(demo, "sweep").fn(None, None, *[sent[name] for name in SWEEP_INPUTS])))
    assert caught[0][:8] == (BUNDLED, "none", "Sweep this.", True, 9, 11, "lookahead", "window=2,3")


def test_the_race_endpoint_is_admitted_and_queued_like_a_run(moved):
    """/race goes through the page's queue admission (a Stop ticket, a few jobs per session) and concurrency group."""
    _, demo = moved
    run, race = _event(demo, "run"), _event(demo, "race")
    assert race.validator is run.validator                      # one admission for both doors
    jobs = demo.playground.jobs
    request = type("Request", (), {"session_hash": "wired", "request": None})()
    before = len(jobs)
    verdicts = race.validator(request, "prompt", ["greedy"])   # admitted: a Stop ticket in this app's jobs
    assert verdicts[0]["is_valid"] and len(jobs) == before + 1
    assert race.concurrency_id == run.concurrency_id == "generate"
