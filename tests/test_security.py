"""The hostile-input table: what a stranger can send a public Space, through gradio_client and raw HTTP.

Each case checks the exact error (or that markup comes back escaped), then that a
normal run still returns the right tokens. Cases cover issue #18: stored XSS
through trace import, sweep specs and prompts that would exhaust memory, request
bodies and uploads over their caps, lost Stops, lone surrogates, null and
string-typed fields, tiny top_p, duplicate sweep keys, the prophet assistant
with a target that has none, local folder names and server paths in messages.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import types
import urllib.request
import uuid

import pytest
from gradio_client import handle_file

from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from visualize import traces
from web.limits import DEFAULT_LIMITS
from web.page_client import PageViews, page_run, page_submit, run_values
from web.settings import Settings

import app

BUNDLED = "smollm2-135m-instruct"
GOOD_PROMPT = "Name a colour."
XSS = "<img src=x onerror=alert(1)>"
QUOTE_BREAK = "x' onmouseover='alert(1)"
Empty = types.SimpleNamespace(desc="")


@pytest.fixture(scope="module")
def expected():
    lm = load_model(BUNDLED)
    ids = encode_prompt(lm.tokenizer, GOOD_PROMPT, chat=True)
    return greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=3).token_ids


def run_data(model=BUNDLED, assistant="none", strategies=("greedy",), prompt="Say hi.", chat=True, max_new=3,
             seed=0, params=None, generation=None) -> dict:
    """A run by name: page_run's / run_values' keyword arguments (None: a parameter's default)."""
    strategies = list(strategies) if isinstance(strategies, tuple) else strategies
    return dict(model=model, assistant=assistant, strategies=strategies, prompt=prompt, chat=chat,
                max_new_tokens=max_new, seed=seed, params=params, generation=generation)


def sweep_data(strategy="lookahead", spec="window=2", prompt="Say hi.", max_new=3, model=BUNDLED) -> list:
    return [model, "none", prompt, True, max_new, 0, strategy, spec]


def raw_call(app_url: str, api: str, data: list) -> str:
    """POST /gradio_api/call/<api> with a hand-written JSON body (NaN, lone surrogates, nulls); the event stream."""
    body = json.dumps({"data": data}).encode()       # json.dumps writes NaN literals and \\ud800 escapes
    req = urllib.request.Request(app_url + f"gradio_api/call/{api}", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        event_id = json.load(resp)["event_id"]
    with urllib.request.urlopen(app_url + f"gradio_api/call/{api}/{event_id}", timeout=300) as resp:
        return resp.read().decode("utf-8", "replace")


def still_serving(client, expected) -> None:
    out = page_run(client, **run_data(prompt=GOOD_PROMPT))
    assert "Ran 1 strategies" in out.status and out.document()["results"][0]["token_ids"] == expected


# --------------------------------------------------------------------------- requests: (id, api, via, data, message)
NUM = ("sample", "temperature")
CASES = [
    ("prompt-over-char-cap", "run", "client", run_data(prompt="x" * 40_000),
     "prompt is 40000 characters; the limit is 32768"),
    ("prompt-over-token-cap", "run", "client", run_data(prompt="x " * 3000), "the limit is 2048"),
    ("prompt-not-text", "run", "raw", run_data(prompt=123), "prompt must be text, got int"),
    ("prompt-null", "run", "raw", run_data(prompt=None), "prompt must be text, got NoneType"),
    ("prompt-lone-surrogate", "run", "raw", run_data(prompt="hi \ud800 there"),
     "prompt has an invalid character at position 3 (a lone UTF-16 surrogate)"),
    ("strategies-null", "run", "raw", run_data(strategies=None), "strategies: pick at least one"),
    ("strategies-string", "run", "raw", run_data(strategies="greedy"), "strategies must be a list of strategy names"),
    ("strategies-numbers", "run", "raw", run_data(strategies=[1, 2]), "strategies must be a list of strategy names"),
    ("strategies-too-many", "run", "client", run_data(strategies=["greedy"] * 7), "strategies: pick at most 6"),
    ("strategy-markup", "run", "client", run_data(strategies=["<script>"]),
     "strategies: unknown strategy '&lt;script&gt;'"),
    ("chat-string", "run", "raw", run_data(chat="yes"), "chat must be true or false, got 'yes'"),
    ("max-new-nan", "run", "raw", run_data(max_new=float("nan")), "max_new_tokens must be an integer, got nan"),
    ("max-new-bool", "run", "raw", run_data(max_new=True), "max_new_tokens must be an integer, got True"),
    ("max-new-string", "run", "client", run_data(max_new="lots"), "max_new_tokens must be an integer, got 'lots'"),
    ("max-new-huge", "run", "client", run_data(max_new=10**9), "max_new_tokens must be in [1, 512]"),
    ("seed-2-31", "run", "client", run_data(seed=2**31), "seed must be an integer in [0, 2147483647]"),
    ("seed-1e300", "run", "client", run_data(seed=1e300), "seed must be an integer in [0, 2147483647]"),
    ("top-p-1e-300", "run", "client", run_data(strategies=["sample"], params={("sample", "top_p"): 1e-300}),
     "top_p must be in (0, 1] and at least 1e-06, got 1e-300"),
    ("temperature-1e-300", "run", "client", run_data(strategies=["sample"], params={NUM: 1e-300}),
     "temperature must be 0 (argmax) or at least 0.0001, got 1e-300"),
    ("temperature-infinity", "run", "raw", run_data(strategies=["sample"], params={NUM: float("inf")}),
     "temperature must be finite"),
    ("top-k-string", "run", "client", run_data(strategies=["sample"], params={("sample", "top_k"): "many"}),
     "top_k must be a number, got 'many'"),
    ("num-beams-1e9", "run", "client", run_data(strategies=["beam"], params={("beam", "num_beams"): 1e9}),
     "num_beams must be in [1, 16]"),
    ("model-path", "run", "client", run_data(model="../../etc/passwd"), "model: '../../etc/passwd' is not one of"),
    ("model-absolute", "run", "client", run_data(model="/etc/passwd"), "model: '[path]' is not one of"),
    ("model-markup", "run", "client", run_data(model=XSS), "model: '&lt;img src=x onerror=alert(1)&gt;' is not"),
    ("model-null", "run", "raw", run_data(model=None), "model: choose a model"),
    ("assistant-url", "run", "client", run_data(strategies=["speculative"], assistant="https://evil.example/m"),
     "assistant: 'https://evil.example/m' is not one of the presets"),
    ("gemma-with-prophet-drafting", "run", "client",
     run_data(model="gemma-3-270m", assistant="prophet", strategies=["speculative"]),
     "assistant: no prophet head is shipped for 'gemma-3-270m'; choose 'none' or an assistant model"),
    ("sweep-7-keys", "sweep", "client",
     sweep_data(spec=";".join(f"k{i}=" + ",".join(str(v) for v in range(10)) for i in range(7))),
     "sweep values: sweep at most 2 parameters, got 7"),
    ("sweep-100-points", "sweep", "client", sweep_data(spec="window=" + ",".join(map(str, range(1, 11)))
                                                       + ";ngram=" + ",".join(map(str, range(2, 12)))),
     "sweep values: 100 combinations; the limit is 12"),
    ("sweep-duplicate-key", "sweep", "client", sweep_data(spec="window=3;window=5"),
     "sweep values: sweep key 'window' appears twice"),
    ("sweep-no-values", "sweep", "client", sweep_data(spec="window="),
     "sweep values: sweep key 'window' has no values"),
    ("sweep-duplicate-value", "sweep", "client", sweep_data(spec="window=3,3"),
     "sweep values: sweep key 'window' lists a value twice"),
    ("sweep-too-long", "sweep", "client", sweep_data(spec="window=" + "1," * 300), "at most 500 characters"),
    ("sweep-unknown-key", "sweep", "client", sweep_data(spec="bogus=1"), "unknown parameter(s) bogus"),
    ("sweep-unknown-strategy", "sweep", "client", sweep_data(strategy="nope"),
     "sweep strategy: unknown strategy 'nope'"),
    ("sweep-strategy-null", "sweep", "raw", sweep_data(strategy=None), "sweep strategy: unknown strategy 'None'"),
    ("sweep-lone-surrogate", "sweep", "raw", sweep_data(spec="window=\udc00"),
     "sweep values has an invalid character at position 7"),
    ("sweep-infinite-value", "sweep", "client", sweep_data(spec="window=1e400"), "window must be an integer, got inf"),
    ("sweep-prompt-over-cap", "sweep", "client", sweep_data(prompt="y" * 40_000),
     "prompt is 40000 characters; the limit is 32768"),
]


@pytest.mark.parametrize("api,via,data,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_request_gets_the_exact_error(client, app_url, expected, api, via, data, message):
    if via == "client":
        with pytest.raises(Exception) as err:
            page_run(client, **data) if api == "run" else client.predict(*data, api_name=f"/{api}")
        assert message in str(err.value)
    else:
        stream = raw_call(app_url, api, run_values(**data) if api == "run" else data)
        assert "event: error" in stream and "event: complete" not in stream
        assert message in stream, stream[-400:]
    still_serving(client, expected)


@pytest.fixture(scope="module")
def any_model_client():
    """An app started with --allow-any-model (its own settings; the other tests' app keeps the presets only)."""
    from gradio_client import Client

    from conftest import launch_local
    demo = app.build_demo(Settings(allow_any_model=True))
    yield Client(launch_local(demo), verbose=False)
    demo.close()


@pytest.mark.parametrize("name,message", [
    ("decoding", "model: 'decoding' names something on the server; local paths are not accepted"),   # a folder
    ("README.md", "model: 'README.md' names something on the server"),                                 # a file
    ("a/../b", "model: 'a/../b' is not a Hugging Face Hub id"),
    ("~/models", "model: '[path]' is not a Hugging Face Hub id"),   # echoed with the path redacted
    ("someone/missing-model", "must be downloaded from the Hugging Face Hub, but this machine is offline"),
])
def test_any_model_mode_refuses_local_names_and_reveals_no_paths(any_model_client, expected, name, message):
    with pytest.raises(Exception) as err:
        page_run(any_model_client, **run_data(model=name))
    text = str(err.value)
    assert message in text
    assert os.getcwd() not in text and os.path.expanduser("~") not in text
    still_serving(any_model_client, expected)


def test_prophet_assistant_without_a_drafting_strategy(client, expected):
    # a target without a prophet head, the default assistant, greedy only: runs, and the status names no prophet
    out = page_run(client, **run_data(model="gemma-3-270m", assistant="prophet", max_new=2))
    assert out.status.endswith("Ran 1 strategies on gemma-3-270m.")
    out = page_run(client, **run_data(assistant="prophet", strategies=["greedy", "prompt_lookup"]))
    assert out.status.endswith(f"Ran 2 strategies on {BUNDLED}.")
    with open(out.download, encoding="utf-8") as fh:
        env = json.dumps(json.load(fh)["environment"])
    assert os.path.expanduser("~") not in env and os.getcwd() not in env   # the download reveals no server paths
    still_serving(client, expected)


# --------------------------------------------------------------------------- trace imports
def base_trace() -> dict:
    events = [{"type": "ForwardPass", "step": 1, "model": "target", "positions": 4, "ms": 2.0, "kind": "prefill"},
              {"type": "TokenCommitted", "step": 1, "position": 0, "token": 5, "source": "greedy", "prob": 0.5},
              {"type": "TokenVerified", "step": 2, "position": 1, "token": 9, "accepted": False, "p_target": 0.1,
               "q_draft": 1.0},
              {"type": "TokenCommitted", "step": 2, "position": 1, "token": 6, "source": "correction"}]
    result = {"strategy": "prompt_lookup", "label": "Prompt lookup", "params": {"draft_tokens": 4},
              "token_ids": [5, 6], "pieces": ["a", "b"], "vocab": {"5": "a", "6": "b", "9": "z"}, "wall_s": 0.1,
              "tokens_per_s": 20.0, "speedup": 1.0, "target_forwards": 2, "stats": {}, "lossless": True,
              "matches_greedy": True, "error": None, "events": events}
    return {"format": traces.FORMAT, "version": 2, "prompt": "p", "results": [result]}


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        *keys, last = path.split(".")
        target = doc
        for k in keys:
            target = target[int(k)] if k.isdigit() else target[k]
        target[int(last) if last.isdigit() else last] = value
    return mutate


TREE = {"type": "DraftTree", "step": 2, "position": 1, "tokens": [6, 7, 8], "parents": [-1, 0, 0]}
REFUSED = [
    ("source-breaks-attribute", _set("results.0.events.1.source", QUOTE_BREAK),
     "results[0].events[1].source must be one of greedy, sample"),
    ("first-divergence-markup", _set("results.0.first_divergence", XSS),
     "results[0].first_divergence must be an integer in [0, 1000000]"),
    ("step-as-string", _set("results.0.events.1.step", "1"), "results[0].events[1].step must be an integer"),
    ("token-as-bool", _set("results.0.events.1.token", True), "results[0].events[1].token must be an integer"),
    ("step-huge", _set("results.0.events.1.step", 10**12),
     "results[0].events[1].step must be an integer in [0, 1000000]"),
    ("prob-infinite", _set("results.0.events.1.prob", float("inf")),
     "results[0].events[1].prob must be a finite number"),
    ("forward-model-markup", _set("results.0.events.0.model", "<b>"), "events[0].model must be one of target, draft"),
    ("unknown-event-field", _set("results.0.events.1.onclick", "x"), "TokenCommitted has unknown field(s) ['onclick']"),
    ("unknown-event-type", _set("results.0.events.1.type", "Pickle"), "unknown event type 'Pickle'"),
    ("tree-bad-parents", lambda d: d["results"][0]["events"].append(dict(TREE, parents=[-1, 2, 0])),
     "parents must give each node an earlier node or -1"),
    ("tree-accepted-not-a-path", lambda d: d["results"][0]["events"].append(dict(TREE, accepted=[1, 2])),
     "accepted must be a path of nodes from the root down"),
    ("step-timing-huge-accepted", lambda d: d["results"][0]["events"].append(
        {"type": "StepTiming", "step": 2, "draft_ms": 0, "verify_ms": 1, "overhead_ms": 0, "drafted": 4,
         "accepted": 10**9}), "accepted must be an integer in [0, 4096]"),
    ("stats-huge-accepted-length", _set("results.0.stats", {"accepted_lengths": [10**9]}),
     "stats.accepted_lengths[0] must be an integer in [0, 4096]"),
    ("stats-alpha-text", _set("results.0.stats", {"alpha": "high"}), "stats.alpha must be a finite number"),
    ("piece-lone-surrogate", _set("results.0.pieces", ["a", "\ud800"]), "pieces[1] contains a lone surrogate"),
    ("vocab-key-not-an-id", _set("results.0.vocab", {"<b>": "x"}), "vocab key must be a token id"),
    ("too-many-results", lambda d: d["results"].extend([d["results"][0]] * 16), "17 results; the limit is 16"),
    ("version-3", _set("version", 3), "unsupported trace version 3"),
    ("version-as-string", _set("version", "2"), "unsupported trace version '2'"),
    ("no-results", _set("results", None), "trace has no results list"),
]


def _upload(client, tmp_path, doc) -> PageViews:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(doc))         # json.dumps writes Infinity literals and \\ud800 escapes
    return PageViews.of(client.predict(handle_file(str(path)), api_name="/import_trace"))


@pytest.mark.parametrize("mutate,message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_hostile_trace_is_refused_with_the_exact_error(client, expected, tmp_path, mutate, message):
    doc = base_trace()
    mutate(doc)
    with pytest.raises(Exception) as err:
        _upload(client, tmp_path, doc)
    assert message in str(err.value)
    still_serving(client, expected)


def test_markup_in_an_accepted_trace_is_escaped_everywhere(client, expected, tmp_path):
    doc = base_trace()
    r = doc["results"][0]
    r.update(label=XSS, strategy=QUOTE_BREAK, pieces=[XSS, "</span><script>alert(1)</script>"],
             params={XSS: XSS}, error=XSS, matches_greedy=False, first_divergence=1)
    r["vocab"]["9"] = "<svg onload=alert(1)>"
    out = _upload(client, tmp_path, doc)
    assert out.status == "Imported a trace with 1 strategies (no model needed)." and out.download is None
    final = out.columns_html
    assert "&lt;svg&nbsp;onload=alert(1)&gt;" in final          # the rejected draft, struck through
    for html in (final, client.predict(1, api_name="/replay")[0]):  # the import, and a replay step
        for raw in ("<img", "<script", "<svg", "' onmouseover="):
            assert raw not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html
        assert "data-strategy='x&#x27; onmouseover=&#x27;alert(1)'" in html
    timeline = json.loads(out.timeline["plot"])                            # plotly decodes the entities to text
    assert timeline["data"][0]["y"] == ["&lt;img src=x onerror=alert(1)&gt;"]
    still_serving(client, expected)


def test_version_one_traces_still_import(client, expected, tmp_path):
    doc = base_trace()
    doc["version"] = 1
    out = _upload(client, tmp_path, doc)
    assert out.status.startswith("Imported a trace with 1 strategies")
    still_serving(client, expected)


# --------------------------------------------------------------------------- raw HTTP: bodies, uploads, Stops, queue
def _post_headers_only(app_url: str, path: str, headers: dict) -> tuple[int, bytes]:
    """Send only the headers (a declared size) and read the answer: the server must refuse before the body."""
    host, port = app_url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", path)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    return resp.status, resp.read()


@pytest.mark.parametrize("path,size,content_type", [
    ("/gradio_api/call/run", 30 * 2**20, "application/json"),       # the 30 MB prompt
    ("/gradio_api/call/sweep", 30 * 2**20, "application/json"),
    ("/gradio_api/queue/join", 2 * 2**20, "application/json"),
    ("/gradio_api/upload", 300 * 2**20, "multipart/form-data; boundary=x"),   # the 300 MB anonymous upload
])
def test_request_bodies_over_the_cap_are_refused_unread(app_url, client, expected, path, size, content_type):
    status, body = _post_headers_only(app_url, path, {"Content-Type": content_type, "Content-Length": str(size)})
    assert status == 413 and b"request body over the limit of" in body
    still_serving(client, expected)


def test_a_body_without_a_length_is_counted(app_url, client, expected):
    host, port = app_url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/gradio_api/call/run")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for _ in range(40):   # 2.5 MB in 64 kB chunks
            conn.send(b"10000\r\n" + b"x" * 65536 + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass                  # the server may answer and close before it has read everything
    resp = conn.getresponse()
    assert resp.status == 413
    still_serving(client, expected)


def test_an_upload_over_the_file_limit_is_refused_by_gradio(app_url, client, expected):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"t.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + b" " * (DEFAULT_LIMITS.upload_bytes + 1024) \
        + f"\r\n--{boundary}--\r\n".encode()
    host, port = app_url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/gradio_api/upload", body=body,
                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    resp = conn.getresponse()
    assert resp.status == 413 and b"File size exceeded maximum allowed size of 20971520 bytes" in resp.read()
    still_serving(client, expected)


def test_stops_from_strangers_create_nothing(app_url, app_state, client, expected):
    before = len(app_state.jobs)
    for i in range(200):
        req = urllib.request.Request(app_url + "gradio_api/run/stop", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"data": [], "session_hash": f"stranger-{i}"}).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.load(resp)["data"][0] == "Nothing to stop."
    assert len(app_state.jobs) == before
    still_serving(client, expected)


def _status_of(job) -> str:
    """The status line of a submitted run's latest streamed update ("" before the first)."""
    outputs = job.outputs()
    return outputs[-1].status if outputs else ""


def test_one_session_cannot_fill_the_queue_and_a_queued_stop_holds(app_url, app_state, expected):
    from gradio_client import Client
    busy, me = Client(app_url, verbose=False), Client(app_url, verbose=False)
    long_run = run_data(prompt="Write a very long story about a lighthouse.", max_new=400)
    first = page_submit(busy, **long_run)                  # holds the one compute slot
    deadline = time.time() + 120
    while time.time() < deadline and "tokens" not in ((first.status().progress_data or [None])[-1] or Empty).desc:
        time.sleep(0.1)
    # other requests than busy's (an identical one would join its computation), waiting in line behind it
    mine = [page_submit(me, **run_data(prompt=f"Write a very long story about lighthouse {i}.", max_new=400))
            for i in range(2)]
    deadline = time.time() + 60
    while time.time() < deadline and sum(t.session == me.session_hash for t in app_state.jobs._tickets.values()) < 2:
        time.sleep(0.1)                                              # both admitted (submit sends in the background)
    with pytest.raises(Exception, match="this session already has 2 jobs queued or running"):
        page_run(me, **long_run)                       # a third from the same session
    deadline = time.time() + 60                                      # both in line, told their place
    while time.time() < deadline and not all("Waiting for the compute slot" in _status_of(j) for j in mine):
        time.sleep(0.1)
    me.predict(api_name="/stop")
    busy.predict(api_name="/stop")
    assert "Ran 1 strategies" in first.result(timeout=300).status     # the partial trace comes back
    for job in mine:                                                 # Stop pressed while waiting in line holds
        assert job.result(timeout=300).status == "Stopped the queued run before it started."
    still_serving(me, expected)


def test_replay_clamps_any_step_and_bounds_its_frame(client, expected, tmp_path):
    doc = base_trace()
    r = doc["results"][0]
    n = 20_000
    r["token_ids"] = [5] * n
    r["pieces"] = ["<u>"] * n
    r["events"] = [{"type": "TokenCommitted", "step": i, "position": i, "token": 5, "source": "greedy"}
                   for i in range(n)]
    _upload(client, tmp_path, doc)
    top = n - 1
    for step, shown in ((-5, 0), (3.5, 3), ("abc", 0), (None, 0), (10**9, top)):
        frame = client.predict(step, api_name="/replay")[0]
        assert f"step {shown} / {top}" in frame and "<u>" not in frame
    assert len(frame) < 1_000_000 and f"{n - 6144} earlier items not shown" in frame
    still_serving(client, expected)
