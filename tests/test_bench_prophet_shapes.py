"""benchmarks/bench_prophet_shapes.py: every shape raced against greedy in one config, its parameters applied."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_prophet_shapes  # noqa: E402


def test_a_bad_shape_is_refused_by_name_before_any_work():
    with pytest.raises(argparse.ArgumentTypeError, match="NAME:KEY=V"):
        bench_prophet_shapes.parse_shape("tree_nodes=2")
    with pytest.raises(ValueError, match="tree_nodes"):
        bench_prophet_shapes.parse_shape("x:tree_nodes=-1")
    assert bench_prophet_shapes.parse_shape("c1:tree=false,draft_tokens=1") == (
        "c1", {"tree": "false", "draft_tokens": "1"})


@pytest.mark.bundled
def test_each_shape_is_raced_with_its_own_parameters_and_equals_greedy(tmp_path):
    """A chain of one draft token without the copy branch commits at most 2 tokens a target forward; the default
    tree commits more on the default example. A script that dropped a shape's parameters (every shape the default
    tree) would give the chain the tree's count and fail the first bound."""
    doc = bench_prophet_shapes.main([
        "--config", "smollm2-135m-instruct|eager", "--per-category", "0", "--repeats", "1",
        "--max-new-tokens", "12", "--shape", "chain1:tree=false,draft_tokens=1,lookup=false",
        "--shape", "tree8:tree_nodes=8", "--json", str(tmp_path / "shapes.json")])
    summary = doc["summary"]
    assert set(summary) == {"chain1", "tree8"}
    assert all(s["equal_greedy"] == 1 for s in summary.values())
    assert 1.0 <= summary["chain1"]["median_tokens_per_forward"] <= 2.0
    assert summary["tree8"]["median_tokens_per_forward"] > summary["chain1"]["median_tokens_per_forward"]
    saved = json.loads((tmp_path / "shapes.json").read_text())
    assert saved["config"] == "smollm2-135m-instruct|eager" and saved["rows"][0]["prompt"] == "default"
    assert saved["cpu"]
