"""The compute floor under a wide forward: the cores' measured multiply-add peak and a forward's product operations.

The CPU table (benchmarks/bench_cpu_table.py) divides a 16-position forward's products by the peak the kernel's FMA
probe measures, so a ``c(16) / c(1)`` that no kernel can beat on a machine reads as such. These tests check the two
counts that division rests on; none asserts a speed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from decoding.runtime import attention_kernels, kernels
from decoding.runtime.forward_cost import compute_floor_ms, product_flops
from tests.tiny_models import tiny_causal


def tiny_llama() -> nn.Module:
    return tiny_causal("llama").model


def _weights(model: nn.Module) -> int:
    """A Llama's linear weights from its config: per layer q, k, v, o and the MLP's three, then the LM head."""
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    attention = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * c.num_key_value_heads * head_dim
    return c.num_hidden_layers * (attention + 3 * c.hidden_size * c.intermediate_size) + c.vocab_size * c.hidden_size


def test_product_flops_counts_every_linear_once_and_no_embedding():
    model = tiny_llama()
    expected = 2 * _weights(model)
    assert product_flops(model) == expected
    embedding = model.get_input_embeddings().weight.numel()
    assert expected > 0 and embedding > 0
    # an embedding is a lookup: counting it would add exactly its weights
    assert product_flops(model) != expected + 2 * embedding


def test_product_flops_is_the_same_after_the_linears_are_wrapped_for_a_kernel():
    model = tiny_llama()
    before = product_flops(model)
    for name, child in list(model.model.layers[0].mlp.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model.model.layers[0].mlp, name, kernels.PackedLinear(child))
    assert any(isinstance(m, kernels.PackedLinear) for m in model.modules())
    assert product_flops(model) == before


def test_the_floor_grows_with_the_width_and_falls_with_the_peak():
    model = tiny_llama()
    one = compute_floor_ms(model, 1, 50.0)
    assert compute_floor_ms(model, 16, 50.0) == pytest.approx(16 * one)
    assert compute_floor_ms(model, 1, 100.0) == pytest.approx(one / 2)
    assert one == pytest.approx(product_flops(model) / 50e9 * 1e3)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="gflops"):
            compute_floor_ms(model, 1, bad)
    with pytest.raises(ValueError, match="width"):
        compute_floor_ms(model, 0, 50.0)


def test_the_fma_probe_reports_the_operations_it_ran(own_kernel):
    """12 chains of multiply-adds on the registers half_linear's wide products use (8 or 16 floats), 2 operations
    a lane each: the probe follows the kernel's path, so the floor it puts under a forward is that path's."""
    workers, before = torch.get_num_threads(), attention_kernels.half_width()
    try:
        for width in (8, 16):
            lanes = attention_kernels.half_width(width)      # 16 only where the build has it
            for loads in (False, True):
                done = torch.ops.decoding_attention.fma_probe(torch.empty(0), 1000, loads)
                assert done == workers * 1000 * 12 * lanes * 2
                assert torch.ops.decoding_attention.fma_probe(torch.empty(0), 3000, loads) == 3 * done
    finally:
        attention_kernels.half_width(before)


def test_fma_gflops_is_a_positive_rate(own_kernel):
    for loads in (False, True):
        rate = attention_kernels.fma_gflops(seconds=0.02, repeats=2, loads=loads)
        assert rate is not None and rate > 0.0


def test_the_int8_probe_reports_the_byte_products_it_ran(own_kernel):
    """i8_linear's own inner step, the path its build takes: 24 chains of VNNI's vpdpbusd (64 byte pairs each), or one
    row's 6 of AVX2's sign / vpmaddubsw / vpmaddwd / add (32 pairs); nothing on a build with neither. The int8 version's
    floor (bench_cpu_table.py) counts byte products at this rate, so a probe of the wrong path misstates it."""
    workers, dot = torch.get_num_threads(), attention_kernels.i8_info()["dot"]
    done = torch.ops.decoding_attention.i8_probe(torch.empty(0), 1000)
    avx2 = "avx2" in attention_kernels._cpu_flags().split()
    assert done == (workers * 1000 * (64 * 24 if dot else 32 * 6) if avx2 or dot else 0)
    assert torch.ops.decoding_attention.i8_probe(torch.empty(0), 3000) == 3 * done


def test_i8_gmacs_is_a_positive_rate_where_the_build_has_a_path(own_kernel):
    rate = attention_kernels.i8_gmacs(seconds=0.02, repeats=2)
    if "avx2" in attention_kernels._cpu_flags().split():
        assert rate is not None and rate > 0.0
    else:
        assert rate is None
