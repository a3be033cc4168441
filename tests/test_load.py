"""Bounded load and cancellation against a real server on loopback.

16 concurrent clients each send a few short runs with their own prompt and seed;
every answer must be the one for its own request (no dropped or mixed-up
results). A client that presses Stop mid-run gets its partial trace back and
the worker is free for the next client within a step or two. Figures are
printed (and recorded in BENCHMARKS.md), never asserted as timings.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import statistics
import threading
import time

import pytest
from gradio_client import Client

from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy

import app
from web.limits import DEFAULT_LIMITS
from web.page_client import page_run, page_submit, run_values
from web.settings import Settings

BUNDLED = "smollm2-135m-instruct"
CLIENTS, RUNS, TOKENS = 16, 2, 3


def _request(client: Client, prompt: str, seed: int, max_new: int = TOKENS, strategies=("greedy",),
             chat: bool = True, model: str = BUNDLED) -> dict:
    out = page_run(client, model=model, strategies=list(strategies), prompt=prompt, max_new_tokens=max_new,
                   seed=seed, chat=chat)
    return {"doc": out.document(), "status": out.status}


def _wait_for_tokens(job, timeout: float = 120) -> None:
    """Until the submitted run is under way (its progress reports generated tokens)."""
    deadline, status = time.time() + timeout, None
    while time.time() < deadline:
        status = job.status()
        if status.progress_data and "tokens" in (status.progress_data[-1].desc or ""):
            return
        time.sleep(0.2)
    pytest.fail(f"the submitted run reported no generated tokens within {timeout:.0f} s (last status: {status})")


def test_sixteen_concurrent_clients_get_their_own_results(app_url, tiny_model):
    """On the tiny preset (tests/tiny_preset.py): concurrency is the subject, and its greedy differs by prompt when
    the prompt is sent as raw text (chat=False)."""
    lm = load_model(tiny_model)
    prompts = [f"Give me word number {i} of a list of fruit." for i in range(CLIENTS)]
    expected = {}
    for p in prompts:
        ids = encode_prompt(lm.tokenizer, p, chat=False)
        expected[p] = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=TOKENS).token_ids
    answers: list[tuple[str, int, dict]] = []
    errors: list[str] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            client = Client(app_url, verbose=False)
            for r in range(RUNS):
                t0 = time.perf_counter()
                got = _request(client, prompts[i], seed=i * 100 + r, chat=False, model=tiny_model)
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    answers.append((prompts[i], i * 100 + r, got))
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            with lock:
                errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    total = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "a client never got an answer"
    assert errors == []
    assert len(answers) == CLIENTS * RUNS                       # nothing dropped
    for prompt, seed, got in answers:                           # nothing mixed up
        assert got["doc"]["prompt"] == prompt
        assert got["doc"]["environment"]["seed"] == seed
        assert got["doc"]["results"][0]["token_ids"] == expected[prompt]
    assert len({tuple(tokens) for tokens in expected.values()}) > CLIENTS // 2     # a mix-up would show
    print(f"\n[load] {CLIENTS} clients x {RUNS} runs ({TOKENS} tokens each): {len(answers)} answers in {total:.1f} s; "
          f"latency median {statistics.median(latencies):.1f} s, max {max(latencies):.1f} s")


def test_stop_returns_the_partial_trace_and_frees_the_worker(app_url):
    slow = Client(app_url, verbose=False)
    other = Client(app_url, verbose=False)
    job = page_submit(slow, model=BUNDLED, strategies=["greedy"], prompt="Write a very long story about a lighthouse.",
                      max_new_tokens=400, seed=0)
    _wait_for_tokens(job)
    time.sleep(1.0)
    t_stop = time.perf_counter()
    slow.predict(api_name="/stop")
    out = job.result(timeout=120)
    stopped_after = time.perf_counter() - t_stop
    result = out.document()["results"][0]
    assert result["stop_reason"] == "cancelled" and 0 < len(result["token_ids"]) < 400
    t_next = time.perf_counter()
    got = _request(other, "Name a planet.", seed=1)
    next_done = time.perf_counter() - t_next
    assert "Ran 1 strategies" in got["status"]
    print(f"\n[cancel] stop -> partial result in {stopped_after:.2f} s ({len(result['token_ids'])} tokens kept); "
          f"next client's run done {next_done:.2f} s later")


@pytest.mark.parametrize("bad", [{"max_new": -1}, {"strategies": []}])
def test_a_bad_request_does_not_block_the_queue(app_url, bad):
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception):
        page_run(client, model=BUNDLED, strategies=bad.get("strategies", ["greedy"]), prompt="Hi.",
                 max_new_tokens=bad.get("max_new", 3), seed=0)
    assert "Ran 1 strategies" in _request(client, "Hi.", seed=0)["status"]


# --------------------------------------------------------------------------- issue #18: attacks under load

def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def _raw_run(app_url: str, api: str, head: bytes, chunk: bytes, repeats: int, tail: bytes) -> tuple[float, str]:
    """POST ``head + chunk * repeats + tail`` to /call/<api>, streamed (this process never holds the whole
    body, so the RSS measured is the server's); returns (seconds until answered, the answer or the refusal)."""
    import http.client
    import urllib.request
    host, port = app_url.split("//")[1].strip("/").split(":")
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = itertools.chain([head], itertools.repeat(chunk, repeats), [tail])
    try:
        conn.request("POST", f"/gradio_api/call/{api}", body=body, headers={
            "Content-Type": "application/json", "Content-Length": str(len(head) + len(chunk) * repeats + len(tail))})
        resp = conn.getresponse()
        if resp.status != 200:
            return time.perf_counter() - t0, f"HTTP {resp.status}"
        event_id = json.load(resp)["event_id"]
        with urllib.request.urlopen(app_url + f"gradio_api/call/{api}/{event_id}", timeout=60) as stream:
            answer = stream.read().decode("utf-8", "replace")
    except OSError as exc:           # refused before the whole body was sent: the connection closes
        answer = f"closed: {type(exc).__name__}"
    return time.perf_counter() - t0, answer


@pytest.mark.alone                  # asserts on seconds: no other worker mid-test
def test_sweep_and_prompt_attacks_are_answered_fast_without_memory_growth(app_url):
    client = Client(app_url, verbose=False)
    _request(client, "Warm up.", seed=0)                        # the model is loaded before measuring
    rss0 = _rss_mb()
    timings: dict[str, float] = {}
    for keys in (7, 9):                                         # 1.3 GB and ~130 GB of combinations before
        spec = ";".join(f"k{i}=" + ",".join(str(v) for v in range(10)) for i in range(keys))
        t0 = time.perf_counter()
        with pytest.raises(Exception, match="sweep at most 2 parameters"):
            client.predict(BUNDLED, "none", "Hi.", True, 4, 0, "lookahead", spec, api_name="/sweep")
        timings[f"sweep {keys} keys x 10 values"] = time.perf_counter() - t0
    answers: dict[str, str] = {}

    def attack(name: str, api: str, prompt_chars: int) -> None:
        data = (run_values(model=BUNDLED, strategies=["greedy"], prompt="P", max_new_tokens=4) if api == "run"
                else [BUNDLED, "none", "P", True, 4, 0, "lookahead", "window=2"])
        head, tail = json.dumps({"data": data}).encode().split(b'"P"')
        seconds, answers[name] = _raw_run(app_url, api, head + b'"', b"p" * 2**16, prompt_chars // 2**16,
                                          b"p" * (prompt_chars % 2**16) + b'"' + tail)
        timings[name] = seconds
    threads = [threading.Thread(target=attack, args=(f"{size} prompt to {api}", api, chars))
               for size, chars in (("30 MB", 30 * 2**20), ("900 kB", 900_000)) for api in ("run", "sweep")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    grown = _rss_mb() - rss0
    for name, answer in answers.items():
        if name.startswith("30 MB"):
            assert answer.startswith(("HTTP 413", "closed")), answer[:200]
        else:
            assert "prompt is 900000 characters; the limit is 32768" in answer, answer[-300:]
    print("\n[attacks] " + "; ".join(f"{k}: {v:.2f} s" for k, v in timings.items())
          + f"; RSS {rss0:.0f} MB -> {rss0 + grown:.0f} MB ({grown:+.0f} MB)")
    assert max(timings.values()) < 2.0          # issue #18: answered within 2 s
    assert grown < 200                          # issue #18: RSS growth under 200 MB
    assert "Ran 1 strategies" in _request(client, "Name a planet.", seed=1)["status"]


def test_stop_is_honoured_after_hundreds_of_stops_from_other_sessions(app_url, app_state, monkeypatch):
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor
    # the storm shares this machine's CPU with the run: give the run time to outlast it
    slow_limits = dataclasses.replace(app_state.limits, time_limit_s=1800.0)
    monkeypatch.setattr(app_state, "settings", dataclasses.replace(app_state.settings, limits=slow_limits))
    slow = Client(app_url, verbose=False)
    plan = ["greedy", "sample", "beam", "prompt_lookup", "jacobi", "lookahead"]   # minutes of work
    job = page_submit(slow, model=BUNDLED, strategies=plan, prompt="Write a very long story about a lighthouse.",
                      max_new_tokens=512, seed=0)
    _wait_for_tokens(job)
    held = len(app_state.jobs)

    def stranger(i: int) -> str:
        req = urllib.request.Request(app_url + "gradio_api/run/stop", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"data": [], "session_hash": f"stranger-{i}"}).encode())
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)["data"][0]
    # a Stop that made a ticket would show in the table's size at once, and would push the held one out once the
    # table is full: twice its capacity (256 Stops; 1,024 cost ~9 s more of the worker and caught nothing more)
    stops = 2 * app_state.jobs.capacity
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(stranger, range(stops)))
    storm = time.perf_counter() - t0
    assert set(replies) == {"Nothing to stop."} and len(app_state.jobs) == held     # no flag created, none pushed out
    assert not job.done()
    t_stop = time.perf_counter()
    slow.predict(api_name="/stop")
    out = job.result(timeout=120)
    honoured = time.perf_counter() - t_stop
    results = out.document()["results"]
    stopped = next(r for r in results if r["stop_reason"] == "cancelled")
    print(f"\n[stop] {stops} Stops from other sessions in {storm:.1f} s ({held} job tickets held throughout); "
          f"the real Stop returned the partial trace ({stopped['strategy']}: {len(stopped['token_ids'])} tokens) "
          f"in {honoured:.2f} s")
    # the stopped strategy returns its partial trace (beam search commits its tokens only at the end, so on a
    # slow machine where the storm outlasts greedy and sampling the Stop may land on it with events but no tokens)
    assert stopped["events"] and len(stopped["token_ids"]) < 512
    assert stopped["token_ids"] or stopped["strategy"] == "beam"
    # the strategies before it finished normally; none after it ran
    index = results.index(stopped)
    assert results[-1] is stopped and all(r["error"] is None for r in results[:index])
    # issue #18 asks for a Stop honoured within 1 s (measured 0.62 s with the machine at load 6); the assertion
    # keeps a margin for a busy CI machine, the printed figure is the one to record
    assert honoured < 3.0


def test_temp_files_stay_bounded_over_many_runs(monkeypatch, tiny_model):
    """Our trace files keep the newest few; Gradio's copies go with delete_cache (short here, 30 min live).
    Twice as many runs as files kept, and one more (an eviction that waits for twice the files still fails; 24 runs
    caught nothing more and cost ~5 s more of the worker, 50 runs ~20 s). The files are the floor's, so the runs are
    the tiny preset's (tests/tiny_preset.py)."""
    from conftest import launch_local
    # every 1 s, files older than 10 s: a client on a busy machine fetches its trace before it goes (a 3 s age
    # once answered 403 to a fetch on a machine at load 10)
    demo = app.build_demo(Settings(limits=dataclasses.replace(DEFAULT_LIMITS, cache_cleanup_s=(1, 10))))
    files = demo.playground.trace_files
    files.keep = 8
    url = launch_local(demo)
    try:
        client = Client(url, verbose=False)

        def cached() -> int:
            return sum(os.path.exists(f) for files in demo.temp_file_sets for f in files)
        counts = []
        runs = 2 * files.keep + 1
        for i in range(runs):
            assert "Ran 1 strategies" in _request(client, f"Say {i}.", seed=i, max_new=1, model=tiny_model)["status"]
            counts.append((files.count(), cached()))
        # past delete_cache's age (10 s) Gradio's cleaner (every 1 s) removes its copies: awaited, not slept
        deadline = time.monotonic() + 60
        while cached() > 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        ours, gradio_copies = files.count(), cached()
    finally:
        demo.close()
    print(f"\n[files] after {runs} runs: {ours} trace files of ours (at most {max(c[0] for c in counts)} at any time), "
          f"{gradio_copies} Gradio cache copies left (at most {max(c[1] for c in counts)} during the runs)")
    assert ours == 8 and max(c[0] for c in counts) <= 8
    assert gradio_copies <= 8


def test_cache_cleaner_survives_files_added_while_it_walks(tmp_path, monkeypatch):
    """CI once saw Gradio's cleaner die on "Set changed size during iteration" (a request cached a file while
    it walked the set) and never run again. With the app's sets it finishes and removes the old files."""
    from gradio import route_utils
    demo = app.build_demo()
    assert demo.guard_temp_files() > 0 and demo.guard_temp_files() == 0     # swapped once, then left alone
    component = next(b for b in demo.blocks.values() if getattr(b, "temp_files", None) is not None)
    assert any(files is component.temp_files for files in demo.temp_file_sets)    # still the same shared set
    old = [tmp_path / f"old{i}.json" for i in range(4)]
    for path in old:
        path.write_text("{}")
        component.temp_files.add(str(path))
    real_remove, landed = os.remove, []

    def remove_while_a_request_lands(path):          # a request caches a new file mid-walk
        fresh = tmp_path / f"new{len(landed)}.json"
        fresh.write_text("{}")
        component.temp_files.add(str(fresh))
        landed.append(str(fresh))
        real_remove(path)
    monkeypatch.setattr(route_utils.os, "remove", remove_while_a_request_lands)
    route_utils.delete_files_created_by_app(demo, None)
    assert not any(p.exists() for p in old) and len(landed) == len(old)
    assert set(landed) <= component.temp_files and not {str(p) for p in old} & component.temp_files
    # the control: the plain set Gradio starts with fails exactly this way
    component.temp_files = plain = set(landed)
    demo.temp_file_sets = [plain]
    with pytest.raises(RuntimeError, match="changed size"):
        route_utils.delete_files_created_by_app(demo, None)


def test_replay_of_a_huge_imported_trace_is_bounded(app_url, tmp_path):
    from gradio_client import handle_file

    from visualize.traces import export_trace
    n = 75_000                       # two columns: 150,000 tokens, as in the probe
    result = {"strategy": "greedy", "label": "Greedy", "token_ids": [5] * n, "pieces": ["ab"] * n,
              "vocab": {"5": "ab"}, "events": [{"type": "TokenCommitted", "step": i, "position": i, "token": 5,
                                                "source": "greedy"} for i in range(n)]}
    path = tmp_path / "huge.json"
    path.write_text(export_trace({"results": [result, dict(result, strategy="copy")]}))
    client = Client(app_url, verbose=False)
    t0 = time.perf_counter()
    client.predict(handle_file(str(path)), api_name="/import_trace")
    imported = time.perf_counter() - t0
    t0 = time.perf_counter()
    frame = client.predict(n // 2, api_name="/replay")[0]
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client.predict, args=(n // 3,), kwargs={"api_name": "/replay"})
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    eight = time.perf_counter() - t0
    print(f"\n[replay] {2 * n}-token trace ({path.stat().st_size / 2**20:.1f} MB): import {imported:.1f} s; one replay "
          f"{one:.2f} s, {len(frame) / 2**10:.0f} kB; eight parallel replays {eight:.1f} s")
    assert len(frame) < 2**20 and "earlier items not shown" in frame
