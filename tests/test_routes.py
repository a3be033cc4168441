"""The default target's version chosen by measurement (decoding/runtime/routes.py).

What would break it: choosing the dearer version (an inverted comparison), ignoring the wide forward (the
reason the bfloat16 sibling exists), replacing the base preset for a gain within the noise, timing again at
every start (the cache not read), reading a decision taken for other candidates, or offering a sibling that
cannot load here.
"""

from __future__ import annotations

import json

from decoding.runtime import routes
from decoding.runtime.models import ModelPreset
from decoding.runtime.routes import WIDTH, candidates, choose, decide

BASE = "base"


def _presets(bf16_loads: bool = True) -> dict:
    return {BASE: ModelPreset(BASE, "org/base", network=False),
            "base-fp16w": ModelPreset("base-fp16w", "org/base", network=False, base=BASE, weights="fp16"),
            "base-bf16w": ModelPreset("base-bf16w", "org/base", network=False, base=BASE, weights="bf16"),
            "base-lora": ModelPreset("base-lora", "org/base", network=False, base=BASE, adapter="x.safetensors"),
            "other": ModelPreset("other", "org/other")}


def test_candidates_are_the_base_and_its_reduced_weight_siblings_that_load_here(monkeypatch):
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": preset.weights != "bf16")
    assert candidates(BASE, _presets()) == [BASE, "base-fp16w"]          # no adapter preset, no other model
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    assert candidates(BASE, _presets()) == [BASE, "base-fp16w", "base-bf16w"]
    assert candidates(BASE, _presets(), device="cuda") == [BASE]
    assert candidates("unknown", _presets()) == ["unknown"]


def test_the_cheapest_race_step_wins_and_the_wide_forward_counts():
    costs = {BASE: {1: 39.0, WIDTH: 66.0}, "base-fp16w": {1: 36.0, WIDTH: 54.0}, "base-bf16w": {1: 41.0, WIDTH: 46.0}}
    assert decide(costs, BASE) == "base-bf16w"          # dearer one-position forward, much cheaper wide one
    costs["base-bf16w"] = {1: 41.0, WIDTH: 60.0}
    assert decide(costs, BASE) == "base-fp16w"
    near = {BASE: {1: 40.0, WIDTH: 60.0}, "base-fp16w": {1: 39.0, WIDTH: 58.0}}
    assert decide(near, BASE) == BASE                   # 3 % cheaper: within the noise, the base stays
    dear = {BASE: {1: 20.0, WIDTH: 25.0}, "base-bf16w": {1: 30.0, WIDTH: 31.0}}
    assert decide(dear, BASE) == BASE


def test_the_decision_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    timed = []
    table = {BASE: {1: 39.0, WIDTH: 66.0}, "base-fp16w": {1: 37.0, WIDTH: 55.0}, "base-bf16w": {1: 41.0, WIDTH: 46.0}}

    def measure(name: str) -> dict:
        timed.append(name)
        return table[name]
    file = tmp_path / "routes.json"
    said = []
    first = choose(BASE, _presets(), measure=measure, file=file, progress=said.append)
    assert first.target == "base-bf16w" and first.source == "measured" and sorted(timed) == sorted(table)
    assert said and "base-bf16w" in first.reason and "46" in first.reason
    assert json.loads(file.read_text())["entries"][0]["target"] == "base-bf16w"
    again = choose(BASE, _presets(), measure=measure, file=file)
    assert again.target == "base-bf16w" and again.source == "cache" and len(timed) == 3
    assert choose(BASE, _presets(), measure=measure, file=file, remeasure=True).source == "measured"
    assert len(timed) == 6
    # another set of candidates (the bfloat16 sibling no longer loads): a new key, measured again
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": preset.weights != "bf16")
    other = choose(BASE, _presets(), measure=measure, file=file)
    assert other.source == "measured" and other.target == "base-fp16w" and len(timed) == 8


def test_a_base_without_siblings_is_not_timed():
    def measure(name: str) -> dict:
        raise AssertionError("nothing to choose between")
    only = choose("other", _presets(), measure=measure)
    assert only.target == "other" and only.source == "only-one" and "only version" in only.reason


def test_the_app_starts_on_the_chosen_version_and_says_why(tmp_path, monkeypatch):
    """``chosen_target`` (what ``app.main`` calls before building the page): the measured choice becomes the
    page's default target, the default request's model and the note under the picker (escaped)."""
    import app
    from web import service
    from web.service import Settings, chosen_target, default_request
    names = routes.candidates("smollm2-135m-instruct", service.load_presets())
    cheapest = names[-1]
    table = {name: {1: 40.0, WIDTH: 70.0} for name in names}
    table[cheapest] = {1: 40.0, WIDTH: 45.0}
    cleared = []
    monkeypatch.setattr(service, "clear_model_cache", lambda: cleared.append(True))
    settings = chosen_target(Settings(), measure=table.__getitem__, file=tmp_path / "routes.json")
    assert settings.target == cheapest and settings.default_target() == cheapest
    assert (cleared == [True]) == (len(names) > 1)         # the candidates timed are not kept loaded
    assert settings.target_note and (len(names) == 1 or "45" in settings.target_note)
    assert default_request("Hi", settings).inputs.model == cheapest
    assert Settings().default_target() == "smollm2-135m-instruct"          # no choice made: the presets' default
    shown = Settings(target=cheapest, target_note="<b>AMX</b> & co")
    demo = app.build_demo(shown)
    values = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    note = values["target-note"].value
    assert "<b>" not in note and "&lt;b&gt;AMX&lt;/b&gt;" in note
    pickers = [b for b in demo.blocks.values() if getattr(b, "label", None) == "Target model"]
    assert pickers and pickers[0].value == cheapest


def test_the_app_refuses_an_unknown_target_by_name():
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "app.py", "--target", "no-such-model", "--port", "0"], cwd=root,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "--target" in proc.stderr and "no-such-model" in proc.stderr
