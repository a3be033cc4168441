"""The grouped-query attention for masked multi-position forwards (decoding/runtime/gqa_attention.py):
bit-identical to transformers' sdpa, without the per-forward copy of the KV cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers.integrations.sdpa_attention as hf_sdpa

from decoding.params import GreedyParams, LookaheadParams, SpeculativeParams
from decoding.runtime import gqa_attention
from decoding.runtime.attention import check_mask_support, tree_forward
from decoding.runtime.gqa_attention import NAME, use_gqa_attention
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies.baselines import greedy
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import speculative
from decoding.tree import TokenTree

from tiny_models import prompt, tiny_causal

# a branching tree: two depth-1 siblings, each with children
TREE = TokenTree((5, 6, 7, 8, 9, 10, 11), (-1, -1, 0, 0, 1, 4, 2))


def _tree_logits(lm, impl: str, context: list[int]) -> torch.Tensor:
    lm.model.set_attn_implementation(impl)
    s = Session(lm)
    s.prefill(context)
    return tree_forward(s, [3], TREE)


@pytest.fixture
def counted_repeats(monkeypatch):
    """How often transformers copied keys/values per query head (``repeat_kv``)."""
    calls = []
    real = hf_sdpa.repeat_kv

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_sdpa, "repeat_kv", counting)
    return calls


def test_wrapped_models_with_sdpa_use_it_and_others_keep_theirs():
    lm = tiny_causal("llama")                                     # 4 query heads over 2 KV heads
    assert lm.model.config._attn_implementation == NAME
    assert lm.model.model.config._attn_implementation == NAME
    eager = tiny_causal("llama")
    eager.model.set_attn_implementation("eager")
    assert not use_gqa_attention(eager.model)
    assert eager.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cached", [6, 150])
def test_tree_forward_logits_are_bit_identical_to_transformers_sdpa(dtype, cached):
    lm = tiny_causal("llama", dtype=dtype, seed=3)
    context = prompt(cached, seed=cached)
    ours = _tree_logits(lm, NAME, context)
    stock = _tree_logits(lm, "sdpa", context)
    assert torch.equal(ours, stock)


def test_the_masked_forward_copies_no_keys(counted_repeats):
    lm = tiny_causal("llama")
    _tree_logits(lm, "sdpa", prompt(12))
    assert counted_repeats, "the stock path should copy the keys (else this test proves nothing)"
    counted_repeats.clear()
    _tree_logits(lm, NAME, prompt(12))
    assert counted_repeats == []


def test_other_calls_go_to_transformers_sdpa_unchanged(monkeypatch):
    seen = []
    real = gqa_attention.sdpa_attention_forward

    def spy(module, query, *args, **kwargs):
        seen.append(query.shape[2])
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(gqa_attention, "sdpa_attention_forward", spy)
    lm = tiny_causal("llama")
    check_mask_support(lm)                     # its probe runs forwards of both kinds; not counted here
    seen.clear()
    s = Session(lm)
    s.prefill(prompt(10))                      # many positions, causal, no mask: stock
    s.forward(s.tensor([[4]]))                 # one position: stock
    assert len(seen) == 2 * lm.model.config.num_hidden_layers
    seen.clear()
    tree_forward(s, [3], TREE)                 # several positions under a mask: ours
    assert seen == []


def test_only_grouped_masked_cpu_calls_take_the_grouped_kernel():
    class Module:
        num_key_value_groups = 3

    q, kv, mask = torch.zeros(1, 6, 4, 8), torch.zeros(1, 2, 9, 8), torch.zeros(1, 1, 4, 9)
    assert gqa_attention._grouped(Module(), q, kv, kv, mask, {})
    assert not gqa_attention._grouped(Module(), q, kv, kv, None, {})                        # no mask
    assert not gqa_attention._grouped(Module(), q[:, :, :1], kv, kv, mask[:, :, :1], {})   # one position
    assert not gqa_attention._grouped(object(), q, kv, kv, mask, {})                       # no grouping
    assert not gqa_attention._grouped(Module(), q, kv, kv, mask, {"softcap": 50.0})
    assert not gqa_attention._grouped(Module(), q, kv, kv, mask, {"position_bias": torch.zeros(1)})
    meta = torch.zeros(1, 6, 4, 8, device="meta")                                          # not the CPU
    assert not gqa_attention._grouped(Module(), meta, kv, kv, mask, {})


def test_lossless_strategies_on_it_still_equal_greedy_and_do_use_it(monkeypatch):
    """The tiny Llamas of the whole suite run on it; here it is also shown to be the kernel that ran."""
    grouped = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):    # transformers' own calls pass enable_gqa only without a mask
        grouped.append(bool(kwargs.get("enable_gqa")) and kwargs.get("attn_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(gqa_attention.F, "scaled_dot_product_attention", spy)
    target = tiny_causal("llama", scale=4.0)
    ids = prompt(12, seed=5)
    ref = greedy(ids, ModelPair(target), GreedyParams(), max_new_tokens=24).token_ids
    grouped.clear()
    tree = speculative(ids, ModelPair(target, tiny_causal("llama", seed=1, scale=4.0)),
                       SpeculativeParams(draft_tokens=4, tree=True), max_new_tokens=24)
    assert tree.token_ids == ref and any(grouped)
    grouped.clear()
    assert lookahead(ids, ModelPair(target), LookaheadParams(), max_new_tokens=24).token_ids == ref
    assert any(grouped)


@pytest.mark.parametrize("forward", [gqa_attention.gqa_sdpa_forward, gqa_attention.rows_sdpa_forward])
def test_the_layers_scaling_reaches_the_kernel(forward):
    """A model whose attention scaling is not 1/sqrt(d) (Gemma 3's query_pre_attn_scalar) gets it: dropping
    ``scaling`` on the way to SDPA is harmless for Llama's default and wrong for such a model."""
    gen = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    query = torch.randn(1, 4, 3, 16, generator=gen)
    key, value = torch.randn(1, 2, 7, 16, generator=gen), torch.randn(1, 2, 7, 16, generator=gen)
    mask = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    scaling = 0.05                                      # far from 1 / sqrt(16) = 0.25
    out, _ = forward(module, query, key, value, mask, scaling=scaling)
    scores = (query @ key.repeat_interleave(2, dim=1).transpose(-1, -2)) * scaling
    want = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ value.repeat_interleave(2, dim=1)
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-5)
