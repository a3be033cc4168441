"""Relaxed (lossy) acceptance: ``acceptance = exact | lenient | typical`` on every drafting strategy.

What each test catches:
- the rules by hand: lenience applied the wrong way round (dividing p), Medusa's min(ε, δe^-H) written as a
  max, the target's own token after the path not the argmax at temperature 0, a tie between equally deep
  paths not broken by likelihood, a typical correction drawn from tokens below the threshold;
- the parameter reaches every strategy that verifies drafts (a strategy that bypasses ``stages.verify``);
- the default stays exact (greedy's tokens);
- a lenient or typical run not marked lossy (in the result and in its JSON), or an exact one marked;
- permissive thresholds accepting no more than exact (the rule not wired in);
- the cost: a miscounted difference (a length difference ignored, an off-by-one first index), a mean
  log-probability under the wrong distribution;
- bad values passing without a message naming the parameter and its range;
- the badge's text reaching the page unescaped; the marker at the wrong token.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from decoding.harness import runner as runner_mod
from decoding.harness.cost import differing_tokens, first_divergence
from decoding.harness.runner import RunResult, run_comparison
from decoding.params import (DraftedParams, GreedyParams, LookaheadParams, PromptLookupParams, SpeculativeParams,
                             SuffixParams, parse_params)
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies import registry, stages
from decoding.strategies.baselines import greedy
from decoding.tree import TokenTree
from decoding.relaxed import typical_threshold, verify_relaxed
from playground import cli
from visualize.checks import check_result
from visualize.tokens import column_html

from tiny_models import prompt, tiny_causal

pytestmark = pytest.mark.usefixtures("one_thread")

DRAFTING = ("speculative", "prompt_lookup", "suffix", "lookahead", "prophet")


def _logits(*rows: list[float]) -> torch.Tensor:
    """Rows of probabilities -> logits whose softmax gives them back."""
    return torch.tensor(rows, dtype=torch.float64).log()


# --------------------------------------------------------------------------- the rules, by hand

def test_lenient_at_temperature_0_accepts_within_the_factor_of_the_top():
    # root's row: token 1 is the argmax (0.5); the drafted siblings are token 2 (0.3) and token 3 (0.1);
    # below token 2 (node 0) the draft holds token 0, the argmax of that row
    tree = TokenTree(tokens=(2, 3, 0), parents=(-1, -1, 0))
    logits = _logits([0.1, 0.5, 0.3, 0.1], [0.6, 0.2, 0.1, 0.1], [0.25] * 4, [0.1, 0.1, 0.1, 0.7])
    wide = verify_relaxed(logits, tree, PromptLookupParams(acceptance="lenient", lenience=2.0), None)[0]
    assert wide.path == [0, 2] and wide.next_token == 3      # 2 * 0.3 >= 0.5; then node 2's row's argmax
    narrow = verify_relaxed(logits, tree, PromptLookupParams(acceptance="lenient", lenience=1.5), None)[0]
    assert narrow.path == [] and narrow.next_token == 1      # 1.5 * 0.3 < 0.5: greedy's own token
    assert narrow.tried == [(0, False)]


def test_typical_threshold_is_the_smaller_of_epsilon_and_delta_exp_minus_entropy():
    p = [0.66, 0.14, 0.1, 0.1]
    entropy = -sum(v * math.log(v) for v in p)
    tau = min(0.15, 0.3 * math.exp(-entropy))
    assert 0.1 < tau < 0.14 < 0.15                           # the δ-term binds, between the two drafted tokens
    assert float(typical_threshold(torch.tensor([p], dtype=torch.float64), 0.15, 0.3)[0]) == pytest.approx(tau)
    tree = TokenTree(tokens=(1, 2), parents=(-1, -1))
    logits = _logits(p, [0.2, 0.2, 0.2, 0.4], [0.7, 0.1, 0.1, 0.1])
    params = PromptLookupParams(acceptance="typical", posterior_threshold=0.15, posterior_alpha=0.3)
    verdict = verify_relaxed(logits, tree, params, None)[0]
    assert verdict.path == [0] and verdict.next_token == 3    # 0.14 > tau (with max(ε, ·) it would not pass)
    strict = PromptLookupParams(acceptance="typical", posterior_threshold=0.12, posterior_alpha=1.0)
    assert verify_relaxed(logits, tree, strict, None)[0].path == [0]   # ε binds: 0.14 > 0.12, 0.1 is not


def test_the_deepest_passing_path_wins_and_likelihood_breaks_ties():
    # two depth-2 branches that both pass the lenient test; the second is likelier
    tree = TokenTree(tokens=(1, 2, 0, 0), parents=(-1, -1, 0, 1))
    logits = _logits([0.1, 0.4, 0.5, 1e-9], [0.9, 0.05, 0.04, 0.01], [0.9, 0.05, 0.04, 0.01],
                     [0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.7, 0.1])
    verdict = verify_relaxed(logits, tree, PromptLookupParams(acceptance="lenient", lenience=2.0), None)[0]
    assert verdict.path == [1, 3] and verdict.next_token == 2


def test_typical_when_sampling_draws_the_target_token_from_above_the_threshold():
    tree = TokenTree(tokens=(3,), parents=(-1,))
    logits = _logits([0.45, 0.4, 0.1, 0.05], [0.25] * 4)        # token 3 (0.05) fails; 2 (0.1) is below too
    params = PromptLookupParams(temperature=1.0, acceptance="typical", posterior_threshold=0.2, posterior_alpha=1.0)
    drawn = {verify_relaxed(logits, tree, params, make_generator(seed))[0].next_token for seed in range(200)}
    assert drawn == {0, 1}


@pytest.mark.parametrize("lenience,expected", [(1.0, 0.3), (2.0, 0.6)])
def test_lenient_when_sampling_accepts_with_probability_min_1_lenience_p_over_q(lenience, expected):
    tree = TokenTree(tokens=(2,), parents=(-1,))                 # one deterministic draft: q is one-hot
    logits = _logits([0.5, 0.2, 0.3], [1 / 3] * 3)
    params = PromptLookupParams(temperature=1.0, acceptance="lenient", lenience=lenience)
    n = 3000
    gen = make_generator(0)
    accepted = sum(verify_relaxed(logits, tree, params, gen)[0].n_accepted for _ in range(n))
    assert abs(accepted / n - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


# --------------------------------------------------------------------------- the parameter, in every strategy

def test_every_drafting_strategy_has_the_acceptance_parameter_exact_by_default():
    for name in DRAFTING:
        cls = registry()[name].params_cls
        assert issubclass(cls, DraftedParams), name
        assert cls().acceptance == "exact" and not cls().lossy, name
    assert not issubclass(registry()["jacobi"].params_cls, DraftedParams)   # it verifies no drafts


def _pair(scale: float = 1.0):
    return ModelPair(tiny_causal("llama", seed=0, scale=scale), tiny_causal("llama", seed=7, scale=scale))


@pytest.mark.parametrize("name", ["speculative", "prompt_lookup", "suffix", "lookahead"])
def test_the_relaxed_rule_is_reached_through_the_one_verify_stage(name, monkeypatch):
    calls = []
    real = stages.verify_relaxed
    monkeypatch.setattr(stages, "verify_relaxed", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]                     # repeats: the copying drafters find matches
    strategy = registry()[name]
    fixed = {"window": 2} if name == "lookahead" else {}      # no forward-cost curve to time
    strategy.generate(ids, _pair(), strategy.parse({"acceptance": "lenient", **fixed}), max_new_tokens=12)
    assert calls
    calls.clear()
    strategy.generate(ids, _pair(), strategy.parse(fixed), max_new_tokens=12)
    assert not calls                                          # exact never goes there


@pytest.mark.parametrize("cls,name", [(SpeculativeParams, "speculative"), (PromptLookupParams, "prompt_lookup"),
                                      (SuffixParams, "suffix"), (LookaheadParams, "lookahead")])
def test_the_default_and_exact_stay_greedy(cls, name):
    pair = _pair(scale=8.0)
    for seed in (1, 2):
        ids = prompt(8, seed) * 2
        ref = greedy(ids, pair, GreedyParams(), max_new_tokens=30).token_ids
        fixed = {"window": 2} if cls is LookaheadParams else {}
        for params in (cls(**fixed), cls(acceptance="exact", **fixed), cls(acceptance="lenient", lenience=1.0, **fixed)):
            assert registry()[name].generate(ids, pair, params, max_new_tokens=30).token_ids == ref, params


def test_permissive_thresholds_accept_more_tokens_per_forward_than_exact():
    pair, ids = _pair(), prompt(8, 3)                          # a random assistant: exact rejects most drafts
    runs = {acc: registry()["speculative"].generate(
        ids, pair, SpeculativeParams(draft_tokens=4, adaptive=False, confidence_threshold=0.0, acceptance=acc, lenience=100.0,
                                     posterior_threshold=1e-4), max_new_tokens=40)
            for acc in ("exact", "lenient", "typical")}
    exact = runs["exact"].stats
    assert exact["alpha"] < 0.5
    for acc in ("lenient", "typical"):
        stats = runs[acc].stats
        assert stats["accepted"] > 2 * exact["accepted"], acc
        assert stats["mean_tokens_per_target_forward"] > exact["mean_tokens_per_target_forward"] + 1, acc


# --------------------------------------------------------------------------- marked lossy, and what it cost

def test_a_lenient_run_is_marked_lossy_and_reports_its_differences():
    pair, ids = _pair(scale=8.0), prompt(8, 1) * 2
    # (min_ngram=1: a tiny model's output rarely repeats a whole 3-gram, and a lenient run needs drafts to bend)
    results = run_comparison(ids, pair, [("prompt_lookup", {"acceptance": "lenient", "lenience": 100.0,
                                                            "min_ngram": 1}),
                                         ("speculative", {"acceptance": "typical"}), ("prompt_lookup", {})],
                             max_new_tokens=40, warmup=False)
    ref, lenient, typical, exact = results
    assert ref.reference and not ref.lossy
    for r in (lenient, typical):
        doc = json.loads(json.dumps(r.to_dict()))
        assert doc["lossy"] is True and doc["lossless"] is False and doc["matches_greedy"] is None
        assert doc["differing_tokens"] == differing_tokens(r.token_ids, ref.token_ids)
        assert doc["first_divergence"] == first_divergence(r.token_ids, ref.token_ids)
    assert lenient.differing_tokens > 0                       # lenience 100 on a tiny model changes the text
    assert exact.to_dict()["lossy"] is False and exact.matches_greedy is True and exact.differing_tokens is None
    # each column records its rule's own knobs only
    assert lenient.params["lenience"] == 100.0 and "posterior_alpha" not in lenient.params
    assert typical.params["posterior_threshold"] == 0.09 and "lenience" not in typical.params
    assert exact.params["acceptance"] == "exact" and "lenience" not in exact.params


def test_differences_are_counted_by_position_and_the_first_is_found():
    assert first_divergence([5, 6, 7, 8], [5, 6, 7, 8]) is None
    assert differing_tokens([5, 6, 7, 8], [5, 6, 7, 8]) == 0
    assert first_divergence([5, 6, 9, 8, 4], [5, 6, 7, 8]) == 2
    assert differing_tokens([5, 6, 9, 8, 4], [5, 6, 7, 8]) == 2      # position 2, and position 4 only one has
    assert first_divergence([5, 6], [5, 6, 7]) == 2 and differing_tokens([5, 6], [5, 6, 7]) == 1
    base = RunResult("greedy", "Greedy", {}, [5, 6, 7, 8], 1.0, 4)
    lossy = RunResult("prompt_lookup", "Prompt lookup", {"acceptance": "typical", "temperature": 0.0},
                      [5, 6, 9, 8, 4], 1.0, 3, lossy=True)
    runner_mod._compare_to_greedy([base, lossy])
    assert (lossy.first_divergence, lossy.differing_tokens, lossy.matches_greedy) == (2, 2, None)
    assert "lossy: 2 differ, first at pos 2" in runner_mod.summarize([base, lossy])[1]["= greedy"]


def test_a_sampled_run_reports_the_mean_log_probability_under_the_target():
    pair, ids = _pair(), prompt(8, 4)
    sampled, greedy_run = run_comparison(ids, pair, [("prompt_lookup", {"temperature": 1.0, "acceptance": "typical"}),
                                                     ("greedy", {})], max_new_tokens=12, warmup=False,
                                         reference=False)
    assert sampled.lossy and sampled.differing_tokens is None and greedy_run.target_logprob is None
    full = torch.tensor([ids + sampled.token_ids])
    with torch.no_grad():
        logp = pair.target.model(full).logits[0].float().log_softmax(-1)
    n = len(sampled.token_ids)
    expected = float(sum(logp[len(ids) - 1 + i, t] for i, t in enumerate(sampled.token_ids)) / n)
    assert sampled.target_logprob == pytest.approx(expected, abs=1e-4)


# --------------------------------------------------------------------------- refused with a message

@pytest.mark.parametrize("values,message", [
    ({"acceptance": "fuzzy"}, "acceptance must be one of exact, lenient, typical"),
    ({"acceptance": 3}, "acceptance must be text"),
    ({"lenience": 0.5}, "lenience must be in [1, 100]"),
    ({"lenience": 101}, "lenience must be in [1, 100]"),
    ({"lenience": "nan"}, "lenience must be finite"),
    ({"posterior_threshold": 0}, "posterior_threshold (Medusa's epsilon) must be in (0, 1), got 0.0"),
    ({"posterior_threshold": 1}, "posterior_threshold (Medusa's epsilon) must be in (0, 1), got 1.0"),
    ({"posterior_threshold": "x"}, "posterior_threshold must be a number"),
    ({"posterior_alpha": 0}, "posterior_alpha must be in (0, 1]"),
    ({"posterior_alpha": 1.5}, "posterior_alpha must be in (0, 1]"),
])
def test_bad_values_are_refused_naming_the_parameter(values, message):
    for name in ("speculative", "prophet", "lookahead"):
        with pytest.raises(ValueError) as err:
            parse_params(registry()[name].params_cls, values)
        assert message in str(err.value)


def test_the_cli_refuses_a_bad_acceptance_before_loading(capsys):
    assert cli.main(["run", "--prompt", "hi", "--quiet", "--strategy", "prompt_lookup",
                     "--set", "acceptance=loose"]) == 2
    assert "acceptance must be one of exact, lenient, typical" in capsys.readouterr().err


# --------------------------------------------------------------------------- on the page

def _result(**extra) -> dict:
    events = [{"type": "TokenCommitted", "step": i + 1, "position": i, "token": t, "source": "greedy", "prob": None}
              for i, t in enumerate((10, 11, 12))]
    return {"strategy": "prompt_lookup", "label": "Prompt lookup", "token_ids": [10, 11, 12],
            "pieces": ["a", "b", "c"], "events": events, "lossless": False, **extra}


def test_the_column_says_lossy_escaped_and_marks_the_first_difference():
    hostile = _result(lossy=True, params={"acceptance": "<script>x</script>"}, differing_tokens=2,
                      first_divergence=1)
    page = column_html(check_result(json.loads(json.dumps(hostile))))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "lossy · " in page and "2 of 3 tokens differ from greedy" in page and "position 1" in page
    marked = [chunk for chunk in page.split("<span class='") if chunk.startswith("dp-tok dp-diff")]
    assert len(marked) == 1 and "id 11:" in marked[0]           # the token at position 1, and only it
    exact = column_html(_result(lossless=True, matches_greedy=True, lossy=False))
    assert "lossy" not in exact and "dp-diff" not in exact


def test_a_sampled_lossy_column_shows_its_log_probability():
    page = column_html(_result(lossy=True, params={"acceptance": "typical", "temperature": 1.0},
                               target_logprob=-2.5))
    assert "mean log p of its tokens under the target -2.500" in page and "lossy · typical" in page


# --------------------------------------------------------------------------- the bundled model, by the CLI

def test_cli_marks_lenient_and_typical_runs_lossy_in_the_json(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = cli.main(["run", "--strategy", "prophet", "--strategy", "prompt_lookup",
                   "--set", "prophet.acceptance=typical", "--set", "prompt_lookup.acceptance=lenient",
                   "--prompt", "Write a haiku about the sea.", "--max-new-tokens", "24", "--json", str(out),
                   "--quiet", "--no-warmup"])
    assert rc == 0
    assert "lossy" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    by = {r["strategy"]: r for r in doc["results"]}
    assert by["greedy"]["lossy"] is False and by["greedy"]["matches_greedy"] is True
    for name in ("prophet", "prompt_lookup"):
        r = by[name]
        assert r["lossy"] is True and r["lossless"] is False and r["matches_greedy"] is None
        assert r["differing_tokens"] == differing_tokens(r["token_ids"], by["greedy"]["token_ids"])
        assert r["params"]["acceptance"] in ("typical", "lenient")
