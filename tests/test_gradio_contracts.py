"""What each override in web/gradio_overrides.py assumes of Gradio, checked against the installed Gradio (issue 48).

``test_gradio_overrides.py`` fails on a Gradio outside ``SUPPORTED``; these fail on the Gradio that changes what an
override rests on, whatever its version says. One test (or two) per override that stays:

- ``GuardedBlocks.postprocess_data``: its answer equals Gradio's own, output for output;
- ``LeanSessionState`` / ``LeanStateHolder``: Gradio makes the holder and gives it to the Blocks the way the
  setter expects, and a session's state keeps every attribute Gradio's has;
- ``SnapshotSet``: Gradio's cache cleaner still walks the live sets (the bug it guards against) and the sets it
  walks are the ones ``guard_temp_files`` swaps; if Gradio fixes the walk, the first test says the override can go;
- ``api_endpoint``'s validator: the queue still reads ``BlockFunction.validator`` when a call enters it;
- ``plot_once``: ``gr.Plot`` passes a ``PlotData`` through unchanged;
- the queue guard: the queue's message table and ``send_message`` are what ``GuardedQueue`` replaces.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
import time

import gradio as gr
import plotly.graph_objects as go
import pytest
from gradio import queueing, route_utils
from gradio.state_holder import SessionState, StateHolder

from web import gradio_overrides, queue_guard
from web.gradio_overrides import GuardedBlocks, LeanSessionState, LeanStateHolder, SnapshotSet


def _page():
    """A Blocks with one output of each kind the app's handlers answer with a dict."""
    with GuardedBlocks() as blocks:
        outputs = [gr.HTML(), gr.Markdown(), gr.Textbox(), gr.State(), gr.Plot(), gr.JSON(), gr.Number(),
                   gr.Checkbox(), gr.Dropdown(choices=["a", "b"]), gr.File(), gr.Button()]
        gr.Button().click(lambda: None, None, outputs)
    return blocks, blocks.fns[0], outputs


GIVEN = {"HTML": "<b>x</b>", "Markdown": "*m*", "Textbox": "t", "State": {"k": 1}, "JSON": {"a": 1},
         "Number": 3, "Checkbox": True, "Dropdown": "b"}


@pytest.mark.parametrize("given", sorted(GIVEN))
def test_postprocess_data_answers_as_gradio_does(given):
    """Left-out outputs answered without a rebuild must be exactly what Gradio's own postprocessing sends."""
    blocks, fn, outputs = _page()
    [block] = [b for b in outputs if type(b).__name__ == given]
    predictions = {block: GIVEN[given]}
    plain = asyncio.run(gr.Blocks.postprocess_data(blocks, fn, dict(predictions), SessionState(blocks)))
    ours = asyncio.run(blocks.postprocess_data(fn, dict(predictions), SessionState(blocks)))
    assert ours == plain


def test_postprocess_data_takes_the_arguments_gradio_passes():
    names = list(inspect.signature(gr.Blocks.postprocess_data).parameters)
    assert names == list(inspect.signature(GuardedBlocks.postprocess_data).parameters)


def test_gradio_hands_its_state_holder_to_the_blocks_through_the_setter():
    blocks, _, _ = _page()
    holder = StateHolder()
    holder.set_blocks(blocks)            # what gradio.routes.App.create_app does once per launch
    assert blocks.state_holder is holder and type(holder) is LeanStateHolder
    assert type(holder["a-session"]) is LeanSessionState


def test_a_lean_session_keeps_every_attribute_gradio_gives_a_session():
    blocks, _, outputs = _page()
    plain, lean = SessionState(blocks), LeanSessionState(blocks)
    assert set(vars(plain)) == set(vars(lean))
    state = outputs[3]
    plain[state._id] = lean[state._id] = {"k": 1}
    assert lean[state._id] == plain[state._id] == {"k": 1}
    assert lean.config_values == {}
    # the two methods the lean state turns off are still the ones Gradio calls to fill config_values
    for name in ("_update_config", "_update_value_in_config"):
        assert callable(getattr(SessionState, name, None)), name


class _AddsWhenRead:
    """A cached file whose path, when the cleaner reads it, has a request add another file to the same set: the
    concurrent add of a live server, made deterministic."""

    def __init__(self, files: set, path: str) -> None:
        self.files, self.path = files, path

    def __fspath__(self) -> str:
        self.files.add(f"{self.path}-added-{time.monotonic_ns()}")
        return self.path


def _cleaner_walk(files: set) -> None:
    class Fake:
        blocks: dict = {}
        temp_file_sets = [files]
    route_utils.delete_files_created_by_app(Fake, age=10 ** 9)


def test_gradio_s_cache_cleaner_walks_the_live_sets():
    """The reason SnapshotSet exists: Gradio 6.31's cleaner iterates each set while requests add to it. When this
    test fails, Gradio walks a copy: drop SnapshotSet and guard_temp_files."""
    with tempfile.NamedTemporaryFile() as handle:
        files: set = set()
        files.update({_AddsWhenRead(files, handle.name), _AddsWhenRead(files, handle.name)})
        with pytest.raises(RuntimeError, match="changed size"):
            _cleaner_walk(files)


def test_snapshot_sets_survive_the_cleaner_and_are_the_sets_it_walks():
    with tempfile.NamedTemporaryFile() as handle:
        live = SnapshotSet()
        live.update({_AddsWhenRead(live, handle.name), _AddsWhenRead(live, handle.name)})
        _cleaner_walk(live)                 # walks a copy: the adds land in the live set, nothing raises
        assert len(live) == 4
    blocks, _, _ = _page()
    gradio_overrides.install(blocks)
    assert blocks.temp_file_sets and all(isinstance(s, SnapshotSet) for s in blocks.temp_file_sets)
    assert blocks.upload_file_set in blocks.temp_file_sets or isinstance(blocks.upload_file_set, SnapshotSet)
    assert "temp_file_sets" in inspect.getsource(route_utils.delete_files_created_by_app)


def _echo(x: str) -> str:
    return x


def test_the_queue_reads_a_function_s_validator_when_a_call_enters():
    assert "fn.validator" in inspect.getsource(queueing.Queue.push)
    with gr.Blocks():
        dep = gradio_overrides.api_endpoint(_echo, api_name="echo", validator=_echo)
        from gradio.context import get_blocks_context
        assert get_blocks_context().fns[dep["id"]].validator is not None


def test_gr_plot_passes_a_serialized_figure_through():
    figure = go.Figure(go.Bar(y=[1, 2]))
    once = gradio_overrides.plot_once(figure)
    assert gr.Plot().postprocess(once) is once
    assert gradio_overrides.plot_once("not a figure") == "not a figure"


def test_the_queue_guard_replaces_what_gradio_s_queue_has():
    params = list(inspect.signature(queueing.Queue.send_message).parameters)
    assert params == list(inspect.signature(queue_guard.GuardedQueue.send_message).parameters)
    init = inspect.getsource(queueing.Queue.__init__)
    assert "pending_messages_per_session" in init and "LRUCache" in init
    assert issubclass(queue_guard.SessionMessages, type(queueing.Queue.__init__.__globals__["LRUCache"](1)))


def test_every_override_says_why_it_stays():
    doc = gradio_overrides.__doc__ or ""
    for name in ("GuardedBlocks", "LeanSessionState", "SnapshotSet", "api_endpoint", "plot_once", "queue guard"):
        assert name in doc and "why it stays" in doc.lower(), name
    assert os.path.basename(__file__) in doc
