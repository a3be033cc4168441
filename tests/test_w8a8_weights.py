"""Int8 weights and int8 activations (``weights: w8a8``, issue 47): another model, on the project's kernel
(``attention_kernels.i8_linear``), every lossless strategy exact against its own greedy, eager and compiled.

The arithmetic: weights rounded to int8 with one scale per output, each input row rounded to int8 per group of 64
inputs (the group's largest magnitude over 127, ties to even), exact integer dot products per group, the groups'
scales applied in order in float32, then the weight's scale and the bias. What would break it: a kernel that scales
a whole row at once (one large input flattens the rest), rounds half away from zero, skips or repeats a row at some
width, reads a padded tail, drops a group, the VNNI path's shift by 128 not taken back out, a path whose bits differ
from another CPU's, a joined layer that scales its outputs with another layer's scales, or a kernel built and never
called."""

from __future__ import annotations

import hashlib

import pytest
import torch
from test_bf16_weights import its_own_model_drafting_to_its_greedy, rows_alone_at_every_width
from test_compiled import _repetitive, _runs
from test_prophet import random_prophet

from decoding.harness.runner import run_comparison
from decoding.params import GreedyParams
from decoding.runtime import compiled, kernels, models
from decoding.runtime.models import load_presets, runs_here, wrap_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies.baselines import greedy

from tiny_models import VOCAB, prompt, tiny_causal

PRESET = "smollm2-135m-instruct-w8a8"
GROUP = 64
# string condition: measured when a test of this file is set up, not when every pytest worker collects the file
needs_w8a8 = pytest.mark.skipif("not kernels.w8a8_available()", reason="the project's int8 kernel does not build here")


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias, group: int = GROUP) -> torch.Tensor:
    """The product in float64 from its definition: rows quantized per ``group`` inputs, exact integer sums per group,
    the scales applied (to within float32's roundings of the kernel's sequence)."""
    m, k = x.shape
    g = -(-k // group)
    rows = torch.nn.functional.pad(x, (0, g * group - k)).reshape(m, g, group)
    big = rows.abs().amax(-1)
    inv = torch.where(big > 0, 127.0 / big, torch.zeros_like(big))
    xq = torch.round(rows * inv[..., None]).clamp(-127, 127)
    sums = torch.einsum("mgk,ngk->mgn", xq.double(),
                        torch.nn.functional.pad(q.double(), (0, g * group - k)).reshape(-1, g, group))
    y = (sums * (big / 127.0).double()[..., None]).sum(1) * scales.double()
    return y if bias is None else y + bias.double()


def _int8_layer(n: int, k: int, seed: int, bias_scale: float = 1.0) -> torch.nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(k, n)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * k ** -0.5)
        layer.bias.copy_(torch.randn(n, generator=gen) * bias_scale)
    return layer


def test_the_int8_product_keeps_a_rows_bits_at_every_width_and_follows_its_arithmetic(own_kernel):
    ak = own_kernel
    gen = torch.Generator().manual_seed(2)
    widths = (1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 16, 17, 40, 70)
    for n, k in ((202, 100), (96, 64), (960, 576), (576, 1536), (50, 70)):
        fast = kernels.W8A8Linear(_int8_layer(n, k, seed=n + k))
        assert fast.q.dtype == torch.int8 and int(fast.q.abs().max()) == 127 and fast.scales.shape == (n,)
        assert fast.packed.shape == (-(-n // 48), -(-k // GROUP) * GROUP // 4, 48, 4)
        x = torch.randn(70, k, generator=gen)
        x[3, 5] = 60.0                               # an outlier: flattens its row's other inputs if scaled per row
        alone = rows_alone_at_every_width(fast, x, widths, lambda: ak.i8_info()["calls"], (n, k))
        want = reference(x, fast.q, fast.scales, fast.bias32)
        err = (alone.double() - want).abs()
        assert float(err.max()) <= 1e-5 * float(want.abs().max()) + 1e-6, (n, k, float(err.max()))
        per_row = reference(x, fast.q, fast.scales, fast.bias32, group=-(-k // GROUP) * GROUP)
        if k > GROUP:                                # one scale per row would be another product
            assert float((alone[3].double() - per_row[3]).abs().max()) > 100 * float(err[3].max()) + 1e-4


def test_inputs_round_to_the_nearest_integer_ties_to_even(own_kernel):
    """A group whose largest magnitude is 127 keeps its scale 1: 0.5, 1.5, 2.5, -0.5, -2.5 must become 0, 2, 2, 0,
    -2 (round half away from zero gives 1, 2, 3, -1, -3). The weights are 127 times the identity, so each output
    reads one input's integer back."""
    ak = own_kernel
    values = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.49, -126.6])
    x = torch.zeros(1, GROUP)
    x[0, :len(values)] = values
    q = torch.zeros(GROUP, GROUP, dtype=torch.int8)
    q.fill_diagonal_(127)
    y = ak.i8_linear(x, ak.pack_int8(q), torch.full((GROUP,), 1 / 127), None, GROUP)
    assert torch.round(y[0, :len(values)]).tolist() == [127.0, 0.0, 2.0, 2.0, 0.0, -2.0, 3.0, -127.0]


def test_every_path_of_the_kernel_gives_the_same_bits(own_kernel):
    """The integer sums are exact on every path and the float32 part is the same sequence per lane, so an AVX2 CPU
    (the capped pass of ``make test`` builds that path), an AVX-512 VNNI one and the scalar fallback give these
    bits: a digest of products over odd shapes, from inputs built of integers (no random generator, whose floats
    may differ by instruction set). Measured equal on all three builds (AMD EPYC Zen 5)."""
    ak = own_kernel

    def ints(n: int, mod: int, seed: int) -> torch.Tensor:
        return (torch.arange(n, dtype=torch.int64) * 7919 + seed * 104729) % mod
    out = []
    for n, k, m in ((200, 96, 5), (96, 576, 17), (50, 70, 3), (576, 1536, 9)):
        x = ((ints(m * k, 2001, n).float() - 1000) / 997.0).reshape(m, k)
        x[0, 3] = 40.0
        q = (ints(n * k, 255, k) - 127).to(torch.int8).reshape(n, k)
        scales = (ints(n, 1000, 3).float() + 1) / 65536.0
        bias = (ints(n, 101, 5).float() - 50) / 64.0
        out.append(ak.i8_linear(x, ak.pack_int8(q), scales, bias, n).numpy().tobytes())
    assert hashlib.sha256(b"".join(out)).hexdigest()[:16] == "e895d7e11d286af0", ak.i8_info()


def test_a_zero_row_gives_the_bias_and_a_nan_gives_nan(own_kernel):
    fast = kernels.W8A8Linear(_int8_layer(96, 128, seed=1))
    x = torch.zeros(3, 128)
    x[1, 100] = float("nan")
    x[2, 7] = float("inf")
    with torch.inference_mode():
        y = fast(x)
    assert torch.equal(y[0], fast.bias32)
    assert bool(y[1].isnan().all()) and bool(y[2].isnan().all())


def test_the_packs_refuse_what_the_kernel_cannot_multiply(own_kernel):
    ak = own_kernel
    with pytest.raises(ValueError, match="-127"):
        ak.pack_int8(torch.full((48, 64), -128, dtype=torch.int8))
    with pytest.raises(ValueError, match="int8"):
        ak.pack_int8(torch.zeros(48, 64))
    packed = ak.pack_int8(torch.zeros(48, 64, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="n does not match"):
        ak.i8_linear(torch.zeros(1, 64), packed, torch.ones(100), None, 100)
    with pytest.raises(RuntimeError, match="takes x"):
        ak.i8_linear(torch.zeros(1, 200), packed, torch.ones(48), None, 48)


@needs_w8a8
def test_lossless_strategies_equal_the_w8a8_models_own_greedy():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    assert kernels.w8a8_linears(lm.model) == 2 * 7 + 1
    lm = wrap_model(lm.model, None, name="tiny-w8a8", weights="w8a8")
    pair = ModelPair(lm, prophet=random_prophet(lm, seed=1))
    runs = [("prophet", {}), ("prophet", {"tree": False}), ("prompt_lookup", {}), ("lookahead", {}),
            ("jacobi", {}), ("suffix", {})]
    for seed in (0, 1):
        results = run_comparison(prompt(10, seed=seed), pair, runs, max_new_tokens=24, warmup=False, trace=False)
        assert all(r.error is None and r.token_ids == results[0].token_ids for r in results[1:]), \
            [(r.strategy, r.error) for r in results]
        assert any(r.target_forwards < results[0].target_forwards for r in results[1:])


@needs_w8a8
def test_the_eager_fast_path_gives_a_row_its_one_position_bits_on_a_static_cache():
    """The fast path without a compiled forward keeps a static cache: every slot of its capacity reaches the
    attention, the rows' own keys right after the ones they see. The row-exact attention of a model that rounds its
    linears' inputs once took the keys' end for the rows' own (a growing cache's layout), so each row of a verify
    forward attended over the cache's empty slots and its bits parted from its one-position forward (every row,
    logits off by up to 1.5 on the bundled int8 model); here they must be equal, and every lossless strategy on
    the fast path gives that path's greedy."""
    lm = tiny_causal("llama", seed=0, scale=8.0)
    assert kernels.w8a8_linears(lm.model) == 2 * 7 + 1
    lm = wrap_model(lm.model, None, name="tiny-w8a8-static", weights="w8a8")
    ids, toks = prompt(12, seed=2), prompt(12, seed=5)

    def rows(width):
        session = Session(lm, "t", fast=True, max_len=len(ids) + len(toks) + 8)
        session.prefill(ids)
        out = []
        for a in range(0, len(toks), width):
            logits = session.forward(session.tensor([toks[a:a + width]]))[0]
            out += [logits[i].clone() for i in range(logits.shape[0])]
        return out
    one = rows(1)
    for width in (2, 3, 5):
        assert all(torch.equal(a, b) for a, b in zip(one, rows(width))), width
    pair = ModelPair(lm, prophet=random_prophet(lm, seed=1))
    runs = [(name, {"fast": True}) for name in ("prophet", "prompt_lookup", "lookahead", "suffix")]
    results = run_comparison(prompt(10, seed=0), pair, [("greedy", {"fast": True})] + runs, max_new_tokens=24,
                             warmup=False, trace=False)
    assert all(r.error is None and r.token_ids == results[0].token_ids for r in results[1:]), \
        [(r.strategy, r.error) for r in results]


def _joinable_llama(seed: int = 3):
    """A llama whose q|k|v (96 + 48 + 48) and gate|up (192 + 192) fill whole tiles of 48: the compiled forward joins
    them into one product each (heads of 48, a multiple of 16 as the compiled attention takes)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    assert kernels.w8a8_linears(model) == 2 * 7 + 1
    return wrap_model(model, None, name="tiny-w8a8-joinable", weights="w8a8")


@needs_w8a8
def test_compiled_w8a8_gives_eager_greedys_tokens_for_every_lossless_strategy():
    """Compiled, the int8 product is an extern call inductor keeps (counted), q|k|v and gate|up joined into one
    product each with each output's own scale (a join that took another layer's scales changes the tokens)."""
    lm = _joinable_llama()
    if compiled.why_not(lm) is not None:
        pytest.skip(f"no compiled forward here: {compiled.why_not(lm)}")
    from decoding.runtime import attention_kernels as ak
    layer = lm.model.model.layers[0]
    joined = compiled._Joined.of([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
    assert joined is not None and joined.reduced == "w8a8"
    rows = torch.randn(5, 96)
    with torch.inference_mode():
        apart = torch.cat([m(rows) for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)], 1)
        assert torch.equal(joined(rows), apart)
    eager = {i: greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=36).token_ids
             for i, ids in enumerate((prompt(7, 1), _repetitive(lm)))}
    assert compiled.enable(lm) is None
    try:
        engine = compiled.engine(lm)
        before, calls = engine.calls, ak.i8_info()["calls"]
        for i, ids in enumerate((prompt(7, 1), _repetitive(lm))):
            for name, run in _runs(ids, lm, fast=True).items():
                assert run().token_ids == eager[i], name
        assert engine.calls > before and ak.i8_info()["calls"] > calls
    finally:
        compiled.disable(lm)


def test_the_w8a8_preset_is_offered_only_where_its_kernel_passes(monkeypatch):
    """The preset loads, is timed at start (``routes.versions``) and offered on the page only where
    ``kernels.w8a8_available`` holds (the kernel built and passed its checks here)."""
    from decoding.runtime import routes
    from web.page_form import target_choices
    presets = load_presets()
    assert presets[PRESET].weights == "w8a8" and presets[PRESET].base == "smollm2-135m-instruct"
    assert not runs_here(presets[PRESET], device="cuda")
    for ok in (False, True):
        monkeypatch.setattr(kernels, "_W8A8_OK", [ok])
        assert runs_here(presets[PRESET]) is ok
        assert (PRESET in routes.versions("smollm2-135m-instruct", presets)) is ok
        labels = {(c[1] if isinstance(c, tuple) else c): c for c in target_choices(presets)}
        assert (PRESET in labels) is ok
        if ok:
            assert "int8 weights and activations" in labels[PRESET][0] and "own greedy" in labels[PRESET][0]
    assert "w8a8" in routes.COMPILED_WEIGHTS


def test_failing_checks_keep_the_kernel_off(monkeypatch, own_kernel):
    """``_w8a8_checks`` is a measurement: a kernel whose rows changed with the width (simulated: a last-bit drift on
    products over more than one row) fails it, and so does one far from the float product."""
    real = own_kernel.i8_linear

    def drifting(rows, packed, scales, bias, n):
        y = real(rows, packed, scales, bias, n)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if rows.shape[0] > 1 else y
    monkeypatch.setattr(own_kernel, "i8_linear", drifting)
    assert kernels._w8a8_checks() is False
    monkeypatch.setattr(own_kernel, "i8_linear", lambda rows, packed, scales, bias, n: 1.2 * real(rows, packed, scales,
                                                                                                   bias, n))
    assert kernels._w8a8_checks() is False
    monkeypatch.setattr(own_kernel, "i8_linear", real)
    assert kernels._w8a8_checks() is True


def test_the_starts_line_names_the_int8_path(monkeypatch):
    from decoding.runtime import attention_kernels as ak
    monkeypatch.setattr(kernels, "_W8A8_OK", [True])
    monkeypatch.setattr(ak, "i8_info", lambda: {"dot": True, "calls": 0, "rows": 4})
    assert "AVX-512 VNNI" in kernels.w8a8_note()
    monkeypatch.setattr(ak, "i8_info", lambda: {"dot": False, "calls": 0, "rows": 1})
    assert "AVX2 byte products" in kernels.w8a8_note()
    monkeypatch.setattr(kernels, "_W8A8_OK", [False])
    assert kernels.w8a8_note() == ""


@needs_w8a8
@pytest.mark.bundled
def test_the_shipped_w8a8_preset_is_its_own_model_and_its_drafts_equal_its_greedy():
    with pytest.raises(models.ModelLoadError, match="int8 activations"):
        models.load_model(PRESET, dtype="bfloat16")
    lm, full = models.load_model(PRESET), models.load_model("smollm2-135m-instruct")
    assert lm.weights == "w8a8" and lm.kernels == "int8-weights-and-activations"
    assert sum(1 for m in lm.model.modules() if isinstance(m, kernels.W8A8Linear)) == 7 * 30 + 1
    results = its_own_model_drafting_to_its_greedy(lm, full)
    assert results[1].target_forwards < len(results[0].token_ids)


@needs_w8a8
def test_a_w8a8_targets_head_drafts_on_int8_and_stays_lossless(tmp_path):
    """A head loaded for a w8a8 target packs its own linears on the int8 kernel (a head loaded for a float32 target
    does not), its draft logits stay close to its float ones, and the drafts it makes keep every output greedy's.
    What would break it: the head left on float16 for the int8 target, the int8 choice leaking to other targets,
    or a head whose int8 product ignores its inputs."""
    from decoding.runtime.head import load_prophet, save_prophet
    from decoding.runtime import attention_kernels as ak
    base = tiny_causal("llama", seed=0, scale=8.0)
    path = tmp_path / "head.safetensors"
    save_prophet(random_prophet(base, seed=2), path)
    assert load_prophet(path, base).kernels != "int8-weights-and-activations"
    target = tiny_causal("llama", seed=0, scale=8.0)
    kernels.w8a8_linears(target.model)
    target = wrap_model(target.model, None, name="tiny-w8a8", weights="w8a8")
    head = load_prophet(path, target)
    assert head.kernels == "int8-weights-and-activations"
    assert any(isinstance(m, kernels.W8A8Linear) for m in head.modules())
    feature = torch.randn(3, target.model.config.hidden_size)
    with torch.inference_mode():
        calls = ak.i8_info()["calls"]
        packed = head.draft_logits(feature)
        assert ak.i8_info()["calls"] > calls
        plain = feature @ head.head.T
    assert float((packed - plain).abs().max()) < 0.05 * float(plain.abs().max())
    assert not torch.allclose(head.draft_logits(feature[[1, 0, 2]]), packed)
    pair = ModelPair(target, prophet=head)
    results = run_comparison(prompt(10, seed=3), pair, [("prophet", {}), ("prophet", {"tree": False})],
                             max_new_tokens=24, warmup=False, trace=False)
    assert all(r.error is None and r.token_ids == results[0].token_ids for r in results[1:])
