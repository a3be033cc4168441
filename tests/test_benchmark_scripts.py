"""Every benchmark script starts from a fresh interpreter (``python benchmarks/X.py --help``).

The benchmarks are run by hand or by make targets, never by the suite, so a script whose imports broke
(after a module moved, or with its path set up after the project's imports) would only be found by the
next person measuring; this runs each one's argument parsing in its own process.
"""

from __future__ import annotations

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
