"""Logits processors (generation settings): greedy, sampling and beam match generate; lossless strategies stay exact."""

from __future__ import annotations

import pytest
import torch
from test_baselines import generate_new
from test_prophet import random_prophet

from decoding.context import RunContext
from decoding.params import (
    VARIANTS,
    BeamParams,
    GreedyParams,
    JacobiParams,
    LookaheadParams,
    PromptLookupParams,
    ProphetParams,
    SampleParams,
    SpeculativeParams,
)
from decoding.processors import GenerationSettings, Processors
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator, probs
from decoding.strategies.baselines import beam, greedy, sample
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prompt_lookup, prophet, speculative

from tiny_models import ARCHS, prompt, tiny_causal, tiny_marian

F64 = torch.float64
SETTINGS = [GenerationSettings(repetition_penalty=4.0), GenerationSettings(no_repeat_ngram_size=2),
            GenerationSettings(repetition_penalty=0.8, no_repeat_ngram_size=3),
            GenerationSettings(forced_eos_token_id=2)]


def _ctx(settings):
    return RunContext(generation=settings)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("settings", SETTINGS)
def test_greedy_with_processors_matches_generate(arch, settings):
    lm = tiny_causal(arch, seed=1, scale=8.0)
    ids = prompt(6, 3) * 2
    plain = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24).token_ids
    ours = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24, context=_ctx(settings)).token_ids
    assert ours == generate_new(lm, ids, max_new_tokens=24, **settings.generate_kwargs())
    if settings.forced_eos_token_id < 0:
        assert ours != plain, "these settings must change this output, or the test proves nothing"


def test_min_new_tokens_holds_eos_back_like_generate():
    lm = tiny_causal("gptneox", seed=1, scale=8.0)
    ids = prompt(8, 1)
    plain = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=40).token_ids
    assert plain[-1] == 2 and len(plain) < 30                       # this model stops early by itself
    settings = GenerationSettings(min_new_tokens=len(plain) + 5)
    ours = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=40, context=_ctx(settings)).token_ids
    assert len(ours) >= len(plain) + 5
    assert ours == generate_new(lm, ids, max_new_tokens=40, **settings.generate_kwargs())


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_with_processors_matches_generate(arch):
    lm = tiny_causal(arch, seed=0, scale=8.0)
    ids = prompt(6, 10)
    for settings in SETTINGS[:3]:
        ours = beam(ids, ModelPair(lm), BeamParams(3), max_new_tokens=16, context=_ctx(settings)).token_ids
        assert ours == generate_new(lm, ids, max_new_tokens=16, num_beams=3, **settings.generate_kwargs())


def test_sampling_applies_processors_before_the_warpers_as_generate_does():
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
    )
    lm = tiny_causal("llama", seed=2)
    settings = GenerationSettings(repetition_penalty=1.5)
    ctx_ids = prompt(8, 4)
    proc = Processors(settings, lm, ctx_ids[:5], 20)
    logits = torch.randn(lm.vocab_size) * 3
    ours = probs(proc(ctx_ids[5:], logits), SampleParams(temperature=0.7, top_k=5))
    theirs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(0.7),
                                  TopKLogitsWarper(5)])(torch.tensor([ctx_ids]), logits[None].clone())[0].softmax(-1)
    assert torch.allclose(ours, theirs, atol=1e-6)
    # and sampling with top_k=1 under processors is greedy under processors
    ids = prompt(6, 3) * 2
    want = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=20, context=_ctx(settings)).token_ids
    got = sample(ids, ModelPair(lm), SampleParams(temperature=0.9, top_k=1), max_new_tokens=20,
                 rng=make_generator(0), context=_ctx(settings)).token_ids
    assert got == want


@pytest.mark.parametrize("arch", ARCHS)
def test_lossless_strategies_stay_identical_to_greedy_under_processors(arch):
    lm = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    helper = tiny_causal(arch, seed=5, scale=8.0, dtype=F64)
    seed_ids = prompt(6, 2)
    ids = seed_ids + greedy(seed_ids, ModelPair(lm), GreedyParams(), max_new_tokens=16).token_ids + seed_ids
    for settings in SETTINGS[:3]:
        ctx = _ctx(settings)
        ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=30, context=ctx).token_ids
        runs = {
            "speculative self chain": lambda: speculative(ids, ModelPair(lm, lm), SpeculativeParams(draft_tokens=4),
                                                          max_new_tokens=30, context=ctx),
            "speculative tree": lambda: speculative(ids, ModelPair(lm, helper), SpeculativeParams(
                tree=True, tree_topk=3, tree_nodes=8), max_new_tokens=30, context=ctx),
            "prompt lookup": lambda: prompt_lookup(ids, ModelPair(lm), PromptLookupParams(ngram_size=2),
                                                   max_new_tokens=30, context=ctx),
            "prophet tree": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)), ProphetParams(),
                                            max_new_tokens=30, context=ctx),
            "lookahead": lambda: lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=3),
                                           max_new_tokens=30, context=ctx),
        }
        for variant in VARIANTS:
            runs[f"jacobi {variant}"] = lambda v=variant: jacobi(ids, ModelPair(lm), JacobiParams(
                block_size=5, variant=v), max_new_tokens=30, context=ctx)
        for name, run in runs.items():
            assert run().token_ids == ref, (arch, settings, name)


def test_rows_processed_without_their_draft_path_would_be_caught(monkeypatch):
    """The mutant this suite must kill: verification processing every drafted row with the committed output
    only (forgetting the draft tokens above it). A drafter that proposes the right continuation is fully
    accepted with the right contexts, and diverges from greedy with the wrong ones."""
    from test_drafting import ScriptedDrafter

    from decoding.drafting import DraftLength
    from decoding.strategies.speculative import speculative_loop
    lm = tiny_causal("gpt2", seed=1, scale=8.0, dtype=F64)
    ids = prompt(6, 3) * 2
    ctx = _ctx(GenerationSettings(repetition_penalty=4.0, no_repeat_ngram_size=2))
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24, context=ctx).token_ids

    def run():
        drafter = ScriptedDrafter(ref, len(ids), tree=False)
        return speculative_loop(ids, ModelPair(lm), SpeculativeParams(), drafter, DraftLength(4, False),
                                max_new_tokens=24, context=ctx)
    good = run()
    assert good.token_ids == ref and good.stats["alpha"] == 1.0
    real = Processors.rows
    monkeypatch.setattr(Processors, "rows", lambda self, contexts, scores: real(self, [contexts[0]] * len(contexts),
                                                                                 scores))
    assert run().token_ids != ref


def test_jacobi_on_an_encoder_decoder_keeps_forced_bos_and_equals_greedy():
    lm = tiny_marian(seed=3)
    with torch.no_grad():
        lm.model.get_output_embeddings().weight.mul_(8.0)
    ids = prompt(7, 4) + [2]
    ctx = _ctx(GenerationSettings(forced_bos_token_id=17, repetition_penalty=2.0))
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=16, context=ctx).token_ids
    assert ref[0] == 17
    for variant in VARIANTS:
        assert jacobi(ids, ModelPair(lm), JacobiParams(block_size=4, variant=variant), max_new_tokens=16,
                      context=ctx).token_ids == ref, variant


def test_forced_bos_on_an_encoder_decoder_matches_generate():
    lm = tiny_marian(seed=0)
    with torch.no_grad():
        lm.model.get_output_embeddings().weight.mul_(8.0)
    ids = prompt(7, 4) + [2]
    settings = GenerationSettings(forced_bos_token_id=17)
    ours = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=12, context=_ctx(settings)).token_ids
    assert ours[0] == 17
    t = torch.tensor([ids])
    gen = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=12,
                            **settings.generate_kwargs())[0, 1:].tolist()
    assert ours == gen[:len(ours)] and len(ours) == len(gen) or (ours[-1] == 2 and gen[:len(ours)] == ours)


@pytest.mark.parametrize("values,message", [
    (dict(repetition_penalty=0.0), "repetition_penalty must be in (0, 10]"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be in [0, 16]"),
    (dict(min_new_tokens=2.5), "min_new_tokens must be an integer"),
    (dict(forced_eos_token_id=-2), "forced_eos_token_id must be in [-1, inf]"),
])
def test_settings_are_validated_by_name(values, message):
    with pytest.raises(ValueError) as err:
        GenerationSettings(**values)
    assert message in str(err.value)
    lm = tiny_causal("llama", seed=0)
    with pytest.raises(ValueError, match="forced_bos_token_id must be -1 .off. or a token id below 96"):
        Processors(GenerationSettings(forced_bos_token_id=96), lm, [1], 4)
    assert not GenerationSettings().active and GenerationSettings(min_new_tokens=1).active
