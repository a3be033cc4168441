"""A live-race frame costs what it changes (issue 25): outputs a handler leaves out are answered as Gradio
answers them, without Gradio rebuilding each left-out component (app.Playground.postprocess_data)."""

from __future__ import annotations

import asyncio
import random

import gradio as gr
from gradio.state_holder import SessionState

import app


def _value(block, tmp_path, i):
    if block.stateful:
        return i
    if isinstance(block, gr.File):
        path = tmp_path / f"f{i}.json"
        path.write_text("{}")
        return str(path)
    if isinstance(block, gr.Slider):
        return gr.update(minimum=0, maximum=10 + i, value=i)
    if isinstance(block, gr.Dropdown):
        return gr.update(choices=["a", "b"], value="a")
    if isinstance(block, gr.Plot):
        return None
    return f"<b>value {i}</b>"


def test_left_out_outputs_are_answered_as_gradio_answers_them(tmp_path, monkeypatch):
    demo = app.build_demo()
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    outputs = list(run.outputs)
    rng = random.Random(0)
    for trial in range(12):
        chosen = rng.sample(outputs, rng.randint(1, len(outputs)))
        ours = asyncio.run(app.Playground.postprocess_data(
            demo, run, {b: _value(b, tmp_path, trial) for b in chosen}, SessionState(demo)))
        theirs = asyncio.run(gr.Blocks.postprocess_data(
            demo, run, {b: _value(b, tmp_path, trial) for b in chosen}, SessionState(demo)))
        assert ours == theirs, chosen
    # a frame (columns and status) rebuilds no component; Gradio alone rebuilds every left-out one
    built = []
    real_init = gr.Plot.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(gr.Plot, "__init__", counting)
    frame = {demo.ui["columns"]: "<div>cols</div>", demo.ui["status"]: "Strategy 1 of 2"}
    asyncio.run(app.Playground.postprocess_data(demo, run, frame, SessionState(demo)))
    assert built == []
    asyncio.run(gr.Blocks.postprocess_data(demo, run, frame, SessionState(demo)))
    assert len(built) == sum(isinstance(b, gr.Plot) for b in outputs)
