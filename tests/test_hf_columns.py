"""transformers' own generate as race columns (hf_greedy, hf_prompt_lookup, hf_assisted): the tokens are
``model.generate``'s, the forwards are counted from the model, Stop works, and the assisted column refuses
what it cannot run."""

from __future__ import annotations

import json

import pytest
import torch

from decoding.context import RunContext
from decoding.harness.runner import run_comparison
from decoding.params import GreedyParams, HFAssistedParams, HFGreedyParams, HFPromptLookupParams
from decoding.processors import GenerationSettings
from decoding.runtime.models import wrap_model
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy, registry
from decoding.strategies.baselines import greedy
from decoding.strategies.hf_generate import hf_assisted, hf_greedy, hf_prompt_lookup
from decoding.tracer import Tracer

from tiny_models import ARCHS, prompt, tiny_causal, tiny_marian


def generate_new(lm, ids, **kw):
    """``model.generate`` called directly: the new tokens, cut after the first EOS."""
    t = torch.tensor([ids])
    out = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, **kw)
    new = out[0, (1 if lm.is_encoder_decoder else len(ids)):].tolist()
    eos = set(lm.eos_token_ids)
    return next((new[: i + 1] for i, tok in enumerate(new) if tok in eos), new)


def ours(lm, ids, n, context=None):
    return greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=n, context=context).token_ids


def looping_prompt(seed: int) -> list[int]:
    """A prompt that repeats itself, so prompt lookup finds n-grams to copy."""
    base = prompt(6, seed)
    return base + base[:4] + base


def twin(lm):
    """Another loaded model with the target's weights (an assistant whose every draft the target accepts)."""
    copy = type(lm.model)(lm.model.config)
    copy.load_state_dict(lm.model.state_dict())
    copy.generation_config = lm.model.generation_config
    return wrap_model(copy, None, name="twin")


class CountForwards:
    """An independent count of the model's forward passes (not the strategy's own hooks)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# --------------------------------------------------------------------------- the registry

def test_registered_as_transformers_columns():
    reg = registry()
    for name in ("hf_greedy", "hf_prompt_lookup", "hf_assisted"):
        assert reg[name].label.startswith("transformers generate: "), name
        assert "transformers' own generate" in reg[name].description and reg[name].lossless
    assert reg["hf_assisted"].needs_assistant and not reg["hf_greedy"].needs_assistant
    assert get_strategy("hf_prompt_lookup").parse({"prompt_lookup_num_tokens": "4"}).prompt_lookup_num_tokens == 4
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens must be in"):
        get_strategy("hf_prompt_lookup").parse({"prompt_lookup_num_tokens": 0})
    with pytest.raises(ValueError, match="num_assistant_tokens_schedule must be one of"):
        get_strategy("hf_assisted").parse({"num_assistant_tokens_schedule": "heuristic"})


# --------------------------------------------------------------------------- generate's tokens

@pytest.mark.parametrize("arch", ARCHS)
def test_hf_greedy_is_generate_and_our_greedy(arch):
    for seed in (0, 1):
        lm = tiny_causal(arch, seed=seed, scale=8.0)
        ids = prompt(8, seed)
        got = hf_greedy(ids, ModelPair(lm), HFGreedyParams(), max_new_tokens=30).token_ids
        assert got == generate_new(lm, ids, max_new_tokens=30) == ours(lm, ids, 30), (arch, seed)


def test_hf_greedy_on_an_encoder_decoder():
    lm = tiny_marian(seed=0)
    ids = prompt(8, 3)
    got = hf_greedy(ids, ModelPair(lm), HFGreedyParams(), max_new_tokens=16)
    assert got.token_ids == generate_new(lm, ids, max_new_tokens=16) == ours(lm, ids, 16)
    assert got.target_forwards == len(got.token_ids)


def test_hf_greedy_stops_at_eos_like_generate():
    hits = 0
    for seed in range(8):
        lm = tiny_causal("gptneox", seed=seed)
        ids = prompt(6, seed)
        got = hf_greedy(ids, ModelPair(lm), HFGreedyParams(), max_new_tokens=40)
        assert got.token_ids == generate_new(lm, ids, max_new_tokens=40) == ours(lm, ids, 40)
        if got.stop_reason == "eos":
            hits += 1
            assert got.token_ids[-1] == 2 and got.target_forwards == len(got.token_ids)
    assert hits, "no seed reached EOS: the test does not test EOS"


def test_generation_settings_reach_generate():
    lm = tiny_causal("llama", seed=2, scale=8.0)
    ids = looping_prompt(2)
    settings = GenerationSettings(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=5)
    ctx = RunContext(generation=settings)
    ref = generate_new(lm, ids, max_new_tokens=24, **settings.generate_kwargs())
    assert ref != generate_new(lm, ids, max_new_tokens=24), "the settings change nothing: pick others"
    assert hf_greedy(ids, ModelPair(lm), HFGreedyParams(), max_new_tokens=24, context=ctx).token_ids == ref
    assert ours(lm, ids, 24, ctx) == ref
    got = hf_prompt_lookup(ids, ModelPair(lm), HFPromptLookupParams(), max_new_tokens=24, context=ctx).token_ids
    assert got == ref


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_prompt_lookup_is_generate_with_prompt_lookup(arch):
    drafted = accepted = 0
    for seed, (n_tokens, ngram) in enumerate([(10, 2), (3, 1), (5, 3)]):
        lm = tiny_causal(arch, seed=seed, scale=8.0)
        ids = looping_prompt(seed)
        params = HFPromptLookupParams(prompt_lookup_num_tokens=n_tokens, max_matching_ngram_size=ngram)
        with CountForwards(lm.model) as count:
            got = hf_prompt_lookup(ids, ModelPair(lm), params, max_new_tokens=30)
        ref = generate_new(lm, ids, max_new_tokens=30, prompt_lookup_num_tokens=n_tokens,
                           max_matching_ngram_size=ngram)
        assert got.token_ids == ref == ours(lm, ids, 30), (arch, seed)
        assert got.target_forwards == count.n > 0 and got.draft_forwards == 0
        assert got.stats["steps"] == got.target_forwards
        assert got.stats["mean_tokens_per_target_forward"] == round(len(ref) / count.n, 4)
        drafted += got.stats["drafted"]
        accepted += got.stats["accepted"]
    assert drafted > 0 and accepted > 0, "prompt lookup never copied: the test does not test drafting"


def test_hf_assisted_is_generate_with_the_assistant():
    for seed in (0, 1):
        lm = tiny_causal("llama", seed=seed, scale=8.0)
        for assistant in (tiny_causal("llama", seed=seed + 5, scale=8.0), twin(lm)):
            ids = prompt(8, seed)
            pair = ModelPair(lm, assistant)
            with CountForwards(lm.model) as target, CountForwards(assistant.model) as draft:
                got = hf_assisted(ids, pair, HFAssistedParams(), max_new_tokens=24)
            ref = generate_new(lm, ids, max_new_tokens=24, assistant_model=assistant.model)
            assert got.token_ids == ref == ours(lm, ids, 24), (seed, assistant.name)
            assert got.target_forwards == target.n and got.draft_forwards == draft.n > 0
            if assistant.name == "twin":     # every draft accepted: fewer target forwards than tokens
                assert got.stats["alpha"] == 1.0 and got.target_forwards < len(got.token_ids)


def test_hf_assisted_parameters_are_the_assistants_and_are_put_back():
    lm = tiny_causal("llama", seed=3, scale=8.0)
    assistant = twin(lm)
    assistant.model.generation_config = type(lm.model.generation_config).from_dict(
        lm.model.generation_config.to_dict())
    ids = prompt(8, 3)
    params = HFAssistedParams(num_assistant_tokens=3, num_assistant_tokens_schedule="heuristic_transient",
                              assistant_confidence_threshold=0.0)
    tracer = Tracer()
    got = hf_assisted(ids, ModelPair(lm, assistant), params, max_new_tokens=20, tracer=tracer)
    config = assistant.model.generation_config
    assert config.num_assistant_tokens is None and config.num_assistant_tokens_schedule is None
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = 3, "heuristic_transient"
    config.assistant_confidence_threshold = 0.0
    assert got.token_ids == generate_new(lm, ids, max_new_tokens=20, assistant_model=assistant.model)
    drafts = [e for e in tracer.events if type(e).__name__ == "DraftProposed"]
    assert drafts and len(drafts[0].tokens) == 3 and max(len(d.tokens) for d in drafts) > 3   # the schedule grew


# --------------------------------------------------------------------------- really generate

@pytest.mark.parametrize("name", ["hf_greedy", "hf_prompt_lookup", "hf_assisted"])
def test_the_column_is_what_generate_returned(name, monkeypatch):
    """A stand-in generate that streams and returns other tokens: the column shows those, so it is not our loop."""
    lm = tiny_causal("llama", seed=0, scale=8.0)
    pair = ModelPair(lm, tiny_causal("llama", seed=1, scale=8.0))
    ids = prompt(8, 0)
    calls = []
    fake = [7, 8, 9, 10]

    def stand_in(input_ids, **kwargs):
        calls.append(kwargs)
        kwargs["streamer"].put(input_ids.cpu())
        for tok in fake:
            lm.model(input_ids=torch.tensor([[tok]]))          # one forward per streamed token
            kwargs["streamer"].put(torch.tensor([tok]))
        kwargs["streamer"].end()
        return torch.cat([input_ids, torch.tensor([fake])], dim=1)
    monkeypatch.setattr(lm.model, "generate", stand_in)
    s = get_strategy(name)
    got = s.generate(ids, pair, s.parse({}), max_new_tokens=12, tracer=Tracer())
    assert len(calls) == 1 and got.token_ids == fake != ours(lm, ids, 12)[:4]
    assert got.target_forwards == len(fake)
    kwargs = calls[0]
    assert kwargs["do_sample"] is False and kwargs["max_new_tokens"] == 12
    assert ("prompt_lookup_num_tokens" in kwargs) == (name == "hf_prompt_lookup")
    assert (kwargs.get("assistant_model") is pair.assistant.model) == (name == "hf_assisted")


def test_a_stream_that_disagrees_with_the_return_is_an_error(monkeypatch):
    lm = tiny_causal("llama", seed=0, scale=8.0)

    def stand_in(input_ids, **kwargs):
        kwargs["streamer"].put(input_ids.cpu())
        kwargs["streamer"].put(torch.tensor([5]))
        return torch.cat([input_ids, torch.tensor([[6]])], dim=1)
    monkeypatch.setattr(lm.model, "generate", stand_in)
    with pytest.raises(RuntimeError, match="streamed"):
        hf_greedy(prompt(8), ModelPair(lm), HFGreedyParams(), max_new_tokens=4)


# --------------------------------------------------------------------------- forwards, events, Stop

@pytest.mark.parametrize("n", [1, 7, 19])
def test_hf_greedy_counts_one_forward_per_token(n):
    lm = tiny_causal("gpt2", seed=4, scale=8.0, eos=False)
    tracer = Tracer()
    with CountForwards(lm.model) as count:
        got = hf_greedy(prompt(8, 4), ModelPair(lm), HFGreedyParams(), max_new_tokens=n, tracer=tracer)
    assert len(got.token_ids) == n == got.target_forwards == count.n
    passes = [e for e in tracer.events if type(e).__name__ == "ForwardPass"]
    assert len(passes) == n and passes[0].kind == "prefill" and passes[0].positions == 8
    assert all(p.kind == "decode" and p.positions == 1 for p in passes[1:])
    commits = [e for e in tracer.events if type(e).__name__ == "TokenCommitted"]
    assert [c.token for c in commits] == got.token_ids and [c.step for c in commits] == list(range(1, n + 1))
    assert all(c.source == "greedy" and 0 < c.prob <= 1 for c in commits)
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks      # the hooks are gone


def test_drafted_steps_are_traced_from_what_the_target_checked():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    ids = looping_prompt(0)
    tracer = Tracer()
    got = hf_prompt_lookup(ids, ModelPair(lm), HFPromptLookupParams(), max_new_tokens=30, tracer=tracer)
    ev = tracer.events
    commits = [e for e in ev if type(e).__name__ == "TokenCommitted"]
    assert [c.token for c in commits] == got.token_ids
    sources = {c.source for c in commits}
    assert "accepted" in sources and sources <= {"accepted", "correction", "bonus"}
    for d in (e for e in ev if type(e).__name__ == "DraftProposed"):
        assert d.source == "prompt_lookup" and d.q == (1.0,) * len(d.tokens)
        verified = [e for e in ev if type(e).__name__ == "TokenVerified" and e.step == d.step]
        accepted = [v for v in verified if v.accepted]
        assert [v.token for v in accepted] == got.token_ids[d.position:d.position + len(accepted)]
        assert all(not v.accepted for v in verified[len(accepted):]) and len(verified) <= len(accepted) + 1
    timings = [e for e in ev if type(e).__name__ == "StepTiming"]
    assert len(timings) == got.target_forwards and sum(t.accepted for t in timings) == got.stats["accepted"]
    assert got.stats["accepted_lengths"] == [t.accepted for t in timings]


@pytest.mark.parametrize("name", ["hf_greedy", "hf_prompt_lookup"])
def test_stop_ends_generate(name):
    lm = tiny_causal("gpt2", seed=5, scale=8.0, eos=False)
    ids = looping_prompt(5)
    seen = {"n": 0}
    with CountForwards(lm.model) as count:
        results = run_comparison(ids, ModelPair(lm), [(name, {})], max_new_tokens=300, warmup=False,
                                 reference=False, on_progress=lambda i, s, n: seen.update(n=n),
                                 should_stop=lambda: seen["n"] >= 5)
    r = results[0]
    assert r.stop_reason == "cancelled" and r.error == "stopped by the user"
    assert 5 <= len(r.token_ids) < 40 and count.n < 40, "generate went on after Stop"
    assert r.token_ids == generate_new(lm, ids, max_new_tokens=len(r.token_ids))
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks


def test_through_the_runner_identical_to_greedy_with_times_and_an_importable_trace():
    from visualize.tokens import columns_html
    from visualize.traces import export_trace, import_trace
    lm = tiny_causal("llama", seed=1, scale=8.0)
    pair = ModelPair(lm, twin(lm))
    results = run_comparison(looping_prompt(1), pair, [("hf_greedy", {}), ("hf_prompt_lookup", {}),
                                                       ("hf_assisted", {})], max_new_tokens=20, seed=0)
    assert [r.strategy for r in results] == ["greedy", "hf_greedy", "hf_prompt_lookup", "hf_assisted"]
    for r in results[1:]:
        assert r.error is None and r.matches_greedy is True and r.label.startswith("transformers generate"), r
        assert r.speedup > 0 and len(r.times_ms) == len(r.events) > 0
        assert all(0 <= a <= b for a, b in zip(r.times_ms, r.times_ms[1:]))
        assert r.times_ms[-1] <= r.wall_s * 1e3 + 1.0
    assert results[3].draft_forwards > 0
    doc = import_trace(export_trace({"results": [r.to_dict() for r in results]}))
    assert json.dumps(doc) and "transformers generate: greedy" in columns_html(doc["results"])


# --------------------------------------------------------------------------- what assisted refuses

class _Vocab:
    def __init__(self, words):
        self.words = {w: i for i, w in enumerate(words)}

    def __len__(self):
        return len(self.words)

    def get_vocab(self):
        return dict(self.words)


def test_hf_assisted_refuses_what_it_cannot_run():
    lm = tiny_causal("llama", seed=0)
    ids = prompt(8)
    with pytest.raises(ValueError, match="needs an assistant model; the run has none"):
        hf_assisted(ids, ModelPair(lm), HFAssistedParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match="the target itself"):
        hf_assisted(ids, ModelPair(lm, lm), HFAssistedParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match="prophet head"):
        hf_assisted(ids, ModelPair(lm, None, prophet=object()), HFAssistedParams(), max_new_tokens=4)
    target = wrap_model(tiny_causal("llama", seed=0).model, _Vocab("abc"), name="t")
    other = wrap_model(tiny_causal("llama", seed=1).model, _Vocab("xyz"), name="a")
    with pytest.raises(ValueError, match="same-tokenizer assistant only; 'a' has a different tokenizer"):
        hf_assisted(ids, ModelPair(target, other), HFAssistedParams(), max_new_tokens=4)
    r = run_comparison(ids, ModelPair(lm), [("hf_assisted", {})], max_new_tokens=4, reference=False)
    assert "needs an assistant model" in r[0].error


@pytest.mark.parametrize("assistant", ["none", "prophet", "smollm2-135m-instruct"])
def test_the_web_service_refuses_assisted_without_an_assistant_model(assistant):
    from web.validation import build_plan, check_inputs, needs_assistant
    plan = build_plan(["greedy", "hf_assisted"], {})
    with pytest.raises(ValueError, match="transformers generate: assisted needs an assistant model"):
        check_inputs("smollm2-135m-instruct", assistant, "Hi", True, 8, 0, needs_assistant(plan), plan)
    assert check_inputs("smollm2-135m-instruct", "gemma-3-270m", "Hi", True, 8, 0, True, plan).assistant \
        == "gemma-3-270m"


# --------------------------------------------------------------------------- the CLI, the bundled model

def test_cli_runs_the_transformers_columns_on_the_bundled_model(tmp_path, capsys):
    from playground import cli
    from decoding.runtime.models import load_model
    out = tmp_path / "out.json"
    rc = cli.main(["run", "--target", "smollm2-135m-instruct", "--strategy", "greedy", "--strategy", "hf_greedy",
                   "--strategy", "hf_prompt_lookup", "--set", "prompt_lookup_num_tokens=4", "--chat",
                   "--prompt", "Repeat after me: the quick brown fox jumps over the lazy dog.",
                   "--max-new-tokens", "24", "--json", str(out), "--quiet", "--no-warmup"])
    assert rc == 0 and "hf_prompt_lookup" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    by = {r["strategy"]: r for r in doc["results"]}
    lm = load_model("smollm2-135m-instruct")
    ids = doc["prompt_ids"]
    assert by["hf_greedy"]["token_ids"] == generate_new(lm, ids, max_new_tokens=24) == by["greedy"]["token_ids"]
    assert by["hf_prompt_lookup"]["token_ids"] == generate_new(lm, ids, max_new_tokens=24,
                                                               prompt_lookup_num_tokens=4)
    assert by["hf_prompt_lookup"]["params"] == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2}
    assert by["hf_prompt_lookup"]["stats"]["accepted"] > 0      # it copied from the prompt
    assert all(by[n]["matches_greedy"] is True and by[n]["target_forwards"] > 0 for n in ("hf_greedy",
                                                                                         "hf_prompt_lookup"))
    assert by["hf_greedy"]["target_forwards"] == len(by["hf_greedy"]["token_ids"])
