"""The benchmark harness: interleaved timing, summaries, anchors, sweeps and reports."""

from __future__ import annotations

import json

import pytest

from decoding.harness import bench
from playground import cli
from visualize.charts import sweep_figure


def test_bench_cli_end_to_end(tmp_path, capsys, tiny_model):
    """One prompt per category: two categories, so the per-category and the "all" rows both appear. On the tiny
    preset (tests/tiny_preset.py): the command's tables, sweeps and anchors are the subject, not the model."""
    prompts = tmp_path / "p.yaml"
    prompts.write_text("chat:\n  - Say hello.\ncode:\n  - Write a Python add function.\n")
    out, html = tmp_path / "b.json", tmp_path / "b.html"
    rc = cli.main(["bench", "--target", tiny_model, "--strategy", "beam", "--set", "num_beams=2",
                   "--prompts", str(prompts),
                   "--repeats", "1", "--max-new-tokens", "4", "--sweep", "beam:num_beams=1,2",
                   "--json", str(out), "--html", str(html), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "| chat | greedy |" in table and "hf_greedy" in table
    doc = json.loads(out.read_text())
    assert {"environment", "rows", "summary", "sweeps", "methods"} <= set(doc)
    names = [m["name"] for m in doc["methods"]]
    assert names == ["greedy", "beam", "beam[num_beams=1]", "beam[num_beams=2]", "hf_greedy"]
    overall = {s["method"]: s for s in doc["summary"] if s["category"] == "all"}
    assert overall["greedy"]["speedup_geomean"] == pytest.approx(1.0)
    assert overall["hf_greedy"]["equals_greedy"] == "2/2", "our greedy must equal generate's"
    assert {r["category"] for r in doc["rows"]} == {"chat", "code"}
    assert [p["values"] for p in doc["sweeps"][0]["points"]] == [[1], [2]]
    assert doc["summary"][-1]["category"] == "all"
    assert "plotly" in html.read_text()


def test_prompt_set_and_sweep_parsing(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("a:\n  - one\n  - {prompt: two}\nb:\n  - three\n")
    assert bench.load_prompt_set(f) == [("a", "one"), ("a", "two"), ("b", "three")]
    assert bench.load_prompt_set(f, ["b"]) == [("b", "three")]
    assert bench.load_prompt_set(f, per_category=1) == [("a", "one"), ("b", "three")]
    assert bench.load_prompt_set(f, ["a:1", "b"]) == [("a", "two"), ("b", "three")]   # prompts by index
    with pytest.raises(ValueError, match="0-based prompt indices"):
        bench.load_prompt_set(f, ["a:first"])
    with pytest.raises(ValueError, match="no prompts"):
        bench.load_prompt_set(f, ["zzz"])
    strategy, keys, combos = bench.parse_sweep("beam:num_beams=1,2;length_penalty=0.5,1")
    assert strategy == "beam" and keys == ["num_beams", "length_penalty"] and len(combos) == 4
    with pytest.raises(ValueError, match="--sweep"):
        bench.parse_sweep("beam")
    assert bench.geomean([1.0, 4.0]) == pytest.approx(2.0)
    fig = sweep_figure({"strategy": "x", "keys": ["a", "b"],
                              "points": [{"values": [1, 2], "speedup": 1.5}, {"values": [2, 2], "speedup": 0.5}]})
    assert fig.data[0].type == "heatmap"
