"""Edges of the API a hostile probe found (issue 48 item 10): each is a refusal by name, never Gradio's generic
"upstream app raised an exception"."""

from __future__ import annotations


import pytest

from visualize.animation import check_mode
from web.requests import generation_values, param_values, race_request


@pytest.mark.parametrize("mode", [["time"], {"time": 1}, None, 3, "frames"])
def test_an_export_mode_that_is_not_one_of_the_two_names_is_refused_by_name(mode):
    with pytest.raises(ValueError, match="mode must be one of 'time', 'steps'"):
        check_mode(mode)
    assert check_mode("time") == "time" and check_mode("steps") == "steps"


@pytest.mark.parametrize("params, message", [
    ({"prophet": {"tree_nodes": "8"}}, r"params\.prophet\.tree_nodes must be a number, got '8'"),
    ({"prophet": {"fast": "yes"}}, r"params\.prophet\.fast must be true or false, got 'yes'"),
    ({"prophet": {"fast": 1}}, r"params\.prophet\.fast must be true or false"),
    ({"prophet": {"tree_nodes": True}}, r"params\.prophet\.tree_nodes must be a number"),
])
def test_race_refuses_text_where_a_number_or_a_boolean_belongs(params, message):
    with pytest.raises(ValueError, match=message):
        param_values(["prophet"], params)


def test_race_takes_typed_numbers_and_booleans():
    values = param_values(["prophet"], {"prophet": {"tree_nodes": 8, "fast": True}})
    assert values[("prophet", "tree_nodes")] == 8 and values[("prophet", "fast")] is True


def test_race_without_a_target_races_the_version_the_start_chose():
    """``/race``'s target defaults to what ``app.settings`` serves when the call is made (web/startup.py chooses it
    after the page is up), not to the default the endpoint had when it was built."""
    from web.requests import race_request
    from web.settings import Settings
    chosen = Settings(target="smollm2-135m-instruct-fp16w")
    req = race_request("Hi", ["greedy"], None, None, 8, 0, True, None, settings=chosen)
    assert req.inputs.model == "smollm2-135m-instruct-fp16w"
    assert race_request("Hi", ["greedy"], None, None, 8, 0, True, None).inputs.model == "smollm2-135m-instruct"


@pytest.mark.parametrize("generation, message", [
    ({"repetition_penalty": "1.2"}, r"generation\.repetition_penalty must be a number, got '1\.2'"),
    ({"min_new_tokens": True}, r"generation\.min_new_tokens must be a number"),
    ({"top_k": 5}, r"generation: unknown setting 'top_k'; the settings: repetition_penalty, "),
    ([1.2], r"generation must be a mapping of setting to value"),
])
def test_race_refuses_generation_settings_by_name(generation, message):
    with pytest.raises(ValueError, match=message):
        generation_values(generation)


def test_race_applies_the_generation_settings_and_keys_the_request_by_them():
    plain = race_request("Hi", ["greedy"], None, None, 8, 0, True, None)
    given = race_request("Hi", ["greedy"], None, None, 8, 0, True, None,
                         generation={"repetition_penalty": 1.5, "no_repeat_ngram_size": 3.0})
    assert given.generation.repetition_penalty == 1.5 and given.generation.no_repeat_ngram_size == 3
    assert not plain.generation.active and given.key != plain.key      # never served the other's recording
    with pytest.raises(ValueError, match=r"generation settings: min_new_tokens must be in \[0, 1024\]"):
        race_request("Hi", ["greedy"], None, None, 8, 0, True, None, generation={"min_new_tokens": 5000})

