"""The app through gradio_client against a real server on loopback."""

from __future__ import annotations

import json
import re

import pytest

import app

BUNDLED = "smollm2-135m-instruct"


def run(client, strategies, prompt="Say hi in five words.", max_new=12, seed=0, model=BUNDLED,
        assistant="none", params=None, chat=True):
    values = [None] * len(app.param_fields())
    for (s, f), v in (params or {}).items():
        values[app.param_fields().index((s, f))] = v
    out = client.predict(model, assistant, strategies, prompt, chat, max_new, seed, *values, api_name="/run")
    # API outputs (gr.State stays in the session): step, columns, speed, timeline, sources, trace, status
    step, columns, trace, status = out[0], out[1], out[5], out[6]
    html = columns if isinstance(columns, str) else columns.get("value", "")
    with open(trace, encoding="utf-8") as fh:
        doc = json.load(fh)
    return {"doc": doc, "html": html, "trace": trace, "status": status, "step": step}


def test_real_run_side_by_side(client):
    out = run(client, ["greedy", "sample", "beam"], params={("beam", "num_beams"): 3})
    doc = out["doc"]
    assert out["status"].startswith("Ran 3 strategies")
    assert doc["format"] == "decoding-playground-trace"
    assert [r["strategy"] for r in doc["results"]] == ["greedy", "sample", "beam"]
    assert doc["results"][2]["params"]["num_beams"] == 3
    assert all(r["error"] is None and r["token_ids"] for r in doc["results"])
    assert out["html"].count("class='dp-col'") == 3 and "dp-tok" in out["html"]
    # the replay slider's handler redraws every column at an earlier step (state kept in the session)
    frame, _window = client.predict(1, api_name="/replay")
    assert frame.count("step 1 / ") == 3


BAD = [
    (dict(prompt=""), "prompt must not be empty"),
    (dict(prompt="   \n "), "prompt must not be empty"),
    (dict(max_new=0), "max_new_tokens must be in [1, 512]"),
    (dict(max_new=100000), "max_new_tokens must be in [1, 512]"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(strategies=[]), "strategies: pick at least one"),
    (dict(strategies=["greedy"] * 7), "strategies: pick at most 6"),
    (dict(params={("sample", "temperature"): -1.0}, strategies=["sample"]), "temperature must be in [0, 100]"),
    (dict(params={("beam", "num_beams"): 0}, strategies=["beam"]), "num_beams must be in [1, 16]"),
    (dict(params={("beam", "num_beams"): 99}, strategies=["beam"]), "num_beams must be in [1, 16]"),
    (dict(params={("sample", "top_p"): 0.0}, strategies=["sample"]), "top_p must be in (0, 1]"),
    (dict(params={("sample", "top_k"): -5}, strategies=["sample"]), "top_k must be in [0, inf]"),
    (dict(model="gpt2-xl"), "offline"),
    (dict(prompt="x " * 3000), "the limit is 2048"),
    (dict(model="someone/some-model"), "not one of the presets"),
    (dict(model="../../etc/passwd"), "not one of the presets"),
    (dict(model=""), "model: choose a model"),
    (dict(assistant="someone/draft"), "assistant: 'someone/draft' is not one of the presets"),
    (dict(strategies=["nope"]), "is not in the list of choices: ['greedy'"),   # Gradio's own check
    (dict(params={("lookahead", "window"): 0}, strategies=["lookahead"]), "window must be in [1, 32]"),
    (dict(params={("lookahead", "ngram"): 99}, strategies=["lookahead"]), "ngram must be in [2, 8]"),
    (dict(params={("speculative", "draft_tokens"): -3}, strategies=["speculative"]), "draft_tokens must be in"),
    (dict(params={("jacobi", "block_size"): 1e9}, strategies=["jacobi"]), "block_size must be in [1, 64]"),
    (dict(params={("jacobi", "variant"): "<script>"}, strategies=["jacobi"]), "variant must be one of"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_bad_input_gets_a_clear_error_and_server_keeps_serving(client, kwargs, message):
    kwargs = dict(kwargs)
    strategies = kwargs.pop("strategies", ["greedy"])
    with pytest.raises(Exception) as err:
        run(client, strategies, **kwargs)
    assert message in str(err.value)
    good = run(client, ["greedy"], prompt="Name a colour.", max_new=3)   # still serving, correctly
    assert good["status"].startswith("Ran 1 strategies") and len(good["doc"]["results"][0]["token_ids"]) == 3


@pytest.mark.parametrize("field,value,message", [
    ("max_new_tokens", float("nan"), "max_new_tokens must be"),
    ("max_new_tokens", 2.5, "max_new_tokens must be"),
    ("max_new_tokens", float("inf"), "max_new_tokens must be"),
    ("seed", float("nan"), "seed must be an integer"),
    ("seed", True, "seed must be an integer"),
])
def test_values_json_cannot_carry_are_refused_by_the_validation_layer(field, value, message):
    # NaN and infinity cannot travel through the JSON API (gradio_client refuses to send them),
    # so the validation boundary itself is checked for them
    kwargs = dict(model=BUNDLED, assistant="none", prompt="hi", chat=True, max_new_tokens=4, seed=0,
                  needs_assistant=False)
    kwargs[field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        app.prepare(**kwargs)


def test_non_finite_sampling_parameters_are_refused():
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be finite"):
            app.build_plan(["sample"], {("sample", "temperature"): bad})


def _raw_call(app_url: str, data: list) -> str:
    """POST the run endpoint with a hand-written JSON body (NaN literals included); return the event stream."""
    import urllib.request
    body = json.dumps({"data": data}).encode()        # json.dumps writes NaN / Infinity literals
    req = urllib.request.Request(app_url + "gradio_api/call/run", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        event_id = json.load(resp)["event_id"]
    with urllib.request.urlopen(app_url + f"gradio_api/call/run/{event_id}", timeout=120) as resp:
        return resp.read().decode("utf-8", "replace")


@pytest.mark.parametrize("index,value,message", [
    (5, float("nan"), "max_new_tokens must be an integer"),
    (5, float("inf"), "max_new_tokens must be"),
    (5, 2.5, "max_new_tokens must be an integer"),
    (6, float("nan"), "seed must be an integer"),
    (6, 1.5, "seed must be an integer"),
    (5, "lots", "max_new_tokens must be"),    # a wrong type
    (2, "greedy", None),                      # a string where a list belongs: Gradio's own check
])
def test_non_json_values_sent_over_raw_http_are_refused(app_url, client, index, value, message):
    # json.dumps writes NaN / Infinity literals, which gradio_client refuses to send
    data = [BUNDLED, "none", ["greedy"], "Say hi.", True, 4, 0] + [None] * len(app.param_fields())
    data[index] = value
    stream = _raw_call(app_url, data)
    assert "event: error" in stream and "event: complete" not in stream
    if message is not None:
        assert message in stream
    good = run(client, ["greedy"], prompt="Name a colour.", max_new=3)
    assert len(good["doc"]["results"][0]["token_ids"]) == 3


def test_bad_model_names_are_refused_in_the_validation_layer():
    presets = app.load_presets()
    with pytest.raises(ValueError, match="not one of the presets"):
        app.check_model_name("someone/some-model", "model", presets)
    with pytest.raises(ValueError, match="choose a model"):
        app.check_model_name("", "model", presets)
    with pytest.raises(ValueError, match="unknown strategy"):
        app.build_plan(["nope"], {})


def test_html_in_prompt_is_escaped_and_server_still_answers(client):
    out = run(client, ["greedy"], prompt="Repeat exactly: <script>alert(1)</script>", max_new=16)
    assert "<script>alert" not in out["html"]
    assert out["status"].startswith("Ran 1 strategies")


def test_import_rejects_bad_files_and_replays_good_ones(client, tmp_path):
    from gradio_client import handle_file
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(Exception, match="not valid JSON"):
        client.predict(handle_file(str(bad)), api_name="/import_trace")
    out = run(client, ["greedy"], max_new=6)
    good = client.predict(handle_file(out["trace"]), api_name="/import_trace")
    assert good[6].startswith("Imported a trace with 1 strategies")
    with open(good[5], encoding="utf-8") as fh:
        again = json.load(fh)
    assert [r["token_ids"] for r in again["results"]] == [r["token_ids"] for r in out["doc"]["results"]]


@pytest.mark.parametrize("content,message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2, 3]", "trace must be a JSON object"),
    (b'{"format": "pickle"}', "not a decoding-playground trace"),
    (b"\x80\x04\x95pickle-bytes", "not valid JSON"),
    (b"[" * 5000 + b"]" * 5000, "nested deeper than"),
    (b" " * (21 * 2**20), "the limit is 20 MB"),
])
def test_hostile_uploads_are_rejected_and_server_keeps_serving(client, tmp_path, content, message):
    from gradio_client import handle_file
    bad = tmp_path / "upload.json"
    bad.write_bytes(content)
    with pytest.raises(Exception, match=message):
        client.predict(handle_file(str(bad)), api_name="/import_trace")
    assert run(client, ["greedy"], max_new=2)["status"].startswith("Ran 1 strategies")


def test_sweep_through_the_server(client):
    fig, status = client.predict(BUNDLED, "none", "Write a haiku about rivers.", True, 6, 0, "prompt_lookup",
                                 "draft_tokens=2,4", api_name="/sweep")
    assert status.startswith("Swept 2 settings of prompt_lookup")
    assert fig is not None
    for spec, message in (("window=0", "window must be in [1, 32]"), ("", "sweep values: write KEY"),
                          ("window=1,2,3,4;ngram=2,3,4,5", "the limit is 12"), ("bogus=1", "bogus")):
        with pytest.raises(Exception, match=re.escape(message)):
            client.predict(BUNDLED, "none", "Hi.", True, 6, 0, "lookahead", spec, api_name="/sweep")
