"""Float16-weight presets (``weights: fp16``): another model, and every strategy exact against its own greedy.

The preset keeps float32 activations and reads float16 copies of the linear layers' weights (``kernels.HalfLinear``:
the project's kernel where it builds, whose rows are the same bits at any width, else FBGEMM's). What would break it: loading it as the float32 model (no layer swapped), a verify
forward whose rows depend on how many are computed together (as a bfloat16 model's do), a preset that
loads on a device it cannot run on, or a prophet head looked up under a name nothing ships.
"""

from __future__ import annotations

import pytest
import torch
from test_prophet import random_prophet

from decoding.harness.bench import width_logits
from decoding.harness.runner import run_comparison
from decoding.runtime import kernels
from decoding.runtime.head import PROPHET_DIR, prophet_for, shipped_head
from decoding.runtime.models import (ModelLoadError, bundled_file, load_model, load_presets, runs_here,
                                     wrap_model)
from decoding.runtime.pair import ModelPair

from tiny_models import prompt, tiny_causal

PRESET = "smollm2-135m-instruct-fp16w"
needs_half = pytest.mark.skipif(not kernels.half_available(), reason="this PyTorch build has no FBGEMM fp16 GEMM")


def _half(lm):
    model = lm.model
    assert kernels.half_linears(model) > 0
    return wrap_model(model, None, name=lm.name + "-fp16w", weights="fp16")


@needs_half
def test_rows_do_not_depend_on_how_many_are_computed_together():
    """A verify forward over 10 positions gives each the logits 10 one-position forwards give (float32
    rounding), so argmax, and so greedy verification, agrees; bfloat16 activations would not."""
    lm = _half(tiny_causal("llama", seed=3, scale=4.0))
    with torch.inference_mode():
        wide, narrow = width_logits(lm.model, torch.tensor([prompt(12, seed=1)]), torch.tensor([prompt(10, seed=2)]))
    assert torch.allclose(wide, narrow, atol=1e-4, rtol=1e-4)
    assert torch.equal(wide.argmax(-1), narrow.argmax(-1))


@needs_half
def test_on_the_projects_kernel_a_rows_bits_do_not_depend_on_the_width(own_kernel):
    """The float16-weight target's linears (``kernels.half_linears``) run on the project's kernel where it
    builds: every row of a product over M rows is the bits of the same row alone (FBGEMM's differ for every M > 1
    on an AMD EPYC Zen 3), so a verify forward's row is the one-position forward's product for product."""
    gen = torch.Generator().manual_seed(0)
    for n, k in ((96, 64), (200, 576), (1536, 576), (576, 1536)):
        layer = torch.nn.Linear(k, n)
        half = kernels.HalfLinear(layer, own=True)
        assert half.own
        x = torch.randn(40, k, generator=gen)
        with torch.inference_mode():
            alone = torch.cat([half(x[i:i + 1]) for i in range(40)])
            for m in (2, 3, 4, 7, 10, 17, 40):
                assert torch.equal(half(x[:m]), alone[:m]), (n, k, m)
            assert half(x[:0]).shape == (0, n)          # no rows: an empty product, not a division by no groups
            want = torch.nn.functional.linear(x.double(), layer.weight.half().double(), layer.bias.double())
        assert torch.allclose(alone.double(), want, atol=1e-5, rtol=1e-5)
    lm = tiny_causal("llama", seed=3, scale=4.0)
    assert kernels.half_linears(lm.model) > 0
    assert all(m.own for m in lm.model.modules() if isinstance(m, kernels.HalfLinear))
    with torch.inference_mode():
        wide, narrow = width_logits(lm.model, torch.tensor([prompt(12, seed=1)]), torch.tensor([prompt(10, seed=2)]))
    assert torch.allclose(wide, narrow, atol=1e-5, rtol=1e-5) and torch.equal(wide.argmax(-1), narrow.argmax(-1))


def test_the_kernels_two_paths_give_every_row_the_same_bits_and_the_chosen_one_runs(own_kernel):
    """``half_linear`` has an 8-float path (AVX2) and, where the build has AVX-512, a 16-float one for products over
    more than 2 rows (3-4 rows as one group, more holding two outputs' lanes per register, up to 12 rows at a time);
    the faster is measured at load. What would break it: a 16-float path whose lanes sum in another order (bits
    that depend on the machine's path, so a forward that is no longer any CPU's float16-weight model), row groups
    that skip or repeat a row at some M (13 = 7 + 6, 25 = 9 + 8 + 8), three rows as one group giving other bits
    than 2 + 1, a wide path built but never taken, or a width switch that ignores what it is told."""
    ak = own_kernel
    chosen = ak.half_choice()
    assert chosen["width"] in (8, 16) and chosen["widest"] in (8, 16) and chosen["why"]
    before = ak.half_width()
    try:
        assert ak.half_width(8) == 8
        assert ak.half_width(3) == 8                 # not a width: left as it was
        gen = torch.Generator().manual_seed(1)
        cases = []
        for n, k in ((96, 64), (200, 576), (576, 1536)):
            packed = ak.pack_half(torch.randn(n, k, generator=gen))
            bias = torch.randn(n, generator=gen)
            x = torch.randn(40, k, generator=gen)
            weight = packed.transpose(1, 2).reshape(n, k).double()        # the float16 weights, unpacked
            want = torch.nn.functional.linear(x.double(), weight, bias.double())
            cases.append((packed, bias, x, want))
        rows = (1, 2, 3, 4, 5, 7, 8, 10, 12, 13, 16, 25, 40)
        narrow_calls = ak.half_calls()[0]
        narrow = [[ak.half_linear(x[:m], packed, bias) for m in rows] for packed, bias, x, _ in cases]
        assert ak.half_calls()[0] == narrow_calls + len(rows) * len(cases)
        for (packed, bias, x, want), got in zip(cases, narrow):
            assert torch.allclose(got[-1].double(), want, atol=1e-4, rtol=1e-4)
        three = ak.half_three()
        for one_group in (not three, three):         # three rows as one group or as 2 + 1: the same bits
            assert ak.half_three(one_group) == one_group
            for (packed, bias, x, _), thin in zip(cases, narrow):
                assert torch.equal(ak.half_linear(x[:3], packed, bias), thin[rows.index(3)])
        if ak.half_width(16) != 16:
            assert chosen["widest"] == 8
            pytest.skip("this build has only the 8-float path (no AVX-512): nothing to compare it with")
        wide_calls = ak.half_calls()[1]
        for (packed, bias, x, _), thin in zip(cases, narrow):
            for m, expected in zip(rows, thin):
                assert torch.equal(ak.half_linear(x[:m], packed, bias), expected), (tuple(x.shape), m)
        assert ak.half_calls()[1] == wide_calls + sum(m > 2 for m in rows) * len(cases)
    finally:
        ak.half_width(before)


def test_the_half_width_is_measured_unless_the_operator_sets_it(monkeypatch, own_kernel):
    ak = own_kernel
    before = ak.half_width()
    try:
        widest = ak.half_choice()["widest"]
        monkeypatch.setenv(ak.HALF_WIDTH_SWITCH, "8")
        assert ak.choose_half_width() == {"width": 8, "widest": widest, "three": ak.half_three(),
                                          "why": "DECODING_HALF_WIDTH=8"}
        assert ak.half_width() == 8
        monkeypatch.delenv(ak.HALF_WIDTH_SWITCH)
        got = ak.choose_half_width(repeats=1)
        assert got["width"] == ak.half_width()
        if got["widest"] == 16:                      # measured: the faster of the two timings is the one set
            assert set(got["ms"]) == {"8", "16"} and got["width"] == int(min(got["ms"], key=got["ms"].get))
    finally:
        ak.half_width(before)


@needs_half
def test_lossless_strategies_equal_the_fp16_models_own_greedy():
    lm = _half(tiny_causal("llama", seed=0, scale=8.0))
    pair = ModelPair(lm, prophet=random_prophet(lm, seed=1))
    runs = [("prophet", {}), ("prompt_lookup", {}), ("lookahead", {}), ("jacobi", {}), ("suffix", {})]
    for seed in (0, 1):
        results = run_comparison(prompt(10, seed=seed), pair, runs, max_new_tokens=24, warmup=False, trace=False)
        ref = results[0].token_ids
        assert len(ref) == 24 or lm.eos_token_ids
        for r in results[1:]:
            assert r.token_ids == ref, r.strategy


def test_the_weights_field_is_checked_and_inherited(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  base-model:\n    hub_id: org/base\n    network: false\n    chat: true\n"
                    "  half:\n    base: base-model\n    weights: fp16\n", encoding="utf-8")
    presets = load_presets(path)
    assert presets["half"].weights == "fp16" and presets["base-model"].weights == "full"
    assert presets["half"].chat and not presets["half"].network and presets["half"].base == "base-model"
    assert runs_here(presets["base-model"])
    assert runs_here(presets["half"], device="cpu") == kernels.half_available()
    assert not runs_here(presets["half"], device="cuda")      # a GPU device: never (and no GPU here: False)
    path.write_text("models:\n  m:\n    hub_id: org/m\n    weights: int4\n", encoding="utf-8")
    with pytest.raises(ValueError, match="weights must be one of full, fp16"):
        load_presets(path)


def _bundled():
    preset = load_presets()[PRESET]
    return preset if bundled_file(preset.bundled, assemble=False) is not None else None


@needs_half
@pytest.mark.skipif(_bundled() is None, reason="the bundled SmolLM2 package is not installed")
def test_the_shipped_fp16_preset_is_its_own_model_with_the_base_head():
    with pytest.raises(ModelLoadError, match="CPU option"):
        load_model(PRESET, dtype="bfloat16")
    with pytest.raises(ModelLoadError, match="does not apply"):
        load_model(PRESET, kernels="packed")
    half, full = load_model(PRESET), load_model("smollm2-135m-instruct")
    assert half is not full and half.weights == "fp16" and full.weights == "full"
    layers = [m for m in half.model.modules() if isinstance(m, (torch.nn.Linear, kernels.PackedLinear))]
    assert not layers, "every linear layer reads float16 weights"
    assert sum(isinstance(m, kernels.HalfLinear) for m in half.model.modules()) == 30 * 7 + 1
    assert half.kernels == "fp16-weights" and half.describe()["weights"] == "fp16"
    assert shipped_head(half) == PROPHET_DIR / "smollm2-135m-instruct.safetensors"
    ids = torch.tensor([half.tokenizer("The capital of France is").input_ids])
    with torch.inference_mode():
        a, b = half.model(ids).logits[0, -1], full.model(ids).logits[0, -1]
    gap = float((a - b).abs().max())
    assert 0 < gap < 1.0, gap                        # rounded weights: close to float32, not the same model
    pair = ModelPair(half, None, prophet=prophet_for(half))
    results = run_comparison(ids[0].tolist(), pair, [("prophet", {}), ("hf_greedy", {})],
                             max_new_tokens=20, warmup=False, trace=False)
    assert [r.token_ids for r in results[1:]] == [results[0].token_ids] * 2


def test_the_target_picker_labels_the_fp16_preset_and_hides_it_where_it_cannot_load(monkeypatch):
    from web import page_form
    presets = load_presets()
    values = {(c[1] if isinstance(c, tuple) else c): c for c in page_form.target_choices(presets)}
    assert "smollm2-135m-instruct" in values and values["smollm2-135m-instruct"] == "smollm2-135m-instruct"
    if kernels.half_available():
        label, value = values[PRESET]
        assert value == PRESET and "float16 weights" in label and "own greedy" in label
    monkeypatch.setattr(page_form, "runs_here", lambda preset: preset.weights != "fp16")    # a GPU host, say
    assert PRESET not in {(c[1] if isinstance(c, tuple) else c) for c in page_form.target_choices(presets)}
