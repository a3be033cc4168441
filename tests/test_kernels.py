"""CPU linear kernels per bucket of row counts (decoding/runtime/kernels.py): same model, same tokens, faster forwards."""

from __future__ import annotations

import pytest
import torch
from test_prophet import random_prophet
from torch import nn

from decoding.params import (
    GreedyParams,
    JacobiParams,
    LookaheadParams,
    PromptLookupParams,
    ProphetParams,
    SpeculativeParams,
)
from decoding.runtime import kernels
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prompt_lookup, prophet, speculative

from tiny_models import prompt, tiny_causal

pytestmark = pytest.mark.skipif(not kernels.available(), reason="this PyTorch build has no oneDNN linear ops")


def _logits(lm, ids):
    with torch.no_grad():
        return lm.model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch", ["llama", "gptneox"])
def test_packing_keeps_parameters_ties_and_logits(arch):
    lm = tiny_causal(arch, seed=3)
    plain_linears = sum(type(m) is nn.Linear for m in lm.model.modules())
    keys = set(lm.model.state_dict())
    before = _logits(lm, prompt(12, 5))

    from decoding.runtime.models import model_bytes
    before_bytes = model_bytes(lm)
    assert kernels.pack_linears(lm.model) == plain_linears > 0
    assert kernels.is_packed(lm.model)
    assert model_bytes(lm) == before_bytes + kernels.packed_bytes(lm.model) > before_bytes
    assert not any(type(m) is nn.Linear for m in lm.model.modules())
    assert set(lm.model.state_dict()) == keys, "packing must not rename or add state_dict entries"
    out, inp = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    if lm.model.config.tie_word_embeddings:
        assert out.weight is inp.weight, "tied embeddings must stay tied"
    after = _logits(lm, prompt(12, 5))
    assert torch.allclose(after, before, rtol=1e-4, atol=1e-4)

    assert kernels.unpack_linears(lm.model) == plain_linears
    assert not kernels.is_packed(lm.model)
    assert torch.allclose(_logits(lm, prompt(12, 5)), before, rtol=0, atol=0)


def test_one_row_and_many_rows_agree_with_f_linear():
    torch.manual_seed(0)
    layer = nn.Linear(96, 320)
    packed = kernels.PackedLinear(layer)
    with torch.no_grad():
        for shape in [(1, 96), (5, 96), (2, 7, 96), (1, 1, 96)]:
            x = torch.randn(*shape)
            want = nn.functional.linear(x, layer.weight, layer.bias)
            got = packed(x)
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


LOW_DEFAULT = ("default", "default", "packed", "packed", "packed", "packed")   # default 1-3 rows, packed 4+
LOW_PACKED = ("packed", "default", "default", "default", "default", "packed")   # the other way round (and prefill packed)


def test_each_bucket_runs_the_kernel_its_choice_names():
    # a packed copy of a zero matrix: the output shows which kernel ran (bias only = packed)
    torch.manual_seed(0)
    layer = nn.Linear(96, 320)
    mixed = kernels.PackedLinear(layer, LOW_DEFAULT)
    object.__setattr__(mixed, "packed", kernels._pack(torch.zeros(320, 96)))
    with torch.no_grad():
        for shape in [(1, 96), (1, 3, 96), (2, 96), (4, 96), (2, 2, 96), (9, 96), (17, 96), (64, 96), (200, 96)]:
            x = torch.randn(*shape)
            rows = x.numel() // 96
            packed_ran = torch.allclose(mixed(x), layer.bias.expand(*shape[:-1], 320))
            assert packed_ran == (rows >= 4), (shape, rows)
    assert [kernels.bucket_label(kernels.bucket_of(r)) for r in (1, 2, 3, 4, 9, 10, 17, 18, 64, 65, 4096)] == \
        ["1", "2-3", "2-3", "4-9", "4-9", "10-17", "10-17", "18-64", "18-64", "65+", "65+"]
    with pytest.raises(ValueError, match="row buckets"):
        kernels.PackedLinear(layer, ("packed", "default"))


@pytest.mark.parametrize("arch", ["llama", "gptneox"])
@pytest.mark.parametrize("plan", [LOW_DEFAULT, LOW_PACKED])
def test_mixed_dispatch_gives_the_default_kernels_logits(arch, plan):
    lm = tiny_causal(arch, seed=5)
    ids = prompt(80, 9)
    with torch.no_grad():
        want = [lm.model(torch.tensor([ids[:n]])).logits for n in (1, 3, 6, 80)]
        assert kernels.apply(lm.model, plan) > 0
        got = [lm.model(torch.tensor([ids[:n]])).logits for n in (1, 3, 6, 80)]
    assert kernels.label(lm.model).startswith("mixed: ")
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_table_packs_only_the_shapes_that_use_it():
    lm = tiny_causal("llama", seed=1)
    head = kernels.shape_of(lm.model.get_output_embeddings())
    table = {head: LOW_DEFAULT}                      # every other shape: default everywhere
    table.update({kernels.shape_of(c): kernels.ALL_DEFAULT for _, _, c in kernels.linear_layers(lm.model)
                  if kernels.shape_of(c) != head})
    assert kernels.apply(lm.model, table) == 1
    assert kernels.packed_bytes(lm.model) == lm.model.get_output_embeddings().weight.numel() * 4
    rows = kernels.bucket_kernels(lm.model)
    assert [r["kernel"] for r in rows] == ["default", "default"] + ["mixed"] * 4
    assert 0 < rows[2]["packed_share"] < 1
    assert kernels.apply(lm.model, "default") == 0 and not kernels.is_packed(lm.model)
    assert kernels.label(lm.model) == "default"


def test_gradients_and_foreign_inputs_fall_back_to_f_linear():
    layer = nn.Linear(16, 8)
    packed = kernels.PackedLinear(layer)
    x = torch.randn(3, 16, requires_grad=True)
    y = packed(x)                       # training through a frozen head needs autograd
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.no_grad():               # a dtype the weights were not packed for: F.linear decides
        assert not packed.usable(torch.randn(2, 16, dtype=torch.float64))
        assert packed.usable(torch.randn(2, 16))


def test_models_that_cannot_be_packed_are_left_alone():
    lm = tiny_causal("llama", dtype=torch.float64)
    assert kernels.pack_linears(lm.model) == 0
    assert not kernels.is_packed(lm.model)


@pytest.mark.parametrize("arch", ["llama", "gptneox"])
@pytest.mark.parametrize("plan", ["packed", LOW_DEFAULT, LOW_PACKED])
def test_every_lossless_strategy_matches_greedy_on_packed_and_mixed_kernels(arch, plan):
    # float32 (what packing serves) with peaked logits, so that no near-tie decides a token;
    # under a mixed table greedy's one-row steps and the verify forwards run different kernels
    lm = tiny_causal(arch, seed=0, scale=8.0)
    assert kernels.apply(lm.model, plan) > 0
    seed = prompt(6, 2)
    repetitive = seed + greedy(seed, ModelPair(lm), GreedyParams(), max_new_tokens=20).token_ids + seed
    for ids in (prompt(7, 1), repetitive):
        ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=32).token_ids
        runs = {
            "speculative (self)": lambda: speculative(ids, ModelPair(lm, lm), SpeculativeParams(draft_tokens=4),
                                                      max_new_tokens=32),
            "prompt_lookup": lambda: prompt_lookup(ids, ModelPair(lm), PromptLookupParams(ngram_size=2),
                                                   max_new_tokens=32),
            "lookahead": lambda: lookahead(ids, ModelPair(lm), LookaheadParams(window=4, ngram=3, guess_set=3),
                                           max_new_tokens=32),
            "jacobi": lambda: jacobi(ids, ModelPair(lm), JacobiParams(block_size=6), max_new_tokens=32,
                                     rng=make_generator(0)),
            "prophet": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                       ProphetParams(draft_tokens=3), max_new_tokens=32),
        }
        for name, run in runs.items():
            assert run().token_ids == ref, (arch, name)


def test_bundled_model_on_each_kernel_setting():
    from decoding.runtime.models import load_model
    auto = load_model("smollm2-135m-instruct")
    packed = load_model("smollm2-135m-instruct", kernels="packed")
    plain = load_model("smollm2-135m-instruct", pack=False)
    assert load_model("smollm2-135m-instruct", kernels="default") is plain
    assert len({id(auto), id(packed), id(plain)}) == 3
    assert packed.kernels == "onednn-packed" and packed.describe()["kernels"] == "onednn-packed"
    assert plain.kernels == "default" and not kernels.is_packed(plain.model)
    info = auto.describe()
    assert info["kernels"] == auto.kernels and len(info["kernel_buckets"]) == len(kernels.BUCKETS)
    assert info["kernel_choice"]["mode"] == "auto" and info["kernel_choice"]["source"] in ("measured", "cache")
    ids = packed.tokenizer("The quick brown fox jumps over the lazy dog", return_tensors=None)["input_ids"]
    a, b, c = _logits(packed, ids), _logits(plain, ids), _logits(auto, ids)
    for got in (a, c):
        assert torch.allclose(got, b, rtol=1e-3, atol=1e-3)
        assert torch.equal(got.argmax(-1), b.argmax(-1))


# --------------------------------------------------------------------------- float16 draft weights

half = pytest.mark.skipif(not kernels.half_available(), reason="this PyTorch build has no FBGEMM fp16 linear")


@half
def test_half_linear_reads_float16_weights_and_keeps_the_float32_parameters():
    torch.manual_seed(0)
    layer = nn.Linear(64, 40)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    fast = kernels.HalfLinear(layer)
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        got = fast(x)
        want = nn.functional.linear(x, layer.weight, layer.bias)
        rounded = nn.functional.linear(x, layer.weight.half().float(), layer.bias)
    assert got.shape == (2, 3, 40) and got.dtype == torch.float32
    # the weights really are read as float16: the result is the rounded weights', not the float32 ones'
    assert torch.allclose(got, rounded, atol=1e-4) and not torch.equal(got, want)
    assert (got - want).abs().max() < 1e-2
    assert set(fast.state_dict()) == set(state) and all(torch.equal(fast.state_dict()[k], v) for k, v in state.items())
    xg = torch.randn(3, 64, requires_grad=True)          # training through it: F.linear with autograd
    fast(xg).sum().backward()
    assert xg.grad is not None


@half
def test_a_prophet_on_float16_weights_drafts_close_to_float32_and_stays_lossless():
    """A draft head may round its weights (it never decides what is committed): the drafts may move,
    the output may not."""
    import copy
    lm = tiny_causal("llama", seed=0, scale=8.0)
    head = random_prophet(lm)
    fp32 = copy.deepcopy(head).eval()
    assert head.eval().pack() > 0 and head.kernels == "fp16-weights"
    assert sum(isinstance(m, kernels.HalfLinear) for m in head.modules()) >= 7
    feats = torch.randn(5, lm.model.config.hidden_size)
    with torch.no_grad():
        a, b = head.draft_logits(feats), fp32.draft_logits(feats)
    assert (a - b).abs().max() < 2e-2 * float(b.abs().max()) and not torch.equal(a, b)
    ids = prompt(12)
    want = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=16).token_ids
    for tree in (False, True):
        got = prophet(ids, ModelPair(lm, prophet=head), ProphetParams(tree=tree), max_new_tokens=16)
        assert got.token_ids == want
    from decoding.harness.runner import environment
    assert environment(ModelPair(lm, prophet=head), 0)["prophet"] == {"kernels": "fp16-weights", "dtype": "float32"}
