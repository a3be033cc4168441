"""Jacobi decoding equals greedy for every variant and init, decoder-only and encoder-decoder."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from decoding.baselines import greedy
from decoding.events import event_to_dict
from decoding.jacobi import INITS, VARIANTS, JacobiParams, jacobi
from decoding.models import load_model
from decoding.params import GreedyParams
from decoding.result import ModelPair
from decoding.runner import encode_prompt
from decoding.sampling import make_generator
from decoding.tracer import Tracer
from tiny_models import prompt, tiny_causal, tiny_marian

F64 = torch.float64


def _check(lm, ids, n, **extra):
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids
    for variant, init, block in itertools.product(VARIANTS, INITS, (1, 5)):
        params = JacobiParams(block_size=block, variant=variant, init=init, **extra)
        res = jacobi(ids, ModelPair(lm), params, max_new_tokens=n, rng=make_generator(3))
        assert res.token_ids == ref, (variant, init, block)
        if variant != "jacobi":  # plain Jacobi may iterate past EOS; the hybrid exists to stop there
            assert res.target_forwards <= len(ref)
    return ref


@pytest.mark.parametrize("arch", ["llama", "gptneox", "gpt2"])
def test_decoder_only_variants_equal_greedy(arch):
    lm = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    _check(lm, prompt(8, 1), 30)


def test_eos_and_max_iterations_fallback():
    lm = tiny_causal("gptneox", seed=1, scale=8.0, dtype=F64)
    ref = _check(lm, prompt(8, 1), 40)
    assert ref[-1] == 2 and len(ref) < 40
    plain = jacobi(prompt(8, 1), ModelPair(lm), JacobiParams(block_size=16, variant="jacobi"), max_new_tokens=40)
    hybrid = jacobi(prompt(8, 1), ModelPair(lm), JacobiParams(block_size=16, variant="hybrid"), max_new_tokens=40)
    assert hybrid.target_forwards <= plain.target_forwards
    _check(tiny_causal("llama", seed=0, scale=8.0, dtype=F64), prompt(8, 1), 25, max_iterations=1)


def test_encoder_decoder_marian_equals_greedy():
    lm = tiny_marian(seed=0, dtype=F64)
    with torch.no_grad():  # sharpen the random model so its output is not one repeated token
        lm.model.get_output_embeddings().weight.mul_(8.0)
    ids = prompt(7, 4) + [2]
    ref = _check(lm, ids, 20)
    t = torch.tensor([ids])
    gen = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=20)[0, 1:]
    assert ref == gen.tolist()[: len(ref)]


def test_trace_records_iterations_and_does_not_change_tokens():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    ids = prompt(8, 1)
    plain = jacobi(ids, ModelPair(lm), JacobiParams(), max_new_tokens=20)
    tracer = Tracer()
    traced = jacobi(ids, ModelPair(lm), JacobiParams(), max_new_tokens=20, tracer=tracer)
    assert plain.token_ids == traced.token_ids
    its = [e for e in tracer.events if type(e).__name__ == "JacobiIteration"]
    assert its and all(1 <= e.converged <= len(e.guess) for e in its)
    json.dumps([event_to_dict(e) for e in tracer.events])


@pytest.mark.parametrize("bad,msg", [({"block_size": 0}, "block_size must be in [1, 64]"),
                                     ({"variant": "x"}, "variant must be one of"),
                                     ({"init": "zeros"}, "init must be one of"),
                                     ({"max_iterations": 0}, "max_iterations must be in")])
def test_params_validation(bad, msg):
    with pytest.raises(ValueError) as err:
        JacobiParams(**bad)
    assert msg in str(err.value)


def test_bundled_model_equals_greedy():
    lm = load_model("smollm2-135m-instruct")
    ids = encode_prompt(lm.tokenizer, "List the days of the week.", chat=True)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24).token_ids
    for variant in VARIANTS:
        res = jacobi(ids, ModelPair(lm), JacobiParams(block_size=6, variant=variant), max_new_tokens=24)
        assert res.token_ids == ref, variant
