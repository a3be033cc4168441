"""Every benchmark script starts from a fresh interpreter (``python benchmarks/X.py --help``).

The benchmarks are run by hand or by make targets, never by the suite, so a script whose imports broke
(after a module moved, or with its path set up after the project's imports) would only be found by the
next person measuring; this runs each one's argument parsing in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if p.name != "common.py" and "__main__" in p.read_text(encoding="utf-8"))


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_script_starts(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # as a person runs it: no test paths
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout.lower()


def test_the_calibration_tally_counts_paths_depths_and_conditional_confidence():
    """prophet_calibration.tally on one hand-made tree: root children 0 (q .8) and 2 (q .1), node 1 (q .5) under
    node 0; the accepted path is 0 -> 1."""
    import collections
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from prophet_calibration import tally
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from decoding.events import DraftTree
    tree = DraftTree(step=0, position=0, tokens=(5, 6, 7), parents=(-1, 0, -1), q=(0.8, 0.5, 0.1), accepted=(0, 1))
    tables = {k: collections.defaultdict(lambda: [0, 0.0, 0]) for k in ("path", "depth", "own_given_parent")}
    tally([tree, object()], tables)
    assert {k: (n, round(s, 6), a) for k, (n, s, a) in tables["path"].items()} == \
        {8: (1, 0.8, 1), 4: (1, 0.4, 1), 1: (1, 0.1, 0)}                  # 0.8, 0.8 * 0.5, 0.1
    assert {k: (n, a) for k, (n, _, a) in tables["depth"].items()} == {1: (2, 1), 2: (1, 1)}
    assert {k: (n, a) for k, (n, _, a) in tables["own_given_parent"].items()} == {8: (1, 1), 5: (1, 1), 1: (1, 0)}


def _bench_module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _check_timed_pair(rows: list[dict], ours: str) -> None:
    """A forwards() table of an A/B benchmark at contexts 8 and 40: both sides timed, logits bit-identical,
    speedup = stock over ours (not inverted)."""
    assert [r["context"] for r in rows] == [8, 40]
    for r in rows:
        assert r["bit_identical"] is True
        assert r["stock_ms"] > 0 and r[ours] > 0
        assert r["speedup"] == pytest.approx(r["stock_ms"] / r[ours])


def test_the_attention_benchmark_times_both_kernels_and_compares_their_logits():
    from tiny_models import tiny_causal
    bench = _bench_module("bench_gqa_attention")
    lm = tiny_causal("llama")
    _check_timed_pair(bench.forwards(lm, (8, 40), 2), "grouped_ms")
    assert lm.model.config._attn_implementation in (bench.STOCK, bench.NAME)


def test_the_profiler_counts_only_greedys_one_position_decode_forwards():
    from decoding.events import ForwardPass
    profile = _bench_module("profile_prophet")
    events = [ForwardPass(step=0, model="target", positions=30, ms=90.0, kind="prefill"),
              ForwardPass(step=1, model="target", positions=1, ms=20.0, kind="decode"),
              ForwardPass(step=2, model="draft", positions=1, ms=1.0, kind="draft"),
              ForwardPass(step=3, model="target", positions=1, ms=22.0, kind="decode"),
              ForwardPass(step=4, model="target", positions=5, ms=30.0, kind="verify"), object()]
    assert profile.greedy_steps(events) == [20.0, 22.0]


def test_the_kv_cache_benchmark_times_both_caches_and_compares_their_logits(monkeypatch):
    from decoding.runtime import session as session_mod
    from decoding.runtime.kvcache import GrowingLayer
    from tiny_models import tiny_causal
    monkeypatch.setattr(session_mod, "new_dynamic_cache", session_mod.new_dynamic_cache)   # put back after
    bench = _bench_module("bench_kvcache")
    lm = tiny_causal("llama")
    _check_timed_pair(bench.forwards(lm, (8, 40), 2), "growing_ms")
    bench.use("stock")                       # the switch really swaps what the session builds
    s = session_mod.Session(lm)
    s.prefill([5, 6, 7])
    assert not any(isinstance(layer, GrowingLayer) for layer in s.cache.layers)
    bench.use("growing")                     # and the benchmark leaves the growing cache in place
    s = session_mod.Session(lm)
    s.prefill([5, 6, 7])
    assert all(isinstance(layer, GrowingLayer) for layer in s.cache.layers)


def test_the_unseen_benchmark_runs_every_method_and_greedy_on_the_fast_path_when_asked(monkeypatch, tmp_path):
    """``gpu.sh unseen`` measures the prophet, prompt lookup and lookahead on the fast path against fast greedy:
    every timed run (greedy included) must get fast=true, and the extra strategies their parameters."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_unseen
    from decoding.harness import runner
    seen = []

    def spy(strategy, params, ids, pair, **kw):
        seen.append((strategy.name, params.fast, getattr(params, "window", None)))
        return runner.run_one(strategy, params, ids, pair, **kw)
    monkeypatch.setattr(bench_unseen, "run_one", spy)
    threads = torch.get_num_threads()
    try:
        doc = bench_unseen.main(["--fast", "--strategy", "prompt_lookup", "--strategy", "lookahead:window=3",
                                 "--category", "humaneval:0", "--max-new-tokens", "4", "--repeats", "1",
                                 "--threads", "1", "--json", str(tmp_path / "u.json")])
    finally:
        torch.set_num_threads(threads)
    assert {name for name, _, _ in seen} == {"greedy", "prophet", "prompt_lookup", "lookahead"}
    assert all(fast for _, fast, _ in seen)
    assert {w for name, _, w in seen if name == "lookahead"} == {3}
    assert doc["fast"] is True and [s["method"] for s in doc["summary"]][:3] == ["defaults", "prompt_lookup",
                                                                                 "lookahead"]
    assert all(row["methods"][m]["equal"] for row in doc["rows"] for m in row["methods"])


def test_the_prompt_set_scripts_share_their_arguments_and_parsing(tmp_path):
    """benchmarks/common.py: the prompt-set and run arguments every unseen-prompt script takes, ``K=V`` specs
    (a value may hold ``=``), categories in first-seen order then "all", and a JSON write that makes its folder."""
    import argparse
    common = _bench_module("common")
    p = argparse.ArgumentParser()
    common.add_prompt_args(p)
    common.add_run_args(p)
    args = p.parse_args(["--category", "humaneval:1", "--category", "mtbench:0,2", "--max-new-tokens", "8"])
    assert (args.prompts, args.per_category, args.threads, args.target, args.json, args.max_new_tokens) == \
        (ROOT / "presets" / "bench_unseen.yaml", None, 2, "smollm2-135m-instruct", None, 8)
    import yaml
    unseen = yaml.safe_load((ROOT / "presets" / "bench_unseen.yaml").read_text(encoding="utf-8"))
    unseen = unseen.get("categories", unseen)
    picked = [(c, item["prompt"] if isinstance(item, dict) else item)
              for c, item in [("mtbench", unseen["mtbench"][0]), ("mtbench", unseen["mtbench"][2]),
                              ("humaneval", unseen["humaneval"][1])]]
    assert common.prompt_set(args) == picked                 # the file's order, the indices picked
    assert common.keyvals("exit_layer=24,note=a=b") == {"exit_layer": "24", "note": "a=b"}
    assert common.named_keyvals(["half:", "e20:exit_layer=20,draft_tokens=3"]) == \
        {"half": {}, "e20": {"exit_layer": "20", "draft_tokens": "3"}}
    rows = [{"category": "b", "n": 1}, {"category": "a", "n": 2}, {"category": "b", "n": 3}]
    assert [(c, [r["n"] for r in rs]) for c, rs in common.by_category(rows)] == \
        [("b", [1, 3]), ("a", [2]), ("all", [1, 2, 3])]
    from types import SimpleNamespace as Run
    results = {"greedy": Run(token_ids=[1, 2, 3, 4], target_forwards=4),
               "a": Run(token_ids=[1, 2, 3, 4], target_forwards=2), "b": Run(token_ids=[1, 2, 9], target_forwards=3)}
    row = common.prompt_row("code", "x" * 100, ["a", "b"], results, {"greedy": [2.0, 2.0, 5.0], "a": [1.0, 4.0, 1.0],
                                                                      "b": [4.0]})
    assert row == {"category": "code", "prompt": "x" * 80, "tokens": 4,       # medians, greedy's over the method's
                   "methods": {"a": {"speedup": 2.0, "tokens_per_forward": 2.0, "equal": True},
                               "b": {"speedup": 0.5, "tokens_per_forward": 1.0, "equal": False}}}
    line = common.speedup_line(3, "code", {"x": {"speedup": 1.5, "tokens_per_forward": 2.25, "equal": True},
                                           "y": {"speedup": 0.5, "tokens_per_forward": 1.0, "equal": False}})
    assert line == " 3 code       x:1.50x/2.25 y:0.50x/1.00 (DIFFERS)"
    out = tmp_path / "deeper" / "doc.json"
    common.write_json(None, {"a": 1})                       # no --json: nothing written, nothing raised
    common.write_json(out, {"a": [1, 2]})
    assert json.loads(out.read_text(encoding="utf-8")) == {"a": [1, 2]}


def test_the_relaxed_benchmark_counts_what_each_acceptance_changes(tmp_path):
    """bench_relaxed on one unseen prompt: exact acceptance reproduces greedy (no differing token, no first
    difference), every method gets a row and a summary line per category and overall, and --json is written."""
    bench_relaxed = _bench_module("bench_relaxed")
    threads = torch.get_num_threads()
    try:
        doc = bench_relaxed.main(["--category", "humaneval:0", "--max-new-tokens", "6", "--threads", "1",
                                  "--strategy", "prompt_lookup", "--acceptance", "exact", "--acceptance", "lenient",
                                  "--json", str(tmp_path / "r" / "relaxed.json")])
    finally:
        torch.set_num_threads(threads)
    [row] = doc["rows"]
    exact = row["methods"]["prompt_lookup/exact"]
    assert row["category"] == "humaneval" and exact["differing"] == 0 and exact["first_difference"] is None
    assert set(row["methods"]) == {"prompt_lookup/exact", "prompt_lookup/lenient"}
    assert [(s["category"], s["method"]) for s in doc["summary"]] == [
        ("humaneval", "prompt_lookup/exact"), ("humaneval", "prompt_lookup/lenient"),
        ("all", "prompt_lookup/exact"), ("all", "prompt_lookup/lenient")]
    assert doc["methods"]["prompt_lookup/lenient"]["acceptance"] == "lenient"
    assert json.loads((tmp_path / "r" / "relaxed.json").read_text())["rows"] == json.loads(json.dumps(doc["rows"]))
