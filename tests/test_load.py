"""Bounded load and cancellation against a real server on loopback.

16 concurrent clients each send a few short runs with their own prompt and seed;
every answer must be the one for its own request (no dropped or mixed-up
results). A client that presses Stop mid-run gets its partial trace back and
the worker is free for the next client within a step or two. Figures are
printed (and recorded in BENCHMARKS.md), never asserted as timings.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import pytest
from gradio_client import Client

import app
from decoding.baselines import greedy
from decoding.models import load_model
from decoding.params import GreedyParams
from decoding.result import ModelPair
from decoding.runner import encode_prompt

BUNDLED = "smollm2-135m-instruct"
CLIENTS, RUNS, TOKENS = 16, 2, 3


def _request(client: Client, prompt: str, seed: int, max_new: int = TOKENS, strategies=("greedy",)) -> dict:
    values = [None] * len(app.param_fields())
    out = client.predict(BUNDLED, "none", list(strategies), prompt, True, max_new, seed, *values, api_name="/run")
    with open(out[5], encoding="utf-8") as fh:
        return {"doc": json.load(fh), "status": out[6]}


def test_sixteen_concurrent_clients_get_their_own_results(app_url):
    lm = load_model(BUNDLED)
    prompts = [f"Give me word number {i} of a list of fruit." for i in range(CLIENTS)]
    expected = {}
    for p in prompts:
        ids = encode_prompt(lm.tokenizer, p, chat=True)
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
                got = _request(client, prompts[i], seed=i * 100 + r)
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
    print(f"\n[load] {CLIENTS} clients x {RUNS} runs ({TOKENS} tokens each): {len(answers)} answers in {total:.1f} s; "
          f"latency median {statistics.median(latencies):.1f} s, max {max(latencies):.1f} s")


def test_stop_returns_the_partial_trace_and_frees_the_worker(app_url):
    slow = Client(app_url, verbose=False)
    other = Client(app_url, verbose=False)
    values = [None] * len(app.param_fields())
    job = slow.submit(BUNDLED, "none", ["greedy"], "Write a very long story about a lighthouse.", True, 400, 0,
                      *values, api_name="/run")
    # wait until the run is under way (the first tokens are being generated)
    deadline = time.time() + 120
    while time.time() < deadline:
        status = job.status()
        if status.progress_data and "tokens" in (status.progress_data[-1].desc or ""):
            break
        time.sleep(0.2)
    time.sleep(1.0)
    t_stop = time.perf_counter()
    slow.predict(api_name="/stop")
    out = job.result(timeout=120)
    stopped_after = time.perf_counter() - t_stop
    with open(out[5], encoding="utf-8") as fh:
        doc = json.load(fh)
    result = doc["results"][0]
    assert result["stop_reason"] == "cancelled" and 0 < len(result["token_ids"]) < 400
    t_next = time.perf_counter()
    got = _request(other, "Name a planet.", seed=1)
    next_done = time.perf_counter() - t_next
    assert got["status"].startswith("Ran 1 strategies")
    print(f"\n[cancel] stop -> partial result in {stopped_after:.2f} s ({len(result['token_ids'])} tokens kept); "
          f"next client's run done {next_done:.2f} s later")


@pytest.mark.parametrize("bad", [{"max_new": -1}, {"strategies": []}])
def test_a_bad_request_does_not_block_the_queue(app_url, bad):
    client = Client(app_url, verbose=False)
    values = [None] * len(app.param_fields())
    with pytest.raises(Exception):
        client.predict(BUNDLED, "none", bad.get("strategies", ["greedy"]), "Hi.", True, bad.get("max_new", 3), 0,
                       *values, api_name="/run")
    assert _request(client, "Hi.", seed=0)["status"].startswith("Ran 1 strategies")
