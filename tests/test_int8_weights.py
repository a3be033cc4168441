"""Int8-weight presets (``weights: int8``, issue 47 item 6): another model, every lossless strategy exact against its
own greedy, eager and compiled, where this CPU's int8 product keeps a row's bits at every width (measured)."""

from __future__ import annotations

import time

import pytest
import torch
from test_compiled import _repetitive, _runs
from test_prophet import random_prophet

from decoding.harness.runner import run_comparison
from decoding.params import GreedyParams
from decoding.runtime import compiled, kernels, models
from decoding.runtime.models import load_presets, runs_here, wrap_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy

from tiny_models import prompt, tiny_causal

PRESET = "smollm2-135m-instruct-int8w"
# string conditions: measured when a test of this file is set up, not when every pytest worker collects the file
needs_int8 = pytest.mark.skipif("not kernels.int8_available()",
                                reason="this CPU's int8 product gives a row other bits at another width")
needs_preset = pytest.mark.skipif("not runs_here(load_presets()[PRESET])",
                                  reason="this CPU's int8 product is not vectorized (kernels.int8_fast)")


def _rows_exact_here() -> bool:
    gen = torch.Generator().manual_seed(7)
    layer = torch.nn.Linear(576, 1536)
    fast = kernels.Int8Linear(layer)
    x = torch.randn(40, 576, generator=gen)
    with torch.inference_mode():
        alone = torch.cat([fast(x[i:i + 1]) for i in range(40)])
        return all(torch.equal(fast(x[:m]), alone[:m]) for m in (2, 3, 5, 10, 16, 40))


def test_the_probe_says_what_this_cpu_does():
    """``int8_available`` is a measurement: it must agree with rows measured here on another layer."""
    assert kernels.int8_available() == _rows_exact_here()


def test_a_failing_probe_keeps_the_preset_off(monkeypatch):
    preset = load_presets()[PRESET]
    assert preset.weights == "int8" and preset.base == "smollm2-135m-instruct"
    monkeypatch.setitem(models._WEIGHT_KERNELS, "int8", (*models._WEIGHT_KERNELS["int8"][:1], lambda: False,
                                                          *models._WEIGHT_KERNELS["int8"][2:]))
    assert not runs_here(preset)
    with pytest.raises(models.ModelLoadError, match="int8 product"):
        models.load_model(PRESET)


def test_int8_weights_are_int8_with_one_scale_per_output_and_close_to_the_float_layer():
    layer = torch.nn.Linear(64, 48)
    with torch.no_grad():
        layer.weight[3] *= 50.0                       # one row far larger: its own scale, the others unharmed
    fast = kernels.Int8Linear(layer)
    assert fast.q.dtype == torch.int8 and fast.q.shape == (48, 64) and fast.scales.shape == (48,)
    assert int(fast.q.abs().max()) == 127
    x = torch.randn(5, 64)
    with torch.inference_mode():
        got, want = fast(x), torch.nn.functional.linear(x, layer.weight, layer.bias)
    err = (got - want).abs().amax(0) / want.abs().amax(0)
    assert float(err.max()) < 0.05
    assert float(err[torch.arange(48) != 3].max()) < 0.05       # a shared scale would crush the small rows


@needs_int8
def test_the_int8_product_is_what_runs():
    model = tiny_causal("llama", seed=3, scale=4.0)
    swapped = kernels.int8_linears(model.model)
    assert swapped == sum(1 for m in model.model.modules() if isinstance(m, kernels.Int8Linear)) > 0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.inference_mode():
            model.model(torch.tensor([prompt(6, 1)]))
    calls = sum(e.count for e in prof.key_averages() if "_weight_int8pack_mm" in e.key)
    assert calls == swapped


@needs_int8
def test_lossless_strategies_equal_the_int8_models_own_greedy():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    assert kernels.int8_linears(lm.model) > 0
    lm = wrap_model(lm.model, None, name="tiny-int8w", weights="int8")
    pair = ModelPair(lm, prophet=random_prophet(lm, seed=1))
    runs = [("prophet", {}), ("prompt_lookup", {}), ("lookahead", {}), ("jacobi", {}), ("suffix", {})]
    for seed in (0, 1):
        results = run_comparison(prompt(10, seed=seed), pair, runs, max_new_tokens=24, warmup=False, trace=False)
        assert all(r.token_ids == results[0].token_ids for r in results[1:]), [r.strategy for r in results]
        assert any(r.target_forwards < results[0].target_forwards for r in results[1:])


@needs_int8
def test_compiled_int8_gives_eager_greedys_tokens_for_every_lossless_strategy():
    model = tiny_causal("llama", seed=3, scale=8.0, dtype=torch.float32)
    assert kernels.int8_linears(model.model) > 0
    if compiled.why_not(model) is not None:
        pytest.skip(f"no compiled forward here: {compiled.why_not(model)}")
    eager = {i: greedy(ids, ModelPair(model), GreedyParams(), max_new_tokens=36).token_ids
             for i, ids in enumerate((prompt(7, 1), _repetitive(model)))}
    assert compiled.enable(model) is None
    try:
        engine = compiled.engine(model)
        before = engine.calls
        for i, ids in enumerate((prompt(7, 1), _repetitive(model))):
            for name, run in _runs(ids, model, fast=True).items():
                assert run().token_ids == eager[i], name
        assert engine.calls > before
    finally:
        compiled.disable(model)


def test_a_scalar_int8_kernel_keeps_the_preset_off_the_start_and_the_page(monkeypatch):
    """An int8 version loads, is timed at start (runtime/routes.versions) and offered only where this CPU's int8
    product is vectorized (``kernels.int8_fast``, measured), since a scalar one costs seconds a forward."""
    from decoding.runtime import routes
    presets = load_presets()
    for fast in (False, True):
        monkeypatch.setattr(kernels, "_INT8_FAST", [fast])
        assert runs_here(presets[PRESET]) is fast
        assert (PRESET in routes.versions("smollm2-135m-instruct", presets)) is fast


def test_int8_fast_is_a_measurement(monkeypatch):
    monkeypatch.setattr(kernels, "_INT8_FAST", [])
    monkeypatch.setattr(kernels, "int8_available", lambda: True)
    monkeypatch.setattr(kernels.Int8Linear, "reduced", lambda self, rows: (time.sleep(0.01), rows @ self.weight.T)[1])
    assert kernels.int8_fast() is False              # 10 ms a row: slower than float32's product
    monkeypatch.setattr(kernels, "_INT8_FAST", [])
    monkeypatch.setattr(kernels.Int8Linear, "reduced", lambda self, rows: rows[:, :1].expand(-1, self.out_features))
    assert kernels.int8_fast() is True


@needs_preset
@pytest.mark.bundled
def test_the_shipped_int8_preset_is_its_own_model():
    lm = models.load_model(PRESET)
    assert lm.weights == "int8" and lm.kernels == "int8-weights" and lm.describe()["weights"] == "int8"
    assert sum(1 for m in lm.model.modules() if isinstance(m, kernels.Int8Linear)) == 7 * 30 + 1
