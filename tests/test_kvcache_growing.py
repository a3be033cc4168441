"""The growing KV cache (``runtime/kvcache.GrowingLayer``): bit-identical to transformers' ``DynamicCache``,
and it really stops copying the cache at every forward."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

import decoding.runtime.session as session_mod
from decoding.runtime.attention import tree_forward
from decoding.runtime.kvcache import GrowingLayer, grown_capacity, new_dynamic_cache
from decoding.runtime.session import Session
from decoding.tree import TokenTree
from tiny_models import prompt, tiny_causal, tiny_marian

pytestmark = pytest.mark.usefixtures("one_thread")


def _stock(encoder_decoder: bool = False):
    return EncoderDecoderCache(DynamicCache(), DynamicCache()) if encoder_decoder else DynamicCache()


def _script(lm) -> list[torch.Tensor]:
    """Every logits tensor of a run that uses every cache operation the loops use: a prefill, decode steps,
    a branching tree verified under a mask and compacted onto its accepted
    rows, a crop back (a rejected draft), and steps past the first buffer's capacity (a reallocation)."""
    s = Session(lm)
    out = [s.prefill(prompt(40, seed=3))]
    nxt = 7
    for i in range(100):
        out.append(s.forward(s.tensor([[nxt]]))[0])
        nxt = int(out[-1][-1].argmax()) or 5
    tree = TokenTree((11, 12, 13, 14, 15), (-1, 0, 0, 1, 3))
    base = s.length
    out.append(tree_forward(s, [nxt], tree))
    s.keep(base, [0, 2])                      # the pending token and node 1 (the "13" branch)
    out.append(s.forward(s.tensor([[9, 10, 11]]))[0])
    s.crop(s.length - 2)                      # two of those were a rejected draft
    for i in range(180):                      # past the first buffer's 256 positions
        out.append(s.forward(s.tensor([[int(out[-1][-1].argmax()) or 5]]))[0])
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
def test_logits_are_bit_identical_to_transformers_dynamic_cache(monkeypatch, arch, dtype):
    lm = tiny_causal(arch, seed=1, dtype=dtype)
    grown = _script(lm)
    monkeypatch.setattr(session_mod, "new_dynamic_cache", _stock)
    stock = _script(lm)
    assert len(grown) == len(stock)
    for i, (a, b) in enumerate(zip(grown, stock)):
        assert torch.equal(a, b), f"logits {i} differ"


def test_encoder_decoder_logits_are_bit_identical(monkeypatch):
    lm = tiny_marian(seed=2)

    def run() -> list[torch.Tensor]:
        s = Session(lm)
        out = [s.prefill(prompt(12, seed=4))]
        for _ in range(40):
            out.append(s.forward(s.tensor([[int(out[-1][-1].argmax()) or 5]]))[0])
        return out
    grown = run()
    monkeypatch.setattr(session_mod, "new_dynamic_cache", _stock)
    assert all(torch.equal(a, b) for a, b in zip(grown, run(), strict=True))


def test_the_session_uses_growing_layers_and_stops_copying_at_every_forward():
    lm = tiny_causal("llama", seed=1)
    s = Session(lm)
    s.prefill(prompt(40, seed=3))
    layers = s.cache.layers
    assert layers and all(isinstance(layer, GrowingLayer) for layer in layers)
    layer = layers[0]
    ptrs = set()
    for t in range(300):                      # 340 positions in all
        s.forward(s.tensor([[5 + t % 50]]))
        ptrs.add(layer.keys.data_ptr())
    # transformers' DynamicLayer makes a new tensor at every update (300 here); this one reallocated only when
    # it ran out of room: 40 -> 256 -> 512 positions
    assert layer.reallocations == 1 and len(ptrs) == 2
    assert layer.keys.shape[-2] == s.length == 340
    assert layer._kbuf.shape[-2] == grown_capacity(257)


def test_capacity_has_headroom_and_alignment():
    assert grown_capacity(1) == 256 and grown_capacity(256) == 512 and grown_capacity(1000) == 1280
    for need in (1, 7, 255, 256, 257, 1000, 4097):
        cap = grown_capacity(need)
        assert cap % 256 == 0 and cap >= need + 64 and cap >= need * 1.25


def test_a_replaced_tensor_is_adopted_at_the_next_update():
    """Beam search reorders the cache by replacing each layer's tensors; the next update must append after
    the reordered contents, not after the stale buffer's."""
    layer = GrowingLayer()
    k = torch.arange(2 * 1 * 5 * 2, dtype=torch.float32).reshape(2, 1, 5, 2)
    layer.update(k, k + 100)
    layer.keys, layer.values = layer.keys[[1, 0]], layer.values[[1, 0]]        # a reorder: fresh tensors
    new = torch.full((2, 1, 1, 2), -1.0)
    keys, values = layer.update(new, new)
    assert torch.equal(keys, torch.cat([k[[1, 0]], new], dim=-2))
    assert torch.equal(values, torch.cat([k[[1, 0]] + 100, new], dim=-2))
    assert layer.reallocations == 1


def test_crop_and_in_place_writes_keep_the_buffer():
    layer = GrowingLayer()
    k = torch.randn(1, 2, 10, 4)
    layer.update(k, k)
    buf = layer._kbuf
    layer.crop(-3)
    layer.keys[..., 0, :] = 0.0                                                # compaction writes into the view
    layer.update(torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4))
    assert layer._kbuf is buf and layer.reallocations == 0
    assert layer.keys.shape[-2] == 9 and torch.equal(layer.keys[..., 7:, :], torch.ones(1, 2, 2, 4))
    assert torch.equal(layer.keys[..., 0, :], torch.zeros(1, 2, 4))
    assert torch.equal(layer.keys[..., 1:7, :], k[..., 1:7, :])


def test_new_dynamic_cache_shapes():
    assert isinstance(new_dynamic_cache(), DynamicCache)
    enc = new_dynamic_cache(encoder_decoder=True)
    assert isinstance(enc, EncoderDecoderCache)
    assert enc.self_attention_cache.layer_class_to_replicate is GrowingLayer
