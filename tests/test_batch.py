"""The batch race (issue 49, item 3): prompts of different lengths decoded as one batch, each row accepting its own
drafted tokens. Every row must equal its prompt's single-row greedy run, accept exactly what its single-row run
accepts, and count the steps it waited for the slowest row."""

from __future__ import annotations

import asyncio
import pytest
import torch

from decoding.harness.batch_race import batch_prompts, progress_steps, race_batch
from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams, PromptLookupParams, ProphetParams, SpeculativeParams
from decoding.runtime import ragged
from decoding.runtime.head import prophet_for
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from decoding.strategies.batched import MAX_BATCH, batch_generate, check_batch
from decoding.strategies.speculative import prompt_lookup, prophet, speculative
from decoding.tracer import Tracer
from playground.cli import main
from visualize.batchgrid import MAX_STEPS, batch_race_html

from test_prophet import random_prophet
from tiny_models import prompt, tiny_causal

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
N = 30
# prompts of different lengths (3 to 14 tokens), so every row but the longest is left-padded
PROMPTS = [prompt(5, 1), prompt(14, 2), prompt(8, 3), prompt(3, 4)]
# one repetitive prompt and two random ones: prompt lookup accepts differently in each row (tiny Llama, seed 0)
REPETITIVE = [[5, 6, 7, 8, 9] * 5, prompt(9, 2), prompt(4, 3)]
CHAIN = dict(draft_tokens=3, adaptive=False, confidence_threshold=0.0)
TREE = dict(tree=True, draft_tokens=4, tree_topk=3, tree_nodes=10, adaptive=False, confidence_threshold=0.0)


def _singles(run, prompts, pair, params):
    return [run(p, pair, params, max_new_tokens=N) for p in prompts]


def _greedy_tokens(target, prompts, n=N):
    return [greedy(p, ModelPair(target), GreedyParams(), max_new_tokens=n).token_ids for p in prompts]


@pytest.mark.parametrize("arch", ["llama", "gptneox"])
def test_every_row_equals_its_single_row_greedy_run(arch):
    """Padding, per-row positions and per-row masks: a row that saw another row's keys, a pad, or the wrong
    position would part from its greedy run. (Not the tiny GPT-2: random ones repeat a single token from any
    prompt, so a row fed the wrong positions or a pad's keys still repeats it; GPT-2 runs in the race test.)"""
    target = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    helper = tiny_causal(arch, seed=7, scale=8.0, dtype=F64)
    want = _greedy_tokens(target, PROMPTS)
    cases = [("greedy", ModelPair(target), GreedyParams(), None),
             ("speculative", ModelPair(target, helper), SpeculativeParams(**CHAIN), speculative),
             ("speculative", ModelPair(target, helper), SpeculativeParams(**TREE), speculative),
             ("speculative", ModelPair(target, target), SpeculativeParams(**CHAIN), speculative),
             ("prophet", ModelPair(target, prophet=random_prophet(target, 3)), ProphetParams(draft_tokens=3),
              prophet)]
    for name, pair, params, run in cases:
        rows = batch_generate(name, PROMPTS, pair, params, max_new_tokens=N)
        assert [r.token_ids for r in rows] == want, (arch, name, params)
        if run is not None:       # each row took part in exactly the forwards its single-row run needs
            alone = _singles(run, PROMPTS, pair, params)
            assert [r.target_forwards for r in rows] == [a.target_forwards for a in alone], (arch, name)


def test_each_row_accepts_its_own_number_of_tokens():
    """One repetitive prompt, others not: prompt lookup accepts differently per row. A batch whose rows shared one
    accepted length (the slowest's, or row 0's) would not reproduce each row's single-row accepted lengths."""
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    prompts = REPETITIVE
    # (min_ngram=1: on a tiny model's output only then does every row draft, and accept, something of its own)
    pair, params = ModelPair(target), PromptLookupParams(min_ngram=1)
    alone = _singles(prompt_lookup, prompts, pair, params)
    lengths = [a.stats["accepted_lengths"] for a in alone]
    assert len({sum(x) for x in lengths}) == len(prompts)          # the rows really accept differently
    rows = batch_generate("prompt_lookup", prompts, pair, params, max_new_tokens=N)
    assert [r.stats["accepted_lengths"] for r in rows] == lengths
    assert [r.token_ids for r in rows] == _greedy_tokens(target, prompts)


def test_waited_steps_count_the_steps_after_a_row_finished():
    """A row whose drafts are accepted more often finishes in fewer steps and then waits for the slowest row."""
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair, params = ModelPair(target), PromptLookupParams()
    tracer = Tracer()
    rows = batch_generate("prompt_lookup", REPETITIVE, pair, params, max_new_tokens=N, tracer=tracer)
    steps = [e for e in tracer.events if type(e).__name__ == "BatchStep"]
    total = rows[0].stats["batch_forwards"] - 1                    # the prefill is no step
    assert len(steps) == total == max(r.stats["steps"] for r in rows)
    alone = _singles(prompt_lookup, REPETITIVE, pair, params)
    for b, (row, one) in enumerate(zip(rows, alone)):
        assert row.stats["steps"] == one.target_forwards - 1
        assert row.stats["waited_steps"] == total - row.stats["steps"]
        assert row.stats["waited_steps"] == sum(b in s.waiting for s in steps)
        # while it waits a row feeds and commits nothing; before, it commits its accepted tokens plus one
        assert [s.committed[b] for s in steps if b in s.waiting] == [0] * row.stats["waited_steps"]
        assert [s.accepted[b] for s in steps if b not in s.waiting] == one.stats["accepted_lengths"]
    assert sum(r.stats["waited_steps"] for r in rows) > 0          # some row did wait for the slowest
    assert all(s.width == max(s.fed) for s in steps)


def test_compacting_the_holes_keeps_every_row_exact(monkeypatch):
    """Rejected drafts leave holes; compaction renumbers every row's columns (a wrong renumbering breaks rows)."""
    monkeypatch.setattr(ragged, "COMPACT_AFTER", 1)
    target = tiny_causal("gptneox", seed=0, scale=8.0, dtype=F64)
    helper = tiny_causal("gptneox", seed=7, scale=8.0, dtype=F64)
    seen = []
    real = ragged.RaggedBatch._select
    monkeypatch.setattr(ragged.RaggedBatch, "_select", lambda self, keep: (seen.append(len(keep)), real(self, keep)))
    rows = batch_generate("speculative", PROMPTS, ModelPair(target, helper), SpeculativeParams(**TREE),
                          max_new_tokens=N)
    assert seen                                                        # it did compact
    assert [r.token_ids for r in rows] == _greedy_tokens(target, PROMPTS)


@pytest.mark.parametrize("bad", [0, 9, -1, 2.5, "four", "", None, True, float("nan"), 10**30])
def test_bad_batch_values_are_refused(bad):
    with pytest.raises(ValueError, match=f"batch must be a whole number from 1 to {MAX_BATCH}"):
        check_batch(bad)


def test_batch_refuses_what_it_cannot_run():
    target = tiny_causal("llama", seed=0, dtype=F64)
    with pytest.raises(ValueError, match="strategy 'beam' runs one prompt at a time"):
        batch_generate("beam", PROMPTS, ModelPair(target), GreedyParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match="greedily"):
        batch_generate("speculative", PROMPTS, ModelPair(target, target), SpeculativeParams(temperature=1.0),
                       max_new_tokens=4)
    with pytest.raises(ValueError, match="batch must be a whole number from 1 to 8, got 9"):
        batch_generate("greedy", [PROMPTS[0]] * 9, ModelPair(target), GreedyParams(), max_new_tokens=4)
    assert check_batch("4") == 4 and check_batch(8) == 8


@pytest.mark.parametrize("value", ["9", "0", "x"])
def test_cli_refuses_a_bad_batch_before_loading(value, capsys):
    code = main(["run", "--batch", value, "--strategy", "greedy", "--prompt", "hi", "--target", "no-such-model"])
    assert code == 2
    assert "batch must be a whole number from 1 to 8" in capsys.readouterr().err


def test_batch_prompts_add_the_example_set_in_turn():
    texts = batch_prompts("my own prompt", 4)
    assert texts[0] == "my own prompt" and len(set(texts)) == 4
    assert batch_prompts("x", 1) == ["x"]


def test_the_race_reports_throughput_and_exactness_per_strategy():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair = ModelPair(target, target)
    entries = race_batch(PROMPTS[:3], pair, [("greedy", GreedyParams()), ("speculative", SpeculativeParams(**CHAIN))],
                         max_new_tokens=12, warmup=False)
    assert [e["strategy"] for e in entries] == ["greedy", "speculative"]
    for e in entries:
        assert e["rows_equal_greedy"] == 3 and e["batch"] == 3
        assert e["batch_tokens_per_s"] > 0 and e["single_tokens_per_s"] > 0 and e["throughput_ratio"] > 0
        assert all(r["accepted_lengths"] == r["single_accepted_lengths"] for r in e["rows"])
        assert len(e["events"]) == e["batch_forwards"] - 1
    assert entries[0]["batch_forwards"] < entries[0]["single_forwards"]   # one forward serves every row


def test_greedys_rows_run_once_and_are_the_reference_whatever_the_order(monkeypatch):
    """Greedy raced with its default parameters is the reference: its single-row runs are not run a second time
    (they once were, a whole set of greedy rows more per race); raced last, it still runs first and the entries
    keep the order asked for. Without greedy among the runs, an untimed reference runs once; greedy with other
    parameters is raced, not taken as the reference."""
    import decoding.harness.batch_race as batch_race
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair, prompts = ModelPair(target, target), PROMPTS[:3]
    want = _greedy_tokens(target, prompts, 8)
    calls: list[str] = []
    real = batch_race.run_one
    monkeypatch.setattr(batch_race, "run_one", lambda strategy, *a, **kw: calls.append(strategy.name) or
                        real(strategy, *a, **kw))
    spec = ("speculative", SpeculativeParams(**CHAIN))
    for runs, greedy_rows in [([("greedy", GreedyParams()), spec], 3), ([spec, ("greedy", GreedyParams())], 3),
                              ([spec], 3), ([spec, ("greedy", GreedyParams(fast=True))], 6)]:
        calls.clear()
        said: list[str] = []
        entries = race_batch(prompts, pair, runs, max_new_tokens=8, warmup=False, progress=said.append)
        assert len(said) == progress_steps(runs, warmup=False), said            # the progress bar's length
        assert [e["strategy"] for e in entries] == [name for name, _ in runs]
        assert calls.count("greedy") == greedy_rows and calls.count("speculative") == 3, (runs, calls)
        assert calls[:3] == ["greedy"] * 3, calls                  # the reference first
        for e in entries:
            assert e["rows_equal_greedy"] == 3 and [r["token_ids"] for r in e["rows"]] == want


def test_the_view_escapes_text_and_caps_the_steps():
    step = {"type": "BatchStep", "step": 2, "accepted": [3, 0], "committed": [4, 0], "fed": [4, 0], "width": 4,
            "waiting": [1]}
    entry = {"strategy": "<b>spec</b>", "batch": 2, "batch_tokens_per_s": "<i>9</i>", "single_tokens_per_s": 1,
             "throughput_ratio": 2.0, "events": [dict(step, step=i) for i in range(1, 1000)],
             "rows": [{"tokens": 8, "waited_steps": 0, "equals_greedy": True},
                      {"tokens": 2, "waited_steps": 999, "equals_greedy": False}]}
    page = batch_race_html([entry], labels=["<script>alert(1)</script>", 'a"b'])
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>spec" not in page and "<i>9" not in page
    assert 'a&quot;b' in page
    assert page.count(">wait</td>") == MAX_STEPS and page.count(">3</td>") == MAX_STEPS
    assert f"{999 - MAX_STEPS} later steps not drawn" in page


# --------------------------------------------------------------------------- bundled model

N_BUNDLED = 12


@pytest.fixture(scope="module")
def bundled():
    return load_model("smollm2-135m-instruct")


def test_bundled_model_rows_equal_their_greedy_runs(bundled):
    """12 tokens a row: a pad's keys or a shifted position changes a row's first tokens, and each drafted run
    verifies several drafts (chains and the head's trees) within them."""
    texts = ["Name three colours.", "Write a haiku about the sea, then explain it in one sentence.", "Hi"]
    ids = [encode_prompt(bundled.tokenizer, t, chat=True) for t in texts]
    assert len({len(i) for i in ids}) == 3
    want = _greedy_tokens(bundled, ids, N_BUNDLED)
    pair = ModelPair(bundled, prophet=prophet_for(bundled))     # the shipped head: chains and trees
    for name, params in [("greedy", GreedyParams()), ("speculative", SpeculativeParams(draft_tokens=3)),
                         ("prophet", ProphetParams(draft_tokens=3))]:
        rows = batch_generate(name, ids, pair, params, max_new_tokens=N_BUNDLED)
        assert [r.token_ids for r in rows] == want, name


def test_the_page_panel_runs_a_batch_race_and_escapes_the_prompt(bundled):
    from web.batch_panel import batch_race
    ask = dict(model="smollm2-135m-instruct", assistant="prophet", strategies=["prophet", "beam"], chat=True,
               max_new_tokens=4)
    with pytest.raises(ValueError, match="batch must be from 2 to 8 for a batch race"):   # said, never a blank view
        batch_race(prompt="<b>Hi</b>", batch=1, **ask)
    with pytest.raises(ValueError, match="batch must be a whole number from 1 to 8"):
        batch_race(prompt="Hi", batch=12, **ask)
    steps = []
    page = batch_race(prompt="<b>Hi</b>", batch=2, **ask, progress=lambda *step: steps.append(step))
    assert "&lt;b&gt;Hi&lt;/b&gt;" in page and "<b>Hi" not in page
    # greedy and the prophet: a warm-up, the rows one after another and the batch each (greedy's rows the reference)
    assert [(done, total) for done, total, _ in steps] == [(i, 6) for i in range(6)], steps
    assert steps[1][2] == "greedy: 2 rows one after another (the greedy reference)"
    assert "greedy: batch of 2" in page and "prophet: batch of 2" in page and "beam" not in page


def test_the_page_panel_computes_in_the_apps_line(monkeypatch):
    """A batch race is a computation in the app's line (it waits behind other visitors' runs and counts toward the
    line's bound), never a second computation beside a run: a full line is a message, not a race."""
    from web import batch_panel
    from web.crowd import QueueFull
    from web.app_object import PlaygroundApp
    app = PlaygroundApp()
    seen = []
    monkeypatch.setattr(batch_panel, "batch_race", lambda *values, settings, progress: seen.append(values) or
                        "<p>race</p>")
    started = app.line.started
    out = asyncio.run(batch_panel.shown(app, "m", "none", ["greedy"], "Hi", True, 8, 2))
    assert out == dict(value="<p>race</p>", visible=True) and len(seen) == 1
    assert app.line.started == started + 1

    def full(comp):
        raise QueueFull("queue full: 32 runs are waiting for the compute slot")
    monkeypatch.setattr(app.line, "submit", full)
    out = asyncio.run(batch_panel.shown(app, "m", "none", ["greedy"], "<b>Hi</b>", True, 8, 2))
    assert "queue full" in out["value"] and len(seen) == 1
    assert asyncio.run(batch_panel.shown(app, "m", "none", ["greedy"], "Hi", True, 8, 12))["value"].startswith("<p>batch")


def test_the_panel_shows_each_step_of_the_race_on_its_progress_bar(monkeypatch):
    """A batch race runs every strategy twice over every row (tens of seconds on a CPU): the press shows the place
    in line, then each step as it starts, at its share of the steps, on the handler's progress bar."""
    import threading
    from web import batch_panel
    from web.app_object import PlaygroundApp
    seen, shown_step = [], threading.Event()

    def race(*values, settings, progress):
        for step, message in enumerate(("greedy: warm-up", "greedy: 2 rows one after another")):
            shown_step.clear()
            progress(step, 4, message)
            # the next step only once the watcher (it looks every WATCH_S) put this one on the bar: no sleep to race
            assert shown_step.wait(30), f"the progress bar never showed {message!r}: {seen}"
        return "<p>race</p>"

    def bar(fraction, desc):
        seen.append((fraction, desc))
        if desc != "batch race: waiting for the compute slot":
            shown_step.set()
    monkeypatch.setattr(batch_panel, "batch_race", race)
    out = asyncio.run(batch_panel.shown(PlaygroundApp(), "m", "none", ["greedy"], "Hi", True, 8, 2, progress=bar))
    assert out == dict(value="<p>race</p>", visible=True)
    assert seen[0] == (0.0, "batch race: waiting for the compute slot")
    assert (0.0, "batch race: greedy: warm-up") in seen and (0.25, "batch race: greedy: 2 rows one after another") in seen


def test_a_failing_batch_race_is_said_in_the_view_without_server_paths(monkeypatch):
    """A press always shows something: the race's own failure (not a refusal) is a message in the view, its
    server paths redacted and its markup escaped, where a bare toast left the view hidden and a waiting page
    (or test) with nothing to read."""
    from web import batch_panel
    from web.app_object import PlaygroundApp

    def broken(*values, settings, progress):
        raise RuntimeError("<b>boom</b> in /srv/secret/decoding/strategies/batched.py")
    monkeypatch.setattr(batch_panel, "batch_race", broken)
    out = asyncio.run(batch_panel.shown(PlaygroundApp(), "m", "none", ["greedy"], "Hi", True, 8, 2))
    assert out["visible"] and out["value"].startswith("<p>The batch race failed: &lt;b&gt;boom&lt;/b&gt;")
    assert "/srv/secret" not in out["value"]
