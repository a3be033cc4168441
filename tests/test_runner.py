"""The runner: reference greedy, speedups, exactness verdicts, failure isolation, cancellation."""

from __future__ import annotations

import json

import pytest

from decoding import strategies
from decoding.harness.runner import Cancelled, run_comparison, summarize
from decoding.params import GreedyParams
from decoding.result import Result
from decoding.runtime.pair import ModelPair
from decoding.strategies.strategy import Strategy

from tiny_models import prompt, tiny_causal


@pytest.fixture
def pair():
    return ModelPair(tiny_causal("llama", seed=0, scale=8.0))


def test_reference_greedy_and_json(pair):
    results = run_comparison(prompt(8), pair, [("sample", {"temperature": 0.7}), ("beam", {"num_beams": 2})],
                             max_new_tokens=12, seed=3)
    assert [r.strategy for r in results] == ["greedy", "sample", "beam"]
    assert results[0].reference and results[0].matches_greedy is True and results[0].speedup == 1.0
    assert all(r.speedup and r.speedup > 0 for r in results)
    assert results[1].matches_greedy is None  # not lossless: no verdict
    doc = json.loads(json.dumps([r.to_dict() for r in results]))
    assert doc[1]["params"] == {"temperature": 0.7, "top_k": 0, "top_p": 1.0, "fast": False}
    assert doc[0]["tokens_per_s"] > 0 and doc[0]["events"][0]["type"] == "ForwardPass"
    rows = summarize(results)
    assert rows[0]["strategy"] == "greedy (reference)" and rows[0]["= greedy"] == "yes"


def test_same_seed_same_tokens(pair):
    a = run_comparison(prompt(8), pair, [("sample", {})], max_new_tokens=12, seed=5, reference=False)
    b = run_comparison(prompt(8), pair, [("sample", {})], max_new_tokens=12, seed=5, reference=False)
    assert a[0].token_ids == b[0].token_ids


def _register(monkeypatch, strategy):
    reg = dict(strategies.registry())
    reg[strategy.name] = strategy
    monkeypatch.setattr(strategies, "_REGISTRY", reg)


def test_a_failing_strategy_is_isolated(pair, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")
    _register(monkeypatch, Strategy("boom", GreedyParams, boom, lossless=True))
    results = run_comparison(prompt(8), pair, [("boom", {}), ("beam", {})], max_new_tokens=8)
    by = {r.strategy: r for r in results}
    assert by["boom"].error == "RuntimeError: kaboom" and by["boom"].stop_reason == "error"
    assert by["beam"].error is None and len(by["beam"].token_ids) > 0


def test_divergence_is_reported(pair, monkeypatch):
    from decoding.strategies.baselines import greedy

    def off_by_one(prompt_ids, pair, params, **kw):
        res = greedy(prompt_ids, pair, params, **kw)
        return Result(res.token_ids[:3] + [(res.token_ids[3] + 1) % 96] + res.token_ids[4:], res.target_forwards)
    _register(monkeypatch, Strategy("wrong", GreedyParams, off_by_one, lossless=True))
    results = run_comparison(prompt(8), pair, [("wrong", {})], max_new_tokens=10)
    r = results[1]
    assert r.matches_greedy is False and r.first_divergence == 3
    assert r.divergence_margin > 0 and r.divergence_tokens[0] == results[0].token_ids[3]
    assert summarize(results)[1]["= greedy"].startswith("no (pos 3, top-2 margin ")


def test_progress_and_stop(pair):
    seen = []
    results = run_comparison(prompt(8), pair, [("beam", {"num_beams": 2})], max_new_tokens=10,
                             on_progress=lambda i, name, n: seen.append((i, name, n)))
    assert (0, "greedy", 10) in seen and (1, "beam", 10) in seen
    calls = {"n": 0}

    def stop_after_some():
        calls["n"] += 1
        return calls["n"] > 12
    results = run_comparison(prompt(8), pair, [("greedy", {})], max_new_tokens=200, warmup=False,
                             should_stop=stop_after_some)
    r = results[0]
    assert r.stop_reason == "cancelled" and r.error == "stopped by the user"
    assert 0 < len(r.token_ids) < 200, "a cancelled run keeps its partial tokens"


def test_time_limit_returns_partial_trace(pair):
    results = run_comparison(prompt(8), pair, [("greedy", {})], max_new_tokens=1000, warmup=False,
                             time_limit_s=0.05)
    r = results[0]
    assert r.error == "time limit reached" and r.events and len(r.token_ids) < 1000


def test_needs_assistant_message(pair, monkeypatch):
    from decoding.strategies.baselines import greedy
    _register(monkeypatch, Strategy("needy", GreedyParams, greedy, lossless=True, needs_assistant=True))
    r = run_comparison(prompt(8), pair, [("needy", {})], max_new_tokens=4)[1]
    assert r.error == "ValueError: strategy 'needy' needs an assistant model"


def test_cancelled_is_an_exception():
    assert issubclass(Cancelled, Exception)


def test_speedup_is_strategy_over_greedy_throughput(pair, monkeypatch):
    """A strategy that is slower than greedy gets a speedup below 1 (an inverted ratio would exceed 1)."""
    import time

    from decoding.strategies.baselines import greedy

    def slow(prompt_ids, pair, params, **kw):
        time.sleep(0.5)
        return greedy(prompt_ids, pair, params, **kw)
    _register(monkeypatch, Strategy("slow", GreedyParams, slow, lossless=True))
    ref, r = run_comparison(prompt(8), pair, [("slow", {})], max_new_tokens=12, seed=0)
    assert ref.reference and r.token_ids == ref.token_ids
    # the stored speedup is rounded to 4 decimals: that is the tolerance (an inverted ratio would be > 1)
    assert r.speedup == pytest.approx(r.tokens_per_s / ref.tokens_per_s, abs=5.1e-5)
    assert 0 < r.speedup < 1


def test_every_strategy_writes_a_trace_that_imports():
    """What the runner exports passes the import validation (event vocabularies, ranges, tree structure)."""
    from visualize.traces import export_trace, import_trace

    from tiny_models import tiny_causal as tiny
    pair = ModelPair(tiny("llama", seed=0, scale=8.0), tiny("llama", seed=1, scale=8.0))
    plan = [(name, {}) for name in strategies.registry() if name != "greedy"]
    results = run_comparison(prompt(8), pair, plan, max_new_tokens=12, seed=0, warmup=False)
    assert [r.strategy for r in results] == ["greedy"] + [name for name, _ in plan]
    doc = import_trace(export_trace({"results": [r.to_dict() for r in results]}))
    ran = [r for r in doc["results"] if not r.get("error")]
    assert len(ran) >= 5 and all(r["events"] for r in ran)
    kinds = {e["type"] for r in ran for e in r["events"]}
    assert {"ForwardPass", "TokenCommitted", "DraftProposed", "TokenVerified", "StepTiming"} <= kinds
    from visualize import acceptance, charts, windows
    from visualize.tokens import columns_html
    rs = doc["results"]                          # the imported trace (JSON: lists, not tuples) draws, every view
    assert columns_html(rs).count("class='dp-col'") == len(results)
    for figure in (charts.speed_chart, charts.forward_timeline, charts.source_counts, charts.time_breakdown,
                   charts.leviathan_chart, acceptance.accepted_length_histogram):
        assert figure(rs).data, figure.__name__
    la = next(r for r in rs if windows.has_steps(r))
    assert windows.lookahead_figure(la).data and "dp-window" in windows.lookahead_step_html(la, 3)
    drafted = next(r for r in rs if acceptance.inspectable_positions(r))
    assert acceptance.inspector(drafted, acceptance.inspectable_positions(drafted)[0]).data


def test_times_ms_one_per_event_non_decreasing_within_the_wall_time(pair):
    results = run_comparison(prompt(8), pair, [("sample", {"temperature": 0.9, "top_k": 5}), ("beam", {}),
                                               ("lookahead", {})], max_new_tokens=16, seed=1)
    for r in results:
        assert r.error is None and len(r.times_ms) == len(r.events) > 0, r.strategy
        assert all(0 <= a <= b for a, b in zip(r.times_ms, r.times_ms[1:])), r.strategy
        assert r.times_ms[-1] <= r.wall_s * 1e3 + 1.0, r.strategy        # the same clock as the wall time
        # ... in milliseconds: the last event comes near the end of the run (seconds would be 1000x smaller)
        assert r.times_ms[-1] >= 0.5 * r.wall_s * 1e3 - 1.0, (r.strategy, r.times_ms[-1], r.wall_s)
        assert r.to_dict()["times_ms"] == r.times_ms
    sample = results[1]
    filters = [e for e in sample.events if type(e).__name__ == "SamplingFilter"]
    assert len(filters) == len(sample.token_ids)                         # one sampling view per position
    untraced = run_comparison(prompt(8), pair, [("greedy", {})], max_new_tokens=4, trace=False, reference=False)
    assert untraced[0].events == [] and untraced[0].times_ms == []


def test_live_exposes_tokens_before_the_run_ends(pair, monkeypatch):
    """Another thread reads the running strategy's committed tokens while it still runs."""
    import threading
    import time

    from decoding.strategies.baselines import greedy
    from web.live import Live

    gate, seen = threading.Event(), {}

    def paused(prompt_ids, pair, params, tracer=None, **kw):
        class Pausing:                       # forwards every event, pausing after the 5th committed token
            enabled = True

            def emit(self, event):
                tracer.emit(event)
                if type(event).__name__ == "TokenCommitted" and event.position == 4:
                    gate.wait(30)
        return greedy(prompt_ids, pair, params, tracer=Pausing() if tracer.enabled else tracer, **kw)
    _register(monkeypatch, Strategy("paused", GreedyParams, paused, lossless=True))
    live = Live()
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("r", run_comparison(
        prompt(8), pair, [("paused", {})], max_new_tokens=12, warmup=False, live=live)))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = live.snapshot()
            running = snap["running"] or {}
            if running.get("strategy") == "paused" and len(running.get("token_ids") or ()) == 5:
                seen = snap
                break
            time.sleep(0.01)
    finally:
        gate.set()
        worker.join(60)
    assert seen, "the running strategy's tokens were never visible while it ran"
    assert [r["strategy"] for r in seen["done"]] == ["greedy"] and seen["waiting"] == []
    running = seen["running"]
    assert running["running"] is True and not running["warming"]
    assert len(running["times_ms"]) == len(running["events"])
    final = out["r"]
    assert running["token_ids"] == final[1].token_ids[:5]                 # what it showed is what it made
    if pair.target.tokenizer is not None:                                 # the tiny models have none
        assert all(str(t) in running["vocab"] for t in running["token_ids"])
    end = live.snapshot()
    assert end["running"] is None and [r["strategy"] for r in end["done"]] == ["greedy", "paused"]


def test_the_shown_tree_shape_is_the_one_the_run_used():
    """A tree's 0 means "the device's default shape": the column shows the numbers, not the 0."""
    from decoding.params import TREE_DEFAULTS
    pair = ModelPair(tiny_causal("llama", seed=0, scale=8.0), tiny_causal("llama", seed=1, scale=8.0))
    runs = [("speculative", {"tree": True}), ("speculative", {"tree": True, "tree_topk": 3, "tree_nodes": 5}),
            ("speculative", {"tree": False})]
    results = run_comparison(prompt(8), pair, runs, max_new_tokens=6, seed=0)
    shapes = [(r.params.get("tree_topk"), r.params.get("tree_nodes")) for r in results[1:]]
    assert shapes == [TREE_DEFAULTS["cpu"], (3, 5), (0, 0)]
    assert all(r.matches_greedy for r in results[1:])
