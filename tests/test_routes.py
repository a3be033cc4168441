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
from decoding.runtime.routes import WIDTH, Config, candidates, choose, decide, versions

BASE = "base"


def _presets(bf16_loads: bool = True) -> dict:
    return {BASE: ModelPreset(BASE, "org/base", network=False),
            "base-fp16w": ModelPreset("base-fp16w", "org/base", network=False, base=BASE, weights="fp16"),
            "base-bf16w": ModelPreset("base-bf16w", "org/base", network=False, base=BASE, weights="bf16"),
            "base-lora": ModelPreset("base-lora", "org/base", network=False, base=BASE, adapter="x.safetensors"),
            "other": ModelPreset("other", "org/other")}


E, C = (lambda name: Config(name)), (lambda name: Config(name, True))


def test_candidates_are_each_loadable_version_eager_and_where_it_compiles_compiled(monkeypatch):
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": preset.weights != "bf16")
    assert versions(BASE, _presets()) == [BASE, "base-fp16w"]          # no adapter preset, no other model
    assert candidates(BASE, _presets()) == [E(BASE), E("base-fp16w")]
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    assert candidates(BASE, _presets(), can_compile=True) == [
        E(BASE), E("base-fp16w"), E("base-bf16w"), C(BASE), C("base-fp16w"), C("base-bf16w")]
    monkeypatch.setattr(routes, "COMPILED_WEIGHTS", ("full", "bf16"))      # a weight kind that cannot compile
    assert C("base-fp16w") not in candidates(BASE, _presets(), can_compile=True)
    assert candidates(BASE, _presets(), device="cuda", can_compile=True) == [E(BASE)]
    assert candidates("unknown", _presets()) == [E("unknown")]
    assert Config.parse(C(BASE).key) == C(BASE) and Config.parse(E(BASE).key) == E(BASE)


def test_the_cheapest_race_step_wins_and_the_wide_forward_counts():
    costs = {E(BASE): {1: 39.0, WIDTH: 66.0}, E("base-fp16w"): {1: 36.0, WIDTH: 54.0},
             E("base-bf16w"): {1: 41.0, WIDTH: 46.0}}
    assert decide(costs, E(BASE)) == E("base-bf16w")    # dearer one-position forward, much cheaper wide one
    costs[E("base-bf16w")] = {1: 41.0, WIDTH: 60.0}
    assert decide(costs, E(BASE)) == E("base-fp16w")
    near = {E(BASE): {1: 40.0, WIDTH: 60.0}, E("base-fp16w"): {1: 39.0, WIDTH: 58.0}}
    assert decide(near, E(BASE)) == E(BASE)             # 3 % cheaper: within the noise, the base stays
    dear = {E(BASE): {1: 20.0, WIDTH: 25.0}, C(BASE): {1: 30.0, WIDTH: 31.0}}
    assert decide(dear, E(BASE)) == E(BASE)             # compiled but dearer: eager serves


def test_the_served_config_is_the_fastest_measured_whatever_its_mode(tmp_path, monkeypatch):
    """Injected race steps: whichever config measures cheapest serves, eager or compiled, float32 or reduced
    weights (a ranking by a bare forward, or "compiled always wins", fails one of these)."""
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    for winner in (E("base-fp16w"), C(BASE), C("base-bf16w"), E(BASE)):
        table = {c: {1: 80.0, WIDTH: 120.0} for c in candidates(BASE, _presets(), can_compile=True)}
        table[winner] = {1: 40.0, WIDTH: 60.0}
        got = choose(BASE, _presets(), measure=table.__getitem__, can_compile=True)
        assert got.config == winner and got.target == winner.preset, winner
        assert winner.label in got.reason and got.reason.index(winner.label) < got.reason.index(" 80 + 120")


def test_the_decision_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    timed = []
    table = {E(BASE): {1: 39.0, WIDTH: 66.0}, E("base-fp16w"): {1: 37.0, WIDTH: 55.0},
             E("base-bf16w"): {1: 41.0, WIDTH: 46.0}}

    def measure(config: Config) -> dict:
        timed.append(config)
        return table[config]
    file = tmp_path / "routes.json"
    said = []
    first = choose(BASE, _presets(), measure=measure, file=file, progress=said.append)
    assert first.target == "base-bf16w" and first.source == "measured" and sorted(timed) == sorted(table)
    assert said and "base-bf16w" in first.reason and "46" in first.reason
    assert json.loads(file.read_text())["entries"][0]["config"] == E("base-bf16w").key
    again = choose(BASE, _presets(), measure=measure, file=file)
    assert again.target == "base-bf16w" and again.source == "cache" and len(timed) == 3
    assert choose(BASE, _presets(), measure=measure, file=file, remeasure=True).source == "measured"
    assert len(timed) == 6
    # another set of candidates (the bfloat16 sibling no longer loads): a new key, measured again
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": preset.weights != "bf16")
    other = choose(BASE, _presets(), measure=measure, file=file)
    assert other.source == "measured" and other.target == "base-fp16w" and len(timed) == 8


def test_a_cached_choice_is_not_reused_when_only_threads_or_torch_differ(tmp_path, monkeypatch):
    """The cache key names the threads and the torch version: a decision timed on 2 threads, or under another
    torch, is timed again (a key without them would serve the other machine's choice)."""
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    file, timed = tmp_path / "routes.json", []
    table = {E(BASE): {1: 39.0, WIDTH: 66.0}, E("base-fp16w"): {1: 20.0, WIDTH: 30.0},
             E("base-bf16w"): {1: 41.0, WIDTH: 46.0}}

    def measure(config: Config) -> dict:
        timed.append(config)
        return table[config]
    assert choose(BASE, _presets(), measure=measure, file=file).source == "measured"
    assert choose(BASE, _presets(), measure=measure, file=file).source == "cache"
    monkeypatch.setattr(routes.torch, "get_num_threads", lambda: 97)
    assert choose(BASE, _presets(), measure=measure, file=file).source == "measured"
    monkeypatch.undo()
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    monkeypatch.setattr(routes.torch, "__version__", "0.0.1-other")
    assert choose(BASE, _presets(), measure=measure, file=file).source == "measured"
    monkeypatch.setattr(routes, "cpu_fingerprint", lambda: "capped-at-avx2")
    assert choose(BASE, _presets(), measure=measure, file=file).source == "measured"
    assert len(timed) == 12


def test_a_base_without_siblings_is_not_timed():
    def measure(config: Config) -> dict:
        raise AssertionError("nothing to choose between")
    only = choose("other", _presets(), measure=measure)
    assert only.target == "other" and only.source == "only-one" and "only way" in only.reason


def test_the_page_shows_the_chosen_version_and_says_why(tmp_path, monkeypatch):
    """The note under the picker is escaped, and the picker shows the chosen target."""
    import app
    from web.requests import default_request
    from web.settings import Settings
    cheapest = "smollm2-135m-instruct-fp16w"
    assert default_request("Hi", Settings(target=cheapest)).inputs.model == cheapest
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
