"""Every benchmark script starts as ``python benchmarks/X.py --help`` does, from an interpreter given no test paths.

The benchmarks are run by hand or by make targets, never by the suite, so a script whose imports broke
(after a module moved, or with its path set up after the project's imports) would only be found by the
next person measuring; this runs each one's argument parsing. A fresh interpreter per script cost 6-14 s
each (importing torch, transformers and gradio again), so tests/script_starts.py imports those once and forks
a pristine child per script; the planted scripts below prove that it still fails on what the check is for.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from script_starts import project_modules, run_scripts

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if p.name != "common.py" and "__main__" in p.read_text(encoding="utf-8"))
PATH_LINE = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))\n"    # the scripts' own header


def _mirror(root: Path) -> Path:
    """The repository's layout under ``root`` (each top-level entry linked) with a real benchmarks/ folder
    holding common.py, so a copied script finds the project exactly as the original does."""
    root.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("benchmarks", ".git"):
            (root / entry.name).symlink_to(entry)
    (root / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "common.py", root / "benchmarks" / "common.py")
    return root / "benchmarks"


def _planted(folder: Path) -> dict[str, Path]:
    """Copies of real scripts, good and broken, in the order they must run (the good ones first, so a runner
    that leaked one script's imports or sys.path into the next would let the broken ones pass)."""
    path_header = (ROOT / "benchmarks" / "sweep_suffix.py").read_text(encoding="utf-8")
    common_header = (ROOT / "benchmarks" / "bench_suffix.py").read_text(encoding="utf-8")
    first_import = "from decoding.harness.runner import encode_prompt  # noqa: E402\n"
    common_line = ("from common import ROOT, median, timed, write_json  "
                   "# first: it puts the repository root on sys.path\n")
    assert PATH_LINE in path_header and first_import in path_header and common_line in common_header
    assert "from decoding.strategies import" in path_header        # what relies_on_other leans on
    texts = {
        "good_path_header": path_header,
        "good_common_header": common_header,
        "missing_module": common_header.replace(common_line, common_line + "from decoding.no_such_module import x\n"),
        "path_after_import": path_header.replace(PATH_LINE + first_import, first_import + PATH_LINE),
        "relies_on_other": path_header.split(PATH_LINE)[0] + PATH_LINE + (
            "import decoding  # noqa: E402\n\n"
            "get_strategy = decoding.strategies.get_strategy   # loaded only where something imported it\n"
            "argparse.ArgumentParser().parse_args()\n"),
    }
    assert len(set(texts.values())) == len(texts)                 # every plant really changed its copy
    paths = {}
    for name, text in texts.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text, encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """One runner over every script and then the planted copies: runs {name: {rc, stdout, stderr}}, the
    runner's report and the planted scripts' paths."""
    work = tmp_path_factory.mktemp("script_starts")
    planted = _planted(_mirror(work / "repo"))
    doc = run_scripts([*SCRIPTS, *planted.values()], work)
    by_name = {p.stem: doc["scripts"].get(str(p)) for p in SCRIPTS}
    by_name.update({f"planted:{k}": doc["scripts"].get(str(p)) for k, p in planted.items()})
    return {"runs": by_name, "report": doc, "planted": planted}


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 10


def test_the_runner_preloads_no_project_module_and_runs_every_script(started):
    by_name, doc = started["runs"], started["report"]
    assert doc["project_modules"] == []
    assert doc["python_threads"] == 1, "a preloaded library started a thread: fork would copy its held locks"
    assert all(by_name.values()), [k for k, v in by_name.items() if not v]
    assert len(doc["scripts"]) == len(by_name)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_script_starts(script, started):
    run = started["runs"][script.stem]
    assert run is not None, "the runner did not run it"
    assert run["rc"] == 0, run["stderr"][-2000:]
    assert "usage" in run["stdout"].lower(), (run["stdout"][-2000:], run["stderr"][-2000:])


def _failed(run: dict, message: str) -> None:
    assert run["rc"] != 0 and "usage" not in run["stdout"].lower(), run
    assert message in run["stderr"], run["stderr"][-2000:]


def test_the_runner_passes_unchanged_copies_of_real_scripts(started):
    for name in ("good_path_header", "good_common_header"):
        run = started["runs"][f"planted:{name}"]
        assert run["rc"] == 0 and "usage" in run["stdout"].lower(), run


def test_the_runner_fails_a_script_importing_a_project_module_that_does_not_exist(started):
    _failed(started["runs"]["planted:missing_module"], "No module named 'decoding.no_such_module'")


def test_the_runner_fails_a_script_that_imports_the_project_before_putting_it_on_its_path(started):
    """Run after a good script that put the root on sys.path and imported decoding: only a fresh copy of the
    preloaded interpreter per script makes this fail."""
    _failed(started["runs"]["planted:path_after_import"], "No module named 'decoding'")


def test_the_runner_fails_a_script_relying_on_a_module_only_another_script_imported(started, monkeypatch):
    _failed(started["runs"]["planted:relies_on_other"], "has no attribute 'strategies'")
    import decoding.strategies  # noqa: F401  - where another script imported it, the same script starts
    import runpy
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", ["relies_on_other.py", "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(started["planted"]["relies_on_other"]), run_name="__main__")
    assert exit_.value.code == 0


def test_the_project_module_check_sees_the_project_and_not_the_libraries():
    import decoding.events  # noqa: F401
    found = project_modules()
    assert {"decoding", "decoding.events", "script_starts"} <= set(found)
    assert not {"torch", "transformers", "pytest", "json"} & set(found)


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


def test_the_half_linear_benchmark_times_its_products_and_checks_each_rows_bits(monkeypatch, own_kernel):
    attention_kernels = own_kernel
    bench = _bench_module("bench_half_linear")
    monkeypatch.setattr(bench, "HEAD", (512, 576))       # the LM head's shape, smaller: the same loops
    args = ["--layers", "1", "--rows", "1", "5", "--copies", "2", "--repeats", "1"]
    doc = bench.main(args)
    assert set(doc["rows"]) == {"1", "5"} and doc["copies"] == 2
    for m, row in doc["rows"].items():
        assert {"ours", "float32", "bf16-ours"} <= set(row["ms"]) and all(ms > 0 for ms in row["ms"].values())
        assert row["exact"] is True
        flops = 2 * sum(w.numel() for w in bench.weights(1, 1)[0]) * int(m)
        assert row["ours_gflops"] == pytest.approx(flops / row["ms"]["ours"] / 1e6)
    real = attention_kernels.half_linear                 # a kernel whose rows change with the row count is caught

    def drifting(x, w, bias):
        out = real(x, w, bias)
        return out + 1e-3 * (x.shape[0] > 1)
    monkeypatch.setattr(attention_kernels, "half_linear", drifting)
    assert bench.main(args)["rows"]["5"]["exact"] is False
    assert bench.main(["--layers", "0", "--rows", "1", "--copies", "1", "--repeats", "1"])["rows"]["1"]["exact"]
    with pytest.raises(SystemExit):
        bench.parse(["--rows", "0"])


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


def test_the_relaxed_benchmark_counts_what_each_acceptance_changes(tmp_path, tiny_model):
    """bench_relaxed on one unseen prompt: exact acceptance reproduces greedy (no differing token, no first
    difference), every method gets a row and a summary line per category and overall, and --json is written.
    On the tiny preset (tests/tiny_preset.py): the script's counting is the subject."""
    bench_relaxed = _bench_module("bench_relaxed")
    threads = torch.get_num_threads()
    try:
        doc = bench_relaxed.main(["--target", tiny_model, "--category", "humaneval:0", "--max-new-tokens", "6",
                                  "--threads", "1",
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


def test_the_start_benchmark_waits_for_the_line_the_start_logs_and_runs_distinct_prompts():
    """bench_start waits for web/startup.py's last log line (a copy of its text: the script imports nothing
    heavy before its arguments are parsed) and runs every prompt once: 10 quiet ones of 4 to 420 words, one of
    them >= 400, and new ones for the first, busy and after-busy runs."""
    from web.compute import NOT_RECORDED
    from web.startup import DONE_LINE, TICKED_LINE
    bench = _bench_module("bench_start")
    assert bench.DONE_LINE == DONE_LINE and bench.TICKED_LINE == TICKED_LINE and bench.NOT_RECORDED == NOT_RECORDED
    # a run not recorded: the reason is the first such line the app logged during it
    assert bench.not_recorded_reason(["[app] timing", f"{NOT_RECORDED} greedy's decode steps took 14 ms", "x",
                                      f"{NOT_RECORDED} other"]) == "greedy's decode steps took 14 ms"
    assert bench.not_recorded_reason(["[app] timing"]) == ""
    # claim 4 races what the page ticks: the last choice the start logged (a re-timed curve logs a second one)
    assert bench.ticked(["timing x", f"{TICKED_LINE} greedy, prophet", "not ticked by default here: lookahead ...",
                         f"{TICKED_LINE} greedy, prophet, lookahead"]) == ["greedy", "prophet", "lookahead"]
    assert bench.ticked(["timing x"]) == []
    plan = bench.prompt_plan()
    every = [t for group in plan.values() for t in group]
    assert len(set(every)) == len(every) == 15
    lengths = [bench.words(t) for t in plan["quiet"]]
    assert len(lengths) == 10 and min(lengths) == 4 and 400 <= max(lengths) <= 420
    assert [len(plan[k]) for k in ("first", "busy", "after")] == [1, 1, 3]
    assert bench.fingerprint({"results": [{"strategy": "greedy", "wall_s": 0.5, "token_ids": [1]}]}) != \
        bench.fingerprint({"results": [{"strategy": "greedy", "wall_s": 0.6, "token_ids": [1]}]})


def test_the_start_benchmarks_default_race_is_greedys_time_over_each_strategys_per_seed():
    """Claim 4 on a stand-in client: three seeds, each a distinct request; a speed-up is greedy's wall time over the
    strategy's in the same run (a 0.5 s prophet against a 1 s greedy is 2x, not 0.5x), the median over the runs,
    and one run whose tokens differ from greedy's marks the strategy."""
    bench = _bench_module("bench_start")
    walls = {1: (1.0, 0.5, 1.0), 2: (1.2, 0.4, 1.0), 3: (0.9, 0.6, 0.9)}
    asked = []

    class Job:
        def __init__(self, doc):
            self.doc = doc

        def result(self, timeout):
            return self.doc

    class Client:
        def submit(self, api_name, prompt, strategies, seed):
            asked.append((prompt, tuple(strategies), seed, api_name))
            g, p, l = walls[seed]
            return Job({"results": [
                {"strategy": "greedy", "wall_s": g, "tokens_per_s": 64 / g, "token_ids": [1, 2],
                 "params": {"fast": True}},
                {"strategy": "prophet", "wall_s": p, "token_ids": [1, 2],
                 "params": {"tree": True, "tree_nodes": 4, "draft_tokens": 6, "fast": True}},
                {"strategy": "lookahead", "wall_s": l, "token_ids": [1, 2] if seed != 2 else [1, 3]}]})

    got = bench.default_races(Client(), "Sleep?", ["greedy", "prophet", "lookahead"], 3, timeout=5)
    assert [a[2] for a in asked] == [1, 2, 3] and all(a[0] == "Sleep?" for a in asked) and got["prompt"] == "Sleep?"
    assert got["median"]["prophet"] == pytest.approx(2.0) and got["median"]["lookahead"] == pytest.approx(1.0)
    assert got["equal_every_run"] == {"prophet": True, "lookahead": False}
    assert got["runs"][0]["fast"] is True and got["greedy_tok_s_median"] == pytest.approx(64.0)
    assert got["runs"][0]["prophet_shape"] == {"tree": True, "tree_nodes": 4, "draft_tokens": 6}


def test_the_cpu_tables_race_gives_the_prophets_shape_to_the_prophet_only_and_prints_both_unseen_columns(
        monkeypatch):
    """The CPU table races the unseen prompts in the app's own mode too (the shape its start would choose): what
    would break it is the shape's parameters reaching the other strategies, or a row without that column (an older
    CPU's) not printing."""
    bench = _bench_module("bench_cpu_table")
    seen = []

    def race(lm, runs, repeats, max_new, prompt=None):
        seen.append(runs)
        names = [name for name, _ in runs]
        return {"speedup": dict.fromkeys(names, 1.0), "prophet_step_over_greedy_step": 1.5, "greedy_tok_s": 9.0,
                "equal_greedy": dict.fromkeys(names, True)}
    monkeypatch.setattr(bench, "default_race", race)
    bench._race(None, True, ["prophet", "prompt_lookup"], 1, 8, prophet={"tree_nodes": 2})
    assert seen[-1] == [("prophet", {"fast": True, "tree_nodes": 2}), ("prompt_lookup", {"fast": True})]
    bench._race(None, False, ["prophet"], 1, 8)
    assert seen[-1] == [("prophet", {"fast": False})]
    row = {"cpu": "CPU A", "label": "m (compiled)", "forward_ms": {"1": 8.0, "4": 9.0, "16": 16.0},
           "forward_16_over_1": 2.0, "greedy_tok_s": 100.0, "greedy_over_generate": 1.4,
           "prophet_step_in_greedy_steps": 1.9, "speedup": {"prophet": 1.2}, "equal_greedy": {"prophet": True},
           "prophet_unseen": {"median": 1.3, "prompts": 6}}
    table = bench.markdown([row, {**row, "cpu": "CPU B", "prophet_shape": "tree2",
                                  "prophet_unseen_app": {"median": 1.21, "prompts": 6}}]).splitlines()
    assert table[0].endswith("| prophet, unseen | prophet, unseen, the start's shape |")
    assert table[2].endswith("| 1.30× (6 prompts) | – |")
    assert table[3].endswith("| 1.30× (6 prompts) | 1.21× (tree2) |")
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_the_quality_benchmark_measures_the_served_mode_on_the_fast_path(monkeypatch):
    """``bench_quality --compiled``: a version's compiled greedy is its greedy on the fast path (as the race runs it),
    with the compiled forward switched off again after; none where the version does not compile here."""
    from decoding.runtime import compiled
    from tiny_models import tiny_causal
    bench = _bench_module("bench_quality")
    assert bench.parse(["--compiled"]).compiled and not bench.parse([]).compiled
    lm = tiny_causal("llama")
    lm.chat = False
    monkeypatch.setattr(compiled, "enable", lambda lm, publish=True: "refused here")
    assert bench.compiled_greedy_tokens(lm, ["a b c"], 4) is None
    runs = []
    monkeypatch.setattr(compiled, "compiler_missing", lambda: None)
    monkeypatch.setattr(compiled, "enable", lambda lm, publish=True: runs.append("on"))
    monkeypatch.setattr(compiled, "disable", lambda lm: runs.append("off"))
    monkeypatch.setattr(bench, "encode_prompt", lambda tok, text, chat: [3, 4, 5])

    def run_one(strategy, params, ids, pair, **kw):
        runs.append((strategy.name, params.fast, ids, kw["max_new_tokens"]))
        return type("R", (), {"token_ids": [7, 8]})(), 0.0, []
    monkeypatch.setattr(bench, "run_one", run_one)
    assert bench.compiled_greedy_tokens(lm, ["x", "y"], 4) == [[7, 8], [7, 8]]
    assert runs == ["on", ("greedy", True, [3, 4, 5], 4), ("greedy", True, [3, 4, 5], 4), "off"]


def test_the_cpu_tables_greedy_over_generate_is_per_token(monkeypatch):
    """``generate`` runs eagerly and ours in the race's mode, and an int8 version's compiled greedy can write a
    shorter text: the ratio is of seconds a token, so a run that stops sooner is not read as a faster one."""
    from types import SimpleNamespace
    bench = _bench_module("bench_cpu_table")
    ours, eager = SimpleNamespace(wall_s=1.0, token_ids=[1] * 34), SimpleNamespace(wall_s=3.0, token_ids=[1] * 57)
    runs = iter([(ours, eager)] * 4)
    monkeypatch.setattr(bench, "run_comparison", lambda *a, **kw: next(runs))
    monkeypatch.setattr(bench, "ModelPair", lambda lm: None)
    monkeypatch.setattr(bench, "encode_prompt", lambda tok, text, chat: [1])
    lm = SimpleNamespace(tokenizer=None)
    assert bench._generate_ratio(lm, True, 3, 64) == pytest.approx((3.0 / 57) / (1.0 / 34))
