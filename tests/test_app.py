"""The app through gradio_client against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

from web.handlers import import_file
from web.loading import prepare
from web.page_client import PageViews, page_run, run_values
from web.page_names import STEP_VIEWS, run_inputs
from web.app_object import PlaygroundApp
from decoding.runtime.models import load_presets
from web.validation import build_plan, check_model_name, parse_sweep_spec

BUNDLED = "smollm2-135m-instruct"


def run(client, strategies, prompt="Say hi in five words.", max_new=12, seed=0, model=BUNDLED,
        assistant="none", params=None, chat=True):
    # /run is the page's event, off the API page: the helper sends every value, by name
    views = page_run(client, model=model, assistant=assistant, strategies=strategies, prompt=prompt, chat=chat,
                     max_new_tokens=max_new, seed=seed, params=params)
    return {"doc": views.document(), "html": views.columns_html, "trace": views.download, "status": views.status,
            "step": views.step}


def test_real_run_side_by_side(client):
    out = run(client, ["greedy", "sample", "beam"], params={("beam", "num_beams"): 3})
    doc = out["doc"]
    assert "Ran 3 strategies" in out["status"]
    assert doc["format"] == "decoding-playground-trace"
    assert [r["strategy"] for r in doc["results"]] == ["greedy", "sample", "beam"]
    assert doc["results"][2]["params"]["num_beams"] == 3
    assert all(r["error"] is None and r["token_ids"] for r in doc["results"])
    assert out["html"].count("class='dp-col'") == 3 and "dp-tok" in out["html"]
    # the replay slider's handler redraws every column at an earlier step (state kept in the session)
    views = client.predict(1, api_name="/replay")
    assert len(views) == len(STEP_VIEWS)              # columns, lookahead window, Jacobi, drafts, cross-tokenizer
    frame = views[STEP_VIEWS.index("columns")]
    assert frame.count("step 1 / ") == 3
    # the wall-clock replay: at 0 ms nothing is committed yet, at the end every column is finished
    start, readout = client.predict(0, 1.0, api_name="/race_at")
    assert start.count("class='dp-col") == 3 and "<span class='dp-tok" not in start and "t = 0.00 s" in readout
    end, readout = client.predict(10**9, 1.0, api_name="/race_at")
    assert end.count("class='dp-col dp-finished'") == 3 and "finished: 1." in readout
    assert all(len(r["times_ms"]) == len(r["events"]) for r in doc["results"])


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
    (dict(strategies=["nope"]), "strategies: unknown strategy 'nope'"),
    (dict(params={("lookahead", "window"): -1}, strategies=["lookahead"]), "window must be in [0, 32]"),
    (dict(params={("lookahead", "ngram"): 99}, strategies=["lookahead"]), "ngram must be in [2, 8]"),
    (dict(params={("speculative", "draft_tokens"): -3}, strategies=["speculative"]), "draft_tokens must be in"),
    (dict(params={("jacobi", "block_size"): 1e9}, strategies=["jacobi"]), "block_size must be in [0, 64]"),
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
    assert "Ran 1 strategies" in good["status"] and len(good["doc"]["results"][0]["token_ids"]) == 3


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
        prepare(**kwargs)


def test_non_finite_sampling_parameters_are_refused():
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be finite"):
            build_plan(["sample"], {("sample", "temperature"): bad})


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


@pytest.mark.parametrize("name,value,message", [
    ("max_new_tokens", float("nan"), "max_new_tokens must be an integer"),
    ("max_new_tokens", float("inf"), "max_new_tokens must be"),
    ("max_new_tokens", 2.5, "max_new_tokens must be an integer"),
    ("seed", float("nan"), "seed must be an integer"),
    ("seed", 1.5, "seed must be an integer"),
    ("max_new_tokens", "lots", "max_new_tokens must be"),    # a wrong type
    ("strategies", "greedy", "strategies must be a list of strategy names"),   # a string where a list belongs
])
def test_non_json_values_sent_over_raw_http_are_refused(app_url, client, name, value, message):
    # json.dumps writes NaN / Infinity literals, which gradio_client refuses to send
    data = run_values(model=BUNDLED, strategies=["greedy"], prompt="Say hi.", max_new_tokens=4)
    data[run_inputs().index(name)] = value
    stream = _raw_call(app_url, data)
    assert "event: error" in stream and "event: complete" not in stream
    if message is not None:
        assert message in stream
    good = run(client, ["greedy"], prompt="Name a colour.", max_new=3)
    assert len(good["doc"]["results"][0]["token_ids"]) == 3


def test_bad_model_names_are_refused_in_the_validation_layer():
    presets = load_presets()
    with pytest.raises(ValueError, match="not one of the presets"):
        check_model_name("someone/some-model", "model", presets)
    with pytest.raises(ValueError, match="choose a model"):
        check_model_name("", "model", presets)
    with pytest.raises(ValueError, match="unknown strategy"):
        build_plan(["nope"], {})


def test_html_in_prompt_is_escaped_and_server_still_answers(client):
    out = run(client, ["greedy"], prompt="Repeat exactly: <script>alert(1)</script>", max_new=16)
    assert "<script>alert" not in out["html"]
    assert "Ran 1 strategies" in out["status"]


def test_import_rejects_bad_files_and_replays_good_ones(client, tmp_path):
    from gradio_client import handle_file
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(Exception, match="not valid JSON"):
        client.predict(handle_file(str(bad)), api_name="/import_trace")
    out = run(client, ["greedy"], max_new=6)
    good = PageViews.of(client.predict(handle_file(out["trace"]), api_name="/import_trace"))
    assert good.status.startswith("Imported a trace with 1 strategies")
    assert good.download is None                # an imported trace is not written out again
    assert good.columns_html == out["html"]     # the same replay frame as the run's, with no model


@pytest.mark.parametrize("content,message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2, 3]", "trace must be a JSON object"),
    (b'{"format": "pickle"}', "not a decoding-playground trace"),
    (b"\x80\x04\x95pickle-bytes", "not valid JSON"),
    (b"[" * 5000 + b"]" * 5000, "nested deeper than"),
    (b" " * (21 * 2**20), "exceeds the maximum file size of 20971520 bytes"),   # max_file_size (client side)
])
def test_hostile_uploads_are_rejected_and_server_keeps_serving(client, tmp_path, content, message):
    from gradio_client import handle_file
    bad = tmp_path / "upload.json"
    bad.write_bytes(content)
    with pytest.raises(Exception, match=message):
        client.predict(handle_file(str(bad)), api_name="/import_trace")
    assert "Ran 1 strategies" in run(client, ["greedy"], max_new=2)["status"]


def test_sweep_through_the_server(client, tiny_model):
    """On the tiny preset (tests/tiny_preset.py): the sweep's handling is the subject."""
    fig, status = client.predict(tiny_model, "none", "Write a haiku about rivers.", True, 6, 0, "prompt_lookup",
                                 "draft_tokens=2,4", api_name="/sweep")
    assert status.startswith("Swept 2 settings of prompt_lookup")
    assert fig is not None
    for spec, message in (("window=-1", "window must be in [0, 32]"), ("", "sweep values: write KEY"),
                          ("window=1,2,3,4;ngram=2,3,4,5", "the limit is 12"), ("bogus=1", "bogus")):
        with pytest.raises(Exception, match=re.escape(message)):
            client.predict(tiny_model, "none", "Hi.", True, 6, 0, "lookahead", spec, api_name="/sweep")


# --------------------------------------------------------------------------- the service layer, without a server

def test_stop_flags_live_exactly_as_long_as_their_jobs():
    from web.jobs import Jobs
    now = [0.0]
    jobs = Jobs(per_session=2, capacity=6, queued_ttl_s=100, count_s=50, clock=lambda: now[0])
    a1, a2 = jobs.admit("a"), jobs.admit("a")
    with pytest.raises(ValueError, match="already has 2 jobs queued or running"):
        jobs.admit("a")
    assert jobs.stop("nobody") == (0, 0) and len(jobs) == 2          # a Stop creates nothing
    assert jobs.stop("a") == (0, 2)                                   # pressed while both wait
    key, flag = jobs.start(a1, "a")
    assert key == a1 and flag.is_set()                                # still set when the job starts
    jobs.admit("a")                                                   # stopped jobs no longer count
    _, fresh = jobs.start(None, "direct")                             # a direct call gets its own ticket
    assert not fresh.is_set()
    for i in range(10):                                               # strangers fill the table...
        jobs.admit(f"s{i}")
    assert jobs.stop("a") == (1, 0)             # ...pushing out waiting tickets, never the running one
    jobs.finish(a1)
    for _ in range(2):
        jobs.admit("c")
    now[0] = 60.0                               # a client may cancel a waiting job unseen: after count_s
    jobs.admit("c")                             # its ticket no longer counts against the session...
    assert jobs.stop("c") == (0, 3)             # ...but still carries a Stop until it expires
    now[0] = 1000.0                             # waiting tickets of vanished clients expire
    jobs.admit("b")
    assert len(jobs) == 2 and a2 not in jobs._tickets


def test_server_paths_are_redacted_but_urls_and_hub_ids_are_not():
    from web.redact import redact_all, redact_paths
    text = ("could not load model 'x' from '/root/.cache/decoding-playground/x': no file in /root/.cache/x; "
            "see https://huggingface.co/org/model or org/model (~/models, ../rel)")
    assert redact_paths(text) == ("could not load model 'x' from '[path]': no file in [path]; "
                                  "see https://huggingface.co/org/model or org/model ([path], ../rel)")
    assert redact_all({"target": {"source": "/home/u/m", "n": 3}, "list": ["/tmp/a"]}) == \
        {"target": {"source": "[path]", "n": 3}, "list": ["[path]"]}


def test_trace_files_and_replay_documents_are_bounded(tmp_path):
    from web.guards import TraceFiles, TraceStore
    from web.memory import held_bytes
    files = TraceFiles(keep=3, directory=str(tmp_path))
    paths = [files.write(f'{{"n": {i}}}') for i in range(10)]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths[-3:])
    one = held_bytes({"n": 1000, "pad": "x" * 200})                # what each document below holds
    store = TraceStore(max_bytes=3 * one + one // 2)
    keys = [store.put({"n": 1000 + i, "pad": "x" * 200}, i) for i in range(5)]
    assert len(store) == 3 and store.held_bytes == 3 * one
    assert store.get(keys[0]) is None and store.get(keys[4])[1] == 4
    assert store.get(None) is None and store.get(["not", "a", "key"]) is None
    big = store.put({"big": "x" * (4 * one)}, 0)                    # one document over the budget stays alone
    assert len(store) == 1 and store.get(big) is not None


def test_sweep_specs_are_counted_before_they_are_built():
    spec = ";".join(f"k{i}=" + ",".join(str(v) for v in range(10)) for i in range(12))   # 10**12 points
    with pytest.raises(ValueError, match="sweep at most 2 parameters, got 12"):
        parse_sweep_spec("lookahead", spec[:500])
    from decoding.harness.bench import parse_sweep
    with pytest.raises(ValueError, match="1000000000000 combinations; the limit is 4096"):
        parse_sweep("lookahead:" + spec)        # counted: building them first would never get here
    assert parse_sweep_spec("lookahead", "window=2,3;ngram=3")[1] == [("2", "3"), ("3", "3")]


def test_an_oversized_trace_is_reported_with_its_real_size(tmp_path):
    import gradio as gr
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(50 * 2**20)                 # a sparse 50 MB file: nothing is written to disk
    with pytest.raises(gr.Error, match=re.escape("trace: trace file is 50.0 MB; the limit is 20 MB")):
        asyncio.run(import_file(PlaygroundApp(), str(big)))


def _history_drafts(doc: dict) -> int:
    """DraftSource events of the suffix run that copied from the session's history."""
    suffix = next(r for r in doc["results"] if r["strategy"] == "suffix")
    return sum(1 for e in suffix["events"] if e["type"] == "DraftSource" and e.get("text") == "history")


def test_suffix_history_is_kept_per_browser_session_and_can_be_cleared(app_url, tiny_model):
    """Issue 16: one visitor's outputs never draft for another's; "Clear history" forgets them. On the tiny
    preset (tests/tiny_preset.py): the history is the floor's, whatever model wrote it."""
    from gradio_client import Client
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    prompt = "List the days of the week, separated by commas."

    def suffix_run(client) -> dict:
        return run(client, ["suffix"], prompt=prompt, max_new=24, model=tiny_model)["doc"]
    first, second, other = suffix_run(a), suffix_run(a), suffix_run(b)
    forwards = lambda doc: next(r["target_forwards"] for r in doc["results"] if r["strategy"] == "suffix")  # noqa: E731
    assert _history_drafts(first) == 0 and _history_drafts(second) > 0       # A drafts from its own history
    assert forwards(second) < forwards(first)
    assert _history_drafts(other) == 0 and forwards(other) == forwards(first)  # B starts with nothing of A's
    assert a.predict(api_name="/clear_history").startswith("Cleared this session's history (2 earlier outputs).")
    again = suffix_run(a)
    assert _history_drafts(again) == 0 and forwards(again) == forwards(first)
    assert _history_drafts(suffix_run(b)) > 0                                   # B kept its own
