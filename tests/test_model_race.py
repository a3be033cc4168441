"""A race of two models (issue 37's side-by-side example): the same strategies on a target and on a second
model (``versus``), each checked and timed against its own greedy, every result naming its model.

The library part runs on tiny random models; the app's part on the bundled model and a test adapter
(``tests/adapters.py``), read from an operator presets file the way the shipped consistency-trained
preset will be read from ``presets/models.yaml``. The browser test is ``test_browser_model_race.py``.
"""

from __future__ import annotations

import os
import threading

import pytest

from decoding.harness.runner import lane_label, planned_lanes, run_comparison
from decoding.runtime.adapter import merge_adapter
from decoding.runtime.models import EXTRA_PRESETS, load_model, load_presets
from decoding.runtime.pair import ModelPair
from adapters import BASE, PRESET, write_adapter, write_presets
from tiny_models import prompt, tiny_causal
from web import requests as web_requests, validation
from web.loading import Prepared
from web.run_thread import stream_comparison
from web.live import Live

NO_GENERATION = [None] * len(validation.GENERATION_FIELDS)


def _prep(lm, name: str, max_new: int = 12) -> Prepared:
    return Prepared(ModelPair(lm), prompt(8, 1), max_new, 0, name, "")


# --------------------------------------------------------------------------- the library: two comparisons in one


def test_each_model_races_against_its_own_greedy_and_every_result_names_its_model():
    a, b = tiny_causal("llama", seed=0), tiny_causal("llama", seed=3)
    stop = threading.Event()
    items = list(stream_comparison(_prep(a, "model-a"), [("jacobi", {})], stop=stop,
                                           rivals=[_prep(b, "model-b")], poll_s=0.01, quiet_s=0.01))
    results = items[-1][1]
    assert [(r.strategy, r.model) for r in results] == [("greedy", "model-a"), ("jacobi", "model-a"),
                                                        ("greedy", "model-b"), ("jacobi", "model-b")]
    assert [r.label for r in results] == ["Greedy · model-a", "Jacobi · model-a", "Greedy · model-b",
                                          "Jacobi · model-b"]
    own = {m: run_comparison(p.prompt_ids, p.pair, [("greedy", {})], max_new_tokens=12)[0].token_ids
           for m, p in (("model-a", _prep(a, "a")), ("model-b", _prep(b, "b")))}
    assert own["model-a"] != own["model-b"]        # two models: each Jacobi must match its own greedy
    for r in results:
        assert r.token_ids == own[r.model]
        assert r.matches_greedy is (True if r.strategy == "jacobi" else None) or r.reference


def test_one_model_keeps_its_results_as_they_were():
    lm = tiny_causal("llama", seed=0)
    (ref, run), = [run_comparison(prompt(8, 1), ModelPair(lm), [("jacobi", {})], max_new_tokens=6)]
    assert ref.model is None and run.label == "Jacobi" and run.to_dict()["model"] is None


def test_the_second_models_lanes_wait_from_the_start_and_leave_when_it_plans_them():
    live = Live()
    later = planned_lanes([("jacobi", {})], "model-b")
    assert later == [("greedy", "Greedy · model-b"), ("jacobi", "Jacobi · model-b")]
    live.then(later)
    first = planned_lanes([("jacobi", {})], "model-a")
    live.plan(first, None)
    assert live.snapshot()["waiting"] == first + later
    live.plan(later, None)                         # the second comparison begins: its lanes are listed once
    assert live.snapshot()["waiting"] == later


def test_a_long_model_name_is_cut_in_the_label_and_a_hub_organisation_dropped():
    assert lane_label("Jacobi", "org/name") == "Jacobi · name"
    long = lane_label("Jacobi", "x" * 200)
    assert len(long) < 128 and long.endswith("…")


def test_a_stop_during_the_first_model_skips_the_second():
    a, b = tiny_causal("llama", seed=0), tiny_causal("llama", seed=3)
    stop = threading.Event()
    stop.set()
    results = list(stream_comparison(_prep(a, "model-a"), [("jacobi", {})], stop=stop,
                                             rivals=[_prep(b, "model-b")], poll_s=0.01))[-1][1]
    assert results and {r.model for r in results} == {"model-a"}


# --------------------------------------------------------------------------- requests: checks and keys


def _request(**changes):
    values = dict(model=BASE, assistant="none", strategies=["jacobi"], prompt="Name a river.", chat=True,
                  max_new_tokens=8, seed=0, params={}, generation=NO_GENERATION)
    values.update(changes)
    return web_requests.run_request(**values)


def test_versus_is_checked_like_the_target_and_named_in_every_message():
    with pytest.raises(ValueError, match="versus: 'no-such-model' is not one of the presets"):
        _request(versus="no-such-model")
    with pytest.raises(ValueError, match="versus: .* is the target model already"):
        _request(versus=BASE)
    with pytest.raises(ValueError, match=r"no prophet head is shipped for 'gemma-3-270m' \(the versus model\)"):
        _request(strategies=["prophet"], assistant="prophet", versus="gemma-3-270m")
    for none in (None, "", "none"):
        assert _request(versus=none).inputs.versus is None


def test_a_race_of_two_models_is_its_own_request_and_counts_both_models_work():
    one, two = _request(), _request(versus="gemma-3-270m")
    assert one.key != two.key and two.key == _request(versus="gemma-3-270m").key
    assert (one.strategies, two.strategies) == (2, 4) and two.units == 2 * one.units
    assert two.inputs.rival().model == "gemma-3-270m" and two.inputs.rival().versus is None
    assert one.inputs.rival() is None


def test_the_race_endpoint_builds_the_pages_request(monkeypatch):
    from web.requests import race_request
    page = _request(versus="gemma-3-270m", params={("jacobi", f): web_requests.ui_default("jacobi", f)
                                                   for s, f in validation.param_fields() if s == "jacobi"})
    api = race_request("Name a river.", ["jacobi"], BASE, "none", 8, 0, True, None, versus="gemma-3-270m")
    assert api.key == page.key


# --------------------------------------------------------------------------- presets and adapters


@pytest.fixture()
def test_presets(tmp_path, monkeypatch):
    config = load_model(BASE).model.config
    monkeypatch.setenv(EXTRA_PRESETS, str(write_presets(tmp_path, config)))
    return tmp_path


def test_an_operator_presets_file_adds_presets_with_adapters_beside_it(test_presets, monkeypatch):
    preset = load_presets()[PRESET]
    assert preset.base == BASE and preset.trained_for == "jacobi"
    assert preset.adapter == str(test_presets.resolve() / "test-cllm.safetensors")
    assert preset.hub_id == load_presets()[BASE].hub_id          # the base's weights, inherited
    monkeypatch.setenv(EXTRA_PRESETS, str(test_presets / "missing.yaml"))
    with pytest.raises(ValueError, match="DECODING_PLAYGROUND_PRESETS=.*not a readable presets file"):
        load_presets()
    monkeypatch.delenv(EXTRA_PRESETS)
    assert PRESET not in load_presets()


def test_an_adapter_without_layers_is_refused_not_merged_as_nothing(tmp_path):
    from safetensors.torch import save_file
    save_file({}, str(tmp_path / "empty.safetensors"), metadata={"scale": "1.0"})
    with pytest.raises(ValueError, match="holds no layer"):
        merge_adapter(tiny_causal("llama").model, tmp_path / "empty.safetensors")


def test_the_test_adapter_names_real_layers_of_the_bundled_model(tmp_path):
    from transformers import AutoModelForCausalLM
    config = load_model(BASE).model.config
    model = AutoModelForCausalLM.from_config(config)
    meta = merge_adapter(model, write_adapter(config, tmp_path / "a.safetensors"))
    assert meta["base"] == BASE


def test_the_page_offers_the_race_only_for_a_trained_preset(test_presets, monkeypatch):
    import app
    from web.page_model_races import ModelRace, model_races
    races = model_races(load_presets())
    assert races == [ModelRace(BASE, PRESET, "jacobi", (("block_size", 8),))]
    assert races[0].title == f"Example: Jacobi on {BASE} vs Jacobi on {PRESET} (consistency-trained)"
    demo = app.build_demo()
    buttons = [b for b in demo.blocks.values() if getattr(b, "value", None) == races[0].title]
    assert len(buttons) == 1
    monkeypatch.delenv(EXTRA_PRESETS)
    assert model_races(load_presets()) == []
    demo = app.build_demo()
    assert not [b for b in demo.blocks.values() if str(getattr(b, "value", "")).startswith("Example: ")]


def test_a_trained_preset_with_parameters_its_strategy_refuses_gets_no_example(tmp_path, monkeypatch, capsys):
    from web.page_model_races import model_races
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  bad:\n    base: {BASE}\n    trained_for: jacobi\n    trained_params: "
                    f"{{block_size: 999}}\n  unknown:\n    base: {BASE}\n    trained_for: no-such-strategy\n"
                    f"  listed:\n    base: {BASE}\n    trained_for: jacobi\n    trained_params: [1, 2]\n",
                    encoding="utf-8")
    monkeypatch.setenv(EXTRA_PRESETS, str(path))
    assert model_races(load_presets()) == []
    assert "preset bad: trained_params for jacobi ignored (block_size must be in [0, 64]" in capsys.readouterr().out


def test_the_app_races_the_base_model_against_the_trained_one(test_presets):
    """compute_run end to end on the bundled model and the test adapter: four lanes, each model's Jacobi equal
    to its own greedy, the adapter really on (the trained preset's greedy is not the base model's), the
    document importable with its models, and the Jacobi view drawing both side by side."""
    from visualize.page import step_html
    from visualize.traces import export_trace, import_trace_file
    from web.compute import compute_run
    req = _request(max_new_tokens=16, versus=PRESET)
    items = list(compute_run(threading.Event(), req))
    lanes = [item[1]["waiting"] for item in items if item[0] == "live"]
    assert any(("jacobi", f"Jacobi · {PRESET}") in waiting for waiting in lanes[:1] + lanes)
    _, doc, message, _ = items[-1]
    assert message == f"Ran 4 strategies on {BASE} and {PRESET}."
    rows = doc["results"]
    assert [(r["strategy"], r["model"]) for r in rows] == [("greedy", BASE), ("jacobi", BASE),
                                                           ("greedy", PRESET), ("jacobi", PRESET)]
    assert rows[1]["matches_greedy"] is True and rows[3]["matches_greedy"] is True
    assert rows[1]["token_ids"] == rows[0]["token_ids"] and rows[3]["token_ids"] == rows[2]["token_ids"]
    assert rows[0]["token_ids"] != rows[2]["token_ids"]          # the adapter is merged: another model
    path = test_presets / "trace.json"
    path.write_text(export_trace(doc), encoding="utf-8")
    back = import_trace_file(str(path))
    assert [r["model"] for r in back["results"]] == [BASE, BASE, PRESET, PRESET]
    view = step_html(back, None)["jacobi"]
    assert view.count("class='dp-jc-panel'") == 2
    assert view.index(f"Jacobi · {BASE}<") < view.index(f"Jacobi · {PRESET}<")


def test_the_jacobi_view_draws_a_bounded_number_of_panels_and_rows(monkeypatch):
    """An imported trace may hold many Jacobi results: at most MAX_JACOBI_PANELS are drawn, sharing
    MAX_JACOBI_ROWS iterations."""
    from visualize import page
    lm = tiny_causal("llama", seed=0)
    ref, run = run_comparison(prompt(8, 1), ModelPair(lm), [("jacobi", {"block_size": 2})], max_new_tokens=12)
    row = run.to_dict()
    doc = {"results": [dict(row, label=f"Jacobi {i}") for i in range(7)]}
    monkeypatch.setattr(page, "MAX_JACOBI_ROWS", 8)
    view = page.step_html(doc, None, columns=False)["jacobi"]
    assert view.count("class='dp-jc-panel'") == page.MAX_JACOBI_PANELS == 4
    assert "Jacobi 3<" in view and "Jacobi 4<" not in view
    iterations = sum(e["type"] == "JacobiIteration" for e in row["events"])
    assert iterations > 2 and view.count(f"The first 2 of {iterations} Jacobi iterations are drawn.") == 4


def test_the_cli_races_two_models_and_refuses_the_target_as_its_own_rival(test_presets, tmp_path, capsys):
    import json
    from playground import cli
    out = tmp_path / "race.json"
    rc = cli.main(["run", "--prompt", "Name a river.", "--strategy", "jacobi", "--versus", PRESET,
                   "--max-new-tokens", "6", "--quiet", "--no-warmup", "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:2] == ["model", "strategy"] and PRESET in table
    rows = json.loads(out.read_text())["results"]
    assert [(r["strategy"], r["model"], r["matches_greedy"]) for r in rows] == [
        ("greedy", BASE, True), ("jacobi", BASE, True), ("greedy", PRESET, True), ("jacobi", PRESET, True)]
    assert cli.main(["run", "--prompt", "x", "--versus", BASE, "--quiet"]) == 2
    assert "--versus: 'smollm2-135m-instruct' is the target model already" in capsys.readouterr().err


def test_the_inspector_tells_the_two_models_drafting_runs_apart():
    """Both models' speculative runs are offered by lane (strategy · model), and each lane shows its own run."""
    from visualize.page import drafted, inspector_view, lane, step_figures
    a, b = tiny_causal("llama", seed=0), tiny_causal("llama", seed=3)
    prep = [Prepared(ModelPair(lm, lm), prompt(8, 1), 12, 0, name, "") for lm, name in ((a, "m-a"), (b, "m-b"))]
    results = list(stream_comparison(prep[0], [("speculative", {})], stop=threading.Event(),
                                             rivals=prep[1:], poll_s=0.01))[-1][1]
    doc = {"results": [r.to_dict() for r in results]}
    assert drafted(doc) == ["speculative · m-a", "speculative · m-b"]
    assert lane({"strategy": "speculative"}) == "speculative"             # one model: the strategy, as before
    shown = {}
    for name, row in zip(drafted(doc), doc["results"][1::2]):
        shown[name] = inspector_view(doc, name, 3)
        assert shown[name] is not None and shown[name] == inspector_view({"results": [row]}, lane(row), 3)
        assert step_figures(doc, None, name)["tree"] == step_figures({"results": [row]}, None, lane(row))["tree"]
    assert shown["speculative · m-a"] != shown["speculative · m-b"]     # two models: two different runs shown
    assert inspector_view(doc, "speculative", 3) is None                  # a bare strategy names no lane here
