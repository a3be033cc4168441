"""The page's run called by name (web/page_client.py), checked against the live server's own API description.

The helper builds /run's positional values from web/page_names.py and reads its outputs as named views. Here the
server's description of /run (``/gradio_api/info?all_endpoints=true``: /run is off the API page, so
``Client.view_api`` leaves it out) must list, in order, exactly the components the page wired under those names:
an input or a view moved, added or dropped, or a gr.State missing from ``STATE_VIEWS``, fails here instead of
silently shifting every value after it.
"""

from __future__ import annotations

import json
import urllib.request

import gradio as gr
import pytest

from web.page_client import PageViews, run_values
from web.page_names import RUN_VIEWS, STATE_VIEWS, api_views, generation_input, param_input, run_inputs


def _label(component) -> str:
    """How Gradio's API description names a component: its label, else ``value_<id>``."""
    return component.label or f"value_{component._id}"


@pytest.fixture(scope="module")
def described(served):
    demo, url = served
    with urllib.request.urlopen(url + "gradio_api/info?all_endpoints=true", timeout=60) as resp:
        return demo, json.load(resp)["named_endpoints"]


def test_run_inputs_are_the_components_the_api_describes_in_order(described):
    demo, endpoints = described
    params = endpoints["/run"]["parameters"]
    assert [p["label"] for p in params] == [_label(demo.inputs[name]) for name in run_inputs()]
    assert len({p["label"] for p in params[:7]}) == 7          # the first seven are told apart by their labels


def test_run_and_import_views_are_the_components_the_api_describes_in_order(described):
    demo, endpoints = described
    expected = [_label(demo.ui[name]) for name in api_views()]
    for api in ("/run", "/import_trace"):
        assert [r["label"] for r in endpoints[api]["returns"]] == expected, api
    assert all(isinstance(demo.ui[name], gr.State) for name in STATE_VIEWS)
    assert not any(isinstance(demo.ui[name], gr.State) for name in api_views())


def test_the_served_run_event_outputs_every_view_by_name(described):
    demo, _ = described
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    assert [c._id for c in run.outputs] == [demo.ui[name]._id for name in RUN_VIEWS]


def test_run_values_puts_each_value_under_its_name():
    order = run_inputs()
    values = run_values(model="m", prompt="p", strategies=["beam"], seed=5, max_new_tokens=7, versus="v",
                        params={("beam", "num_beams"): 3}, generation={"repetition_penalty": 1.5})
    named = dict(zip(order, values))
    assert len(values) == len(order)
    assert (named["model"], named["prompt"], named["strategies"], named["seed"], named["max_new_tokens"],
            named["versus"]) == ("m", "p", ["beam"], 5, 7, "v")
    assert named[param_input("beam", "num_beams")] == 3 and named[generation_input("repetition_penalty")] == 1.5
    assert sum(v is not None for v in values) == 10            # model..seed, versus, one param, one setting
    page = dict(zip(order, run_values(model="m", prompt="p", strategies=[], page_defaults=True)))
    assert page[param_input("beam", "num_beams")] is not None


def test_an_unknown_input_or_a_short_output_is_refused_by_name():
    with pytest.raises(ValueError, match="not an input of the page's run.*'nope'"):
        run_values(model="m", prompt="p", strategies=[], params={("beam", "nope"): 1})
    with pytest.raises(ValueError, match="not an input of the page's run.*'temp'"):
        run_values(model="m", prompt="p", strategies=[], generation={"temp": 1})
    with pytest.raises(ValueError, match=f"expected the page's {len(api_views())} views"):
        PageViews.of(tuple(range(len(api_views()) - 1)))
    views = PageViews.of(tuple(range(len(api_views()))))
    assert views.status == api_views().index("status") and views.race_id == len(api_views()) - 1
