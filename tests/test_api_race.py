"""The API for code (issue 38): ``/race`` through ``gradio_client``, against a real server on loopback.

It takes a few named parameters, checks them as the page's Run does (a bad value gets a message naming the
parameter), goes through the same line, shared runs and recordings, and returns the CLI's ``--json`` document.
The page's own events are off the API page: no endpoint there has a ``param_N`` parameter.
"""

from __future__ import annotations

import json
import re

import pytest

from web.page_client import page_run
from web.requests import DEFAULT_MAX_NEW

BUNDLED = "smollm2-135m-instruct"
RACE_PARAMETERS = ["prompt", "strategies", "target", "assistant", "max_new_tokens", "seed", "chat", "params",
                   "versus", "generation"]


def _cli_keys(tmp_path) -> tuple[list, set]:
    """The top-level keys and a result's keys of the document ``python -m playground run --json`` writes."""
    from playground import cli
    out = tmp_path / "cli.json"
    assert cli.main(["run", "--target", BUNDLED, "--strategy", "greedy", "--prompt", "Hi.", "--max-new-tokens", "2",
                     "--no-warmup", "--quiet", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    return list(doc), set(doc["results"][0])


def test_race_with_prompt_and_strategies_alone_returns_the_cli_document(client, tmp_path):
    doc = client.predict(prompt="Count from one to twenty, separated by commas.",
                         strategies=["prompt_lookup", "lookahead"], api_name="/race")
    rows = {r["strategy"]: r for r in doc["results"]}
    assert list(rows) == ["greedy", "prompt_lookup", "lookahead"]          # greedy added as the reference
    assert rows["greedy"]["reference"] and all(r["error"] is None for r in rows.values())
    greedy = rows["greedy"]["token_ids"]
    assert len(greedy) == DEFAULT_MAX_NEW or rows["greedy"]["stop_reason"] == "eos"   # the page's default
    for name in ("prompt_lookup", "lookahead"):                           # lossless: greedy's ids exactly
        assert rows[name]["lossless"] and rows[name]["token_ids"] == greedy and rows[name]["matches_greedy"]
        assert rows[name]["wall_s"] > 0 and rows[name]["text"] and "stats" in rows[name]
    assert doc["chat"] is True and doc["environment"]["seed"] == 0 and doc["prompt_ids"]
    keys, result_keys = _cli_keys(tmp_path)
    assert list(doc) == keys and set(rows["greedy"]) == result_keys       # the CLI's document, key for key


def test_race_takes_every_named_parameter(client, tiny_model):
    """On the tiny preset (tests/tiny_preset.py), as the tests of /race's handling below: the parameters are the
    subject, not the model's text."""
    doc = client.predict(prompt="Name a colour.", strategies=["greedy", "lookahead"], target=tiny_model,
                         assistant="none", max_new_tokens=5, seed=3, chat=False,
                         params={"lookahead": {"window": 3, "ngram": 4}}, api_name="/race")
    assert doc["prompt"] == "Name a colour." and doc["chat"] is False and doc["max_new_tokens"] == 5
    assert doc["environment"]["seed"] == 3 and doc["generation"]["repetition_penalty"] == 1.0
    lookahead = doc["results"][1]
    assert lookahead["params"]["window"] == 3 and lookahead["params"]["ngram"] == 4
    assert lookahead["token_ids"] == doc["results"][0]["token_ids"] and len(lookahead["token_ids"]) <= 5


def test_race_takes_the_five_generation_settings_the_cli_takes(client, tiny_model):
    settings = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "min_new_tokens": 3, "forced_bos_token_id": -1,
                "forced_eos_token_id": -1}
    doc = client.predict(prompt="Say yes yes yes yes.", strategies=["greedy", "prompt_lookup"], max_new_tokens=8,
                         target=tiny_model, generation=settings, api_name="/race")
    assert doc["generation"] == settings                                   # applied, and written as the CLI does
    greedy, lookup = doc["results"]
    assert lookup["token_ids"] == greedy["token_ids"]                      # lossless under the same processors
    plain = client.predict(prompt="Say yes yes yes yes.", strategies=["greedy"], max_new_tokens=8, target=tiny_model,
                           api_name="/race")
    assert plain["generation"]["repetition_penalty"] == 1.0
    ids = greedy["token_ids"]
    assert not any(ids[i:i + 2] == ids[j:j + 2] for i in range(len(ids) - 1) for j in range(i + 1, len(ids) - 1))


def test_a_race_and_the_pages_run_of_the_same_request_share_one_recording(client):
    prompt = "Name one planet."
    doc = client.predict(prompt=prompt, strategies=["greedy"], max_new_tokens=4, api_name="/race")
    out = page_run(client, model=BUNDLED, strategies=["greedy"], prompt=prompt, max_new_tokens=4, seed=0,
                   page_defaults=True)                                       # what the page sends untouched
    assert out.status.startswith("Replay of a recorded run")                # the API's run, recorded and shared
    assert out.document()["results"][0]["token_ids"] == doc["results"][0]["token_ids"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_new_tokens=0), "max_new_tokens must be in [1, 512]"),
    (dict(max_new_tokens=100000), "max_new_tokens must be in [1, 512]"),
    (dict(strategies=["nope"]), "strategies: unknown strategy 'nope'"),
    (dict(strategies="greedy"), "strategies must be a list of strategy names"),
    (dict(strategies=[]), "strategies: pick at least one"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(prompt=""), "prompt must not be empty"),
    (dict(chat="yes"), "chat must be true or false"),
    (dict(target="someone/some-model"), "target: 'someone/some-model' is not one of the presets"),
    (dict(assistant="someone/draft", strategies=["speculative"]), "assistant: 'someone/draft' is not one of"),
    (dict(strategies=["beam"], params={"beam": {"num_beams": 0}}), "params.beam: num_beams must be in [1, 16]"),
    (dict(strategies=["beam"], params={"beam": {"bogus": 1}}), "params.beam: unknown parameter 'bogus'"),
    (dict(params={"beam": {"num_beams": 2}}), "params: 'beam' is not one of the strategies asked for"),
    (dict(params={"nope": {}}), "params: unknown strategy 'nope'"),
    (dict(params=[1, 2]), "params must be a mapping of strategy name"),
    (dict(strategies=["prophet"], params={"prophet": {"tree_nodes": -1}}), "params.prophet: tree_nodes must be"),
    (dict(versus=BUNDLED), f"versus: '{BUNDLED}' is the target model already"),
    (dict(versus="someone/other"), "versus: 'someone/other' is not one of the presets"),
    (dict(versus="gemma-3-270m", strategies=["prophet"]),
     "no prophet head is shipped for 'gemma-3-270m' (the versus model)"),
    (dict(generation={"repetition_penalty": 0}), "generation settings: repetition_penalty must be in (0, 10]"),
    (dict(generation={"no_repeat_ngram_size": 2.5}), "generation settings: no_repeat_ngram_size must be"),
    (dict(generation={"min_new_tokens": "3"}), "generation.min_new_tokens must be a number, got '3'"),
    (dict(generation={"temperature": 1}), "generation: unknown setting 'temperature'"),
])
def test_a_bad_value_gets_an_error_naming_the_parameter(client, kwargs, message):
    call = dict(prompt="Hi.", strategies=["greedy"], max_new_tokens=2)
    call.update(kwargs)
    with pytest.raises(Exception) as err:
        client.predict(**call, api_name="/race")
    assert message in str(err.value)


def test_the_api_page_shows_race_with_named_parameters_and_nothing_positional(client):
    info = client.view_api(return_format="dict", print_info=False)
    endpoints = {**info["named_endpoints"], **info["unnamed_endpoints"]}
    names = {name: [p["parameter_name"] for p in e["parameters"]] for name, e in endpoints.items()}
    assert not [(e, p) for e, ps in names.items() for p in ps if re.fullmatch(r"param_\d+", p)], names
    assert names == {"/race": RACE_PARAMETERS,                  # the page's own events are off the API page
                     "/export_race": ["race_id", "format", "mode"]}
    race = {p["parameter_name"]: p for p in endpoints["/race"]["parameters"]}
    assert [n for n, p in race.items() if not p["parameter_has_default"]] == ["prompt", "strategies"]
    # no fixed default target: a call without one races the version this machine serves (chosen at start)
    assert race["target"]["parameter_has_default"] and race["target"]["parameter_default"] is None
    assert race["max_new_tokens"]["parameter_default"] == DEFAULT_MAX_NEW
