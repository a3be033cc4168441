"""Self-speculative decoding (issue 49 item 1): the target drafts with some of its own layers, verifies with all.

What each test catches:
* exactness on three tiny architectures and every draft form: a verify forward that reads the draft's leftover
  positions (the early layers' cache not cut back per layer) or a draft that misreads the shared cache;
* the layer counts: a draft that runs every layer (no saving), or skips the wrong ones;
* sampling: a rejection that resamples from p instead of the residual (the chi-square test fails);
* refusals: bad exit_layer / skip_layers values and models it cannot split, each named with its range;
* the search: ``skip_layers=auto`` chooses the measured best and records every candidate;
* ``hf_early_exit``: transformers' own early exit gives greedy's tokens, really exits early (layer counts),
  and is refused where transformers would silently run every layer;
* the bundled model, the CLI and the app.
"""

from __future__ import annotations

import asyncio
import json
import types

import pytest
import torch

from decoding import verify as verify_mod
from decoding.drafting.selfdraft import candidate_sets, default_exit, predicted_speedup
from decoding.events import LayerSearch, event_to_dict
from decoding.params import GreedyParams, HFEarlyExitParams, SelfSpeculativeParams, parse_params
from decoding.runtime.layers import decoder_stack, layer_view
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy
from decoding.strategies.baselines import greedy
from decoding.strategies.hf_generate import hf_early_exit
from decoding.strategies.speculative import self_speculative
from decoding.tracer import Tracer
from visualize.checks import check_event
from visualize.trees import tree_at

from test_speculative import (_chi_square, _draw_outputs, _exact_model_distribution, _negative_control_fails, _outputs,
                              _passes)
from tiny_models import prompt, tiny_causal, tiny_marian

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64
BUNDLED = "smollm2-135m-instruct"
N_BUNDLED = 24
FORMS = [dict(), dict(exit_layer=1), dict(exit_layer=3, draft_tokens=6, adaptive=False, confidence_threshold=0.0),
         dict(skip_layers="2"), dict(skip_layers="1,2", draft_tokens=2), dict(skip_layers="auto")]


def _greedy(lm, ids, n):
    return greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_causal(arch, seed=0, scale=8.0, dtype=F64, layers=4) for arch in ("llama", "gpt2", "gptneox")}


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
def test_greedy_is_exact_for_every_draft_form(arch, models):
    lm = models[arch]
    for seed in (1, 2):
        ids = prompt(8, seed)
        ref = _greedy(lm, ids, 40)
        for values in FORMS:
            res = self_speculative(ids, ModelPair(lm), SelfSpeculativeParams(**values), max_new_tokens=40)
            assert res.token_ids == ref, (arch, seed, values)
            assert res.draft_forwards > 0 and res.stats["drafted"] > 0
            assert res.target_forwards <= len(ref)
    # a two-layer model drafts with its first layer
    two = tiny_causal(arch, seed=3, scale=8.0, dtype=F64)
    ids = prompt(8, 5)
    res = self_speculative(ids, ModelPair(two), SelfSpeculativeParams(), max_new_tokens=30)
    assert res.token_ids == _greedy(two, ids, 30) and res.stats["exit_layer"] == 1


def _count_layer_calls(lm):
    """Hooks counting each decoder layer's forwards; returns (counts list, handles)."""
    _, _, stack = decoder_stack(lm.model)
    counts = [0] * len(stack)

    def hook(i):
        def count(module, args, output):
            counts[i] += 1
        return count
    return counts, [layer.register_forward_hook(hook(i)) for i, layer in enumerate(stack)]


@pytest.mark.parametrize("values,runs", [(dict(exit_layer=1), {0}), (dict(), {0, 1}),
                                         (dict(exit_layer=3), {0, 1, 2}), (dict(skip_layers="1,2"), {0, 3}),
                                         (dict(skip_layers="2"), {0, 1, 3})])
def test_drafts_run_only_their_layers(values, runs, models):
    """Each draft forward runs exactly the draft's layers: a layer outside them runs once per target forward
    only. Fails if the draft ran every layer (no saving) or the wrong ones."""
    lm = models["llama"]
    counts, handles = _count_layer_calls(lm)
    try:
        res = self_speculative(prompt(8, 1), ModelPair(lm), SelfSpeculativeParams(**values), max_new_tokens=30)
    finally:
        for h in handles:
            h.remove()
    assert res.draft_forwards > 0
    expected = [res.target_forwards + (res.draft_forwards if i in runs else 0) for i in range(4)]
    assert counts == expected, (values, counts, expected)
    assert res.stats["draft_layers"] == len(runs)


def test_the_view_shares_the_weights_and_leaves_the_model_alone(models):
    lm = models["gpt2"]
    _, name, stack = decoder_stack(lm.model)
    view = layer_view(lm.model, [0, 2])
    ids = torch.tensor([prompt(6, 0)])
    before = lm.model(input_ids=ids).logits
    held = getattr(getattr(view, view.base_model_prefix), name)
    assert len(held) == 2 and held[0] is stack[0] and held[1] is stack[2]
    assert len(stack) == 4 and torch.equal(lm.model(input_ids=ids).logits, before)   # the model is untouched
    with pytest.raises(ValueError, match="runs layer 0"):
        layer_view(lm.model, [1, 2])


def test_the_trace_records_the_draft_form_and_the_view_names_it(models):
    lm = models["llama"]
    tracer = Tracer()
    res = self_speculative(prompt(8, 1), ModelPair(lm), SelfSpeculativeParams(exit_layer=3), max_new_tokens=20,
                           tracer=tracer)
    drafts = [e for e in tracer.events if type(e).__name__ == "DraftProposed"]
    assert drafts and all(e.source == "self" and e.layers == 4 and e.exit_layer == 3 and e.skipped == ()
                          for e in drafts)
    events = [event_to_dict(e) for e in tracer.events]
    for e in events:
        check_event(json.loads(json.dumps(e)))        # every event passes the import checks
    shown = tree_at({"events": events})
    assert shown["source"] == "self" and shown["layers"] == "layers 0-2 of 4 (exit after layer 2)"
    assert res.stats["exit_layer"] == 3
    skipped = tree_at({"events": [{**events[[e["type"] for e in events].index("DraftProposed")],
                                   "exit_layer": 4, "skipped": [1, 2]}]})
    assert skipped["layers"] == "2 of 4 layers (skipping 1, 2)"


def test_auto_search_measures_every_candidate_and_drafts_with_the_best(models):
    lm = models["gptneox"]
    tracer = Tracer()
    res = self_speculative(prompt(12, 4), ModelPair(lm), SelfSpeculativeParams(skip_layers="auto"),
                           max_new_tokens=20, tracer=tracer)
    found = [e for e in tracer.events if isinstance(e, LayerSearch)]
    assert [e.skipped for e in found] == candidate_sets(4) and all(e.step == 0 for e in found)
    best = max(found, key=lambda e: e.score)
    assert [e.chosen for e in found].count(True) == 1 and best.chosen
    assert tuple(res.stats["skipped"]) == best.skipped
    for e in found:     # the score is the prediction from the measured agreement and the layers run
        assert e.score == pytest.approx(predicted_speedup(e.agreement, 4, e.cost), abs=1e-3)
        assert e.cost == pytest.approx((4 - len(e.skipped)) / 4) and 0 <= e.agreement <= 1
    drafts = [e for e in tracer.events if type(e).__name__ == "DraftProposed"]
    assert drafts and all(e.skipped == best.skipped and e.exit_layer == 4 for e in drafts)
    assert res.stats["skip_search"][0]["skipped"] == list(found[0].skipped)
    for e in found:                                    # the search's events pass the import checks
        check_event(json.loads(json.dumps(event_to_dict(e))))


def test_candidate_sets_and_defaults():
    assert default_exit(30) == 15 and default_exit(2) == 1
    assert candidate_sets(2) == [(1,)]
    sets = candidate_sets(30)
    assert all(s and 0 not in s and 29 not in s for s in sets) and len(set(sets)) == len(sets) >= 3


@pytest.mark.parametrize("values,message", [
    (dict(exit_layer=-1), "exit_layer must be in [0, 1023]"),
    (dict(exit_layer=2.5), "exit_layer must be an integer"),
    (dict(skip_layers="0"), "skip_layers must list layer numbers in [1, 1023]"),
    (dict(skip_layers="2,x"), "skip_layers must list layer numbers"),
    (dict(skip_layers="3,3"), "skip_layers lists a layer twice"),
    (dict(skip_layers="2", exit_layer=3), "set exit_layer (an early exit) or skip_layers (a skipped set), not both"),
    (dict(draft_tokens=0), "draft_tokens must be in [1, 32]"),
    (dict(temperature=-1), "temperature must be in [0, 100]"),
    (dict(fast="true"), "unknown parameter(s) fast"),
])
def test_bad_parameters_are_refused_by_name(values, message):
    with pytest.raises(ValueError) as exc:
        parse_params(SelfSpeculativeParams, values)
    assert message in str(exc.value)


@pytest.mark.parametrize("values,message", [
    (dict(exit_layer=4), "exit_layer must be in [1, 3] for this model (4 decoder layers"),
    (dict(exit_layer=9), "exit_layer must be in [1, 3]"),
    (dict(skip_layers="2,4"), "skip_layers must name layers in [1, 3] for this model (4 decoder layers"),
])
def test_values_beyond_the_model_are_refused_with_its_range(values, message, models):
    with pytest.raises(ValueError) as exc:
        self_speculative(prompt(6, 0), ModelPair(models["llama"]), SelfSpeculativeParams(**values), max_new_tokens=4)
    assert message in str(exc.value)


def test_models_it_cannot_split_are_refused():
    with pytest.raises(ValueError, match="encoder-decoder"):
        self_speculative(prompt(6, 0), ModelPair(tiny_marian()), SelfSpeculativeParams(), max_new_tokens=4)
    one = tiny_causal("llama", seed=0, layers=1)
    with pytest.raises(ValueError, match="at least 2 decoder layers"):
        self_speculative(prompt(6, 0), ModelPair(one), SelfSpeculativeParams(), max_new_tokens=4)


@pytest.mark.parametrize("values,naive", [(dict(temperature=1.0, exit_layer=1, draft_tokens=2), True),
                                          (dict(temperature=0.8, top_k=4, skip_layers="1", draft_tokens=3), False)])
def test_sampling_matches_the_target_distribution(values, naive, monkeypatch, prefill_once):
    """Empirical distribution of the first two tokens of 3-token outputs (the second is a drafted position)
    against the target's, enumerated. With a draft far from the target (its first layer alone), resampling
    from p after a rejection instead of from the residual must fail the same test."""
    target = tiny_causal("llama", seed=0, vocab=6, eos=False, scale=4.0, layers=3)
    params = SelfSpeculativeParams(**values)
    ids, n = [1, 3, 4], 2000
    exact = _exact_model_distribution(target, ids, 2, params)
    assert abs(sum(exact.values()) - 1) < 1e-4

    def run(gen):
        res = self_speculative(ids, ModelPair(target), params, max_new_tokens=3, rng=gen)
        return res.token_ids[:2], res.stats["accepted"]
    counts, accepted = _draw_outputs(run, n, 11)
    stat, dof = _chi_square(counts, exact, n)
    assert _passes(stat, dof), (stat, dof)
    assert accepted > n // 4                     # drafts really were accepted, not only resampled
    if naive:
        monkeypatch.setattr(verify_mod, "residual_distribution", lambda p_row, q_row, token: p_row)
        _negative_control_fails(_outputs(lambda gen: run(gen)[0], 11), exact, n)


# --------------------------------------------------------------------------- transformers' early exit

def test_hf_early_exit_gives_greedys_tokens_and_really_exits_early(models):
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64, layers=4)
    ids = prompt(8, 2)
    ref = _greedy(lm, ids, 30)
    counts, handles = _count_layer_calls(lm)
    tracer = Tracer()
    try:
        res = hf_early_exit(ids, ModelPair(lm), HFEarlyExitParams(exit_layer=2), max_new_tokens=30, tracer=tracer)
    finally:
        for h in handles:
            h.remove()
    assert res.token_ids == ref
    assert res.draft_forwards > 0 and res.target_forwards < len(ref) + 1
    # the draft forwards ran layers 0 and 1 only; layers 2 and 3 ran once per target forward
    assert counts[2] == counts[3] == res.target_forwards
    assert counts[0] == counts[1] == res.target_forwards + res.draft_forwards
    assert lm.model.config.num_hidden_layers == 4                  # put back after the run
    drafts = [e for e in tracer.events if type(e).__name__ == "DraftProposed"]
    assert drafts and all(e.source == "self" and e.exit_layer == 2 and e.layers == 4 for e in drafts)
    assert get_strategy("hf_early_exit").lossless


def test_hf_early_exit_never_lowers_the_shared_models_config_while_it_drafts():
    """transformers lowers ``config.num_hidden_layers`` during its drafts. The run calls ``generate`` on a view with
    a config of its own, so whoever reads the shared model's config meanwhile (a background compile, another
    run) sees every layer: a run on the shared model itself reads 2 here at each draft."""
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64, layers=4)
    seen = []
    hook = lm.model.model.layers[0].register_forward_pre_hook(
        lambda module, args: seen.append((lm.model.config.num_hidden_layers,
                                          lm.model.model.config.num_hidden_layers)))
    try:
        res = hf_early_exit(prompt(8, 2), ModelPair(lm), HFEarlyExitParams(exit_layer=2), max_new_tokens=20)
    finally:
        hook.remove()
    assert res.draft_forwards > 0                                   # it drafted, with layers 0-1 only
    assert len(seen) == res.target_forwards + res.draft_forwards
    assert set(seen) == {(4, 4)}


def test_hf_early_exit_is_refused_where_transformers_would_run_every_layer(models):
    for arch in ("gpt2", "gptneox"):
        with pytest.raises(ValueError, match="does not cut"):
            hf_early_exit(prompt(6, 0), ModelPair(models[arch]), HFEarlyExitParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"exit_layer must be in \[1, 3\]"):
        hf_early_exit(prompt(6, 0), ModelPair(models["llama"]), HFEarlyExitParams(exit_layer=4), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"exit_layer must be in \[0, 1023\]"):
        HFEarlyExitParams(exit_layer=-2)


# --------------------------------------------------------------------------- the bundled model, CLI, app

@pytest.fixture(scope="module")
def bundled():
    from decoding.runtime.models import load_model
    return load_model(BUNDLED)


@pytest.mark.bundled
def test_bundled_model_every_form_equals_greedy(bundled):
    """24 tokens: each form still drafts 19-29 tokens and has most of them rejected (the verify after a draft
    with the draft's positions left in the cache breaks at the first one), at a third fewer forwards than 40."""
    from decoding.harness.runner import encode_prompt
    ids = encode_prompt(bundled.tokenizer, "List three colours of the rainbow, then explain why the sky is blue.",
                        chat=True)
    ref = _greedy(bundled, ids, N_BUNDLED)
    counts, handles = _count_layer_calls(bundled)
    try:
        res = self_speculative(ids, ModelPair(bundled), SelfSpeculativeParams(), max_new_tokens=N_BUNDLED)
    finally:
        for h in handles:
            h.remove()
    assert res.token_ids == ref and res.stats["exit_layer"] == 15 and res.stats["alpha"] > 0
    # 15 of the 30 layers per draft forward: the first 15 ran once more per draft than the last 15
    assert len(set(counts[:15])) == 1 and len(set(counts[15:])) == 1 and counts[15] == res.target_forwards
    assert counts[0] - counts[15] == res.draft_forwards > 0
    for values in (dict(exit_layer=24), dict(skip_layers="auto")):
        assert self_speculative(ids, ModelPair(bundled), SelfSpeculativeParams(**values),
                                max_new_tokens=N_BUNDLED).token_ids == ref, values
    assert hf_early_exit(ids, ModelPair(bundled), HFEarlyExitParams(exit_layer=24),
                         max_new_tokens=N_BUNDLED).token_ids == ref


def test_cli_runs_self_speculative_and_refuses_a_bad_exit_layer(tmp_path, capsys, tiny_model):
    """Through the CLI on the tiny preset (tests/tiny_preset.py: two layers, so the exit is layer 1 of 2): the
    subject is the command's plumbing; the bundled model's every form is checked above."""
    from playground import cli
    out = tmp_path / "out.json"
    assert cli.main(["run", "--target", tiny_model, "--strategy", "self_speculative", "--set", "exit_layer=1",
                     "--chat", "--prompt", "Name two planets.", "--max-new-tokens", "16", "--no-warmup", "--quiet",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["strategy"]: r for r in doc["results"]}
    assert rows["self_speculative"]["token_ids"] == rows["greedy"]["token_ids"]
    assert rows["self_speculative"]["matches_greedy"] and rows["self_speculative"]["params"]["exit_layer"] == 1
    assert rows["self_speculative"]["draft_forwards"] > 0
    capsys.readouterr()
    assert cli.main(["run", "--target", tiny_model, "--strategy", "self_speculative", "--set", "exit_layer=2",
                     "--prompt", "hi", "--max-new-tokens", "2", "--no-warmup", "--quiet"]) == 1   # failed, by name
    text = capsys.readouterr()
    assert "exit_layer must be in [1, 1]" in text.out + text.err


def test_the_app_lists_its_parameters_and_draws_its_column(tiny_model):
    from web import handlers
    from web.app_object import PlaygroundApp
    from web.validation import param_fields
    fields = {f for s, f in param_fields() if s == "self_speculative"}
    assert {"exit_layer", "skip_layers", "draft_tokens", "temperature"} <= fields and "fast" not in fields

    async def drain(agen):
        return [item async for item in agen]
    outs = asyncio.run(drain(handlers.run_playground(
        PlaygroundApp(), tiny_model, "none", ["self_speculative"], "Say hello.", True, 8, 0,
        {("self_speculative", "exit_layer"): 1}, request=types.SimpleNamespace(session_hash="s", request=None))))
    last = outs[-1]
    assert last["status"].startswith("Ran 2 strategies"), last["status"]
    html = str(last["columns"])
    assert html.count("class='dp-col") >= 2 and "Self-speculative" in html


def test_the_benchmark_script_times_the_draft_and_races_greedy(tiny_model, tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_self_speculative
    threads = torch.get_num_threads()
    try:
        doc = bench_self_speculative.main(["--category", "humaneval:0", "--max-new-tokens", "6", "--repeats", "1",
                                           "--threads", "1", "--variant", "e1:exit_layer=1", "--cost-repeats", "1",
                                           "--context", "16", "--target", tiny_model,
                                           "--json", str(tmp_path / "b.json")])
    finally:
        torch.set_num_threads(threads)
    cost = doc["draft_cost"]["e1"]
    assert cost["layer_share"] == pytest.approx(1 / 2, abs=1e-3) and cost["exit_layer"] == 1
    assert 0 < cost["draft_ms"] and 0 < cost["full_ms"]
    assert [s["method"] for s in doc["summary"]] == ["e1"] and doc["summary"][0]["equal"] == 1
    assert json.loads((tmp_path / "b.json").read_text())["rows"][0]["methods"]["e1"]["exit_layer"] == 1


def test_relaxed_acceptance_reaches_the_self_drafter_and_marks_the_run_lossy(models):
    """``acceptance`` is a parameter of every drafting strategy (issue 49 item 2), self-speculation included: with
    permissive thresholds its early-exit drafts are accepted far more often than the exact rule accepts them, and
    the run says it is lossy (a self-drafter that bypassed the relaxed rules, or a run left unmarked, fails)."""
    from decoding.harness.runner import run_comparison
    lm = models["llama"]
    ids = prompt(10, seed=4)
    base = dict(exit_layer=1, draft_tokens=4, adaptive=False, confidence_threshold=0.0)
    results = run_comparison(ids, ModelPair(lm), [
        ("self_speculative", base),
        ("self_speculative", {**base, "acceptance": "lenient", "lenience": 100.0}),
        ("self_speculative", {**base, "acceptance": "typical", "posterior_threshold": 1e-4})],
        max_new_tokens=32, warmup=False, trace=False)
    ref, exact, lenient, typical = results
    assert exact.token_ids == ref.token_ids and not exact.lossy
    for relaxed in (lenient, typical):
        assert relaxed.lossy and relaxed.to_dict()["lossy"] is True
        assert relaxed.stats["accepted"] > exact.stats["accepted"]
        assert relaxed.target_forwards < exact.target_forwards
