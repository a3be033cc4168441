"""Bfloat16-weight presets (``weights: bf16``): another model, whose verify forwards give every row the bits a
one-position forward gives it.

The preset rounds each linear layer's input and weights to bfloat16 (oneDNN, AMX tiles on an Intel Xeon) and
keeps float32 between the layers. Because a rounding can turn a last-bit difference into a different token,
exactness against its own greedy needs *bit* equality between a wide forward's rows and one-position
forwards. What would break it: linears wider than the kernels' exact rows not chunked, attention over a
key length that depends on the width, a cache buffer whose masked tail holds garbage (NaN), the row-exact
attention not switched on for the preset, or a tree row whose ancestors are not laid out as greedy cached them.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from test_prophet import random_prophet

from decoding.harness.bench import width_logits
from decoding.harness.runner import run_comparison
from decoding.runtime import kernels
from decoding.runtime.attention import check_mask_support, tree_forward
from decoding.runtime.gqa_attention import KEY_BLOCK, NAME, key_blocks_exact, ROWS_NAME, layout_of, rows_sdpa_forward
from decoding.runtime.head import PROPHET_DIR, prophet_for, shipped_head
from decoding.runtime.kvcache import GrowingLayer
from decoding.runtime.models import ModelLoadError, bundled_file, load_model, load_presets, runs_here, wrap_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.tree import TokenTree

from tiny_models import prompt, tiny_causal

PRESET = "smollm2-135m-instruct-bf16w"
needs_bf16 = pytest.mark.skipif(not kernels.bf16_available(), reason="no bfloat16 kernel (the project's or "
                                "oneDNN's) with width-independent rows on this CPU")


def _bf16(lm):
    assert kernels.bf16_linears(lm.model) > 0
    return wrap_model(lm.model, None, name=lm.name + "-bf16w", weights="bf16")


def test_cpu_sdpa_gives_a_row_the_same_bits_at_every_key_block_past_its_visible_keys():
    """What the row-exact attention rests on, measured here: where this CPU's SDPA keeps a row's bits at every
    multiple of KEY_BLOCK past its visible keys, the probe says so; where it does not (a kernel library that
    changed), the probe says so and the bfloat16-weight presets do not run. Never assumed from the CPU."""
    gen = torch.Generator().manual_seed(0)
    heads, kv, d = 6, 2, 32
    holds = True
    for visible in (5, 16, 37, 130):
        total = visible + 300
        q = torch.randn(1, heads, 1, d, generator=gen)
        k, v = torch.randn(1, kv, total, d, generator=gen), torch.randn(1, kv, total, d, generator=gen)

        def row(length: int) -> torch.Tensor:
            mask = torch.zeros(1, 1, 1, length, dtype=torch.bool)
            mask[..., :visible] = True
            return F.scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], attn_mask=mask,
                                                  enable_gqa=True)
        first = -(-visible // KEY_BLOCK) * KEY_BLOCK
        ref = row(first)
        holds &= all(torch.equal(row(length), ref) for length in range(first, total, KEY_BLOCK))
    assert key_blocks_exact() == holds
    if not holds:
        assert not runs_here(load_presets()[PRESET], "cpu")
        pytest.skip("this CPU's SDPA changes a row's bits with the key length: no bfloat16-weight presets here")


def test_a_key_length_probe_that_fails_keeps_the_bf16_presets_off(monkeypatch):
    """A CPU whose attention breaks the property (simulated: one key length gives other bits) must not run the
    bfloat16-weight presets, whatever its linears can do."""
    from decoding.runtime import gqa_attention

    def drifting(q, k, v, attn_mask=None, enable_gqa=False):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=enable_gqa)
        return out + (1e-7 if k.shape[2] == 2 * KEY_BLOCK else 0.0)
    assert gqa_attention._key_block_checks(F.scaled_dot_product_attention) in (True, False)
    assert not gqa_attention._key_block_checks(drifting)
    monkeypatch.setattr(gqa_attention, "_KEY_BLOCKS_OK", [False])
    monkeypatch.setattr(kernels, "_BF16_ROUTE", ["own"])
    assert not runs_here(load_presets()[PRESET], "cpu")
    monkeypatch.setattr(gqa_attention, "_KEY_BLOCKS_OK", [True])
    assert runs_here(load_presets()[PRESET], "cpu")


def test_a_probe_that_sees_rows_change_with_the_batch_keeps_the_bf16_presets_off():
    """The row-exact attention makes each row a batch element, so SDPA must give a row the bits it gives the row
    alone whatever the batch (simulated failure: a batch of more than one drifts by a last bit)."""
    from decoding.runtime import gqa_attention

    def batch_drifting(q, k, v, attn_mask=None, enable_gqa=False):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=enable_gqa)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if q.shape[0] > 1 else out
    assert not gqa_attention._key_block_checks(batch_drifting)


def test_row_exact_rows_are_the_rows_of_one_row_calls_on_two_threads():
    """On several threads PyTorch's CPU SDPA gives a row other bits in another batch (an AMD EPYC Zen 5, torch 2.13:
    25 of 28 shapes), where the app runs (2 threads) and the suite (1 thread) does not: the row-exact attention runs
    its SDPA on one thread. What would break it: the SDPA call left on the caller's threads, or the count not put
    back afterwards."""
    gen = torch.Generator().manual_seed(4)
    heads, kv, d, cached, t = 9, 3, 64, 40, 9
    module = torch.nn.Module()
    keys, values = torch.randn(1, kv, cached + t, d, generator=gen), torch.randn(1, kv, cached + t, d, generator=gen)
    query = torch.randn(1, heads, t, d, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together, _ = rows_sdpa_forward(module, query, keys, values, None)
        alone = torch.cat([rows_sdpa_forward(module, query[:, :, i:i + 1], keys[..., :cached + i + 1, :],
                                             values[..., :cached + i + 1, :], None)[0] for i in range(t)], 1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert torch.equal(together, alone)


def test_row_exact_attention_reads_masked_headroom_without_copying_and_ignores_its_values():
    gen = torch.Generator().manual_seed(1)
    heads, kv, d, filled, t = 4, 2, 16, 21, 3
    buffer = torch.randn(1, kv, 64, d, generator=gen)
    buffer[..., filled:, :] = float("nan")              # what an unzeroed buffer could hold
    keys = buffer[..., :filled, :]
    query = torch.randn(1, heads, t, d, generator=gen)
    plain = torch.randn(1, kv, filled, d, generator=gen)
    module = torch.nn.Module()
    out, _ = rows_sdpa_forward(module, query, plain, plain, None)
    assert out.shape == (1, t, heads, d) and torch.isfinite(out).all()
    zeroed = buffer.clone()
    zeroed[..., filled:, :] = 0
    out_nan, _ = rows_sdpa_forward(module, query, keys, keys, None)
    out_zero, _ = rows_sdpa_forward(module, query, zeroed[..., :filled, :], zeroed[..., :filled, :], None)
    # masked NaN would poison the sums: the buffer's headroom must hold finite values (GrowingLayer zeroes it)
    assert not torch.isfinite(out_nan).all()
    assert torch.isfinite(out_zero).all()


def test_a_growing_cache_zeroes_the_headroom_it_allocates():
    for _ in range(3):                                  # leave NaN-filled blocks for the allocator to hand out
        junk = torch.full((1, 2, 256, 16), float("nan"))
        del junk
        gc.collect()
    layer = GrowingLayer()
    k = torch.randn(1, 2, 5, 16)
    layer.update(k, k.clone())
    assert layer._kbuf.shape[-2] > 5
    assert torch.equal(layer._kbuf[..., 5:, :], torch.zeros_like(layer._kbuf[..., 5:, :]))
    assert torch.equal(layer._vbuf[..., 5:, :], torch.zeros_like(layer._vbuf[..., 5:, :]))


@needs_bf16
def test_bf16_linear_rows_are_the_rows_of_one_row_calls_up_to_the_exact_width():
    layer = torch.nn.Linear(96, 200)
    fast = kernels.Bf16Linear(layer)
    x = torch.randn(kernels.EXACT_WIDTH, 96)
    with torch.inference_mode():
        one = torch.cat([fast(x[i:i + 1]) for i in range(x.shape[0])])
        for rows in (2, 9, kernels.BF16_EXACT_ROWS, kernels.BF16_EXACT_ROWS + 1, kernels.EXACT_WIDTH):
            assert torch.equal(fast(x[:rows]), one[:rows]), rows
        want = F.linear(x.bfloat16().float(), layer.weight.bfloat16().float(), layer.bias.bfloat16().float())
    assert torch.allclose(one, want, atol=3e-2, rtol=2e-2)


@needs_bf16
def test_wide_forwards_of_the_bf16_model_give_every_row_the_bits_of_a_one_position_forward():
    lm = _bf16(tiny_causal("llama", seed=3, scale=4.0))
    assert lm.model.config._attn_implementation == ROWS_NAME and lm.kernels == "bf16-weights"
    with torch.inference_mode():
        for context in (3, 40):
            for width in (2, 9, 33, 64):
                wide, narrow = width_logits(lm.model, torch.tensor([prompt(context, seed=width)]),
                                            torch.tensor([prompt(width, seed=context)]))
                assert torch.equal(wide, narrow), (context, width, float((wide - narrow).abs().max()))


def test_the_layout_gives_each_tree_row_its_ancestors_in_order():
    # root 0; children 1, 2 of 0; 3 child of 1; 4 child of 2; 5 child of 3 (BFS order), after 4 cached keys
    parents = [-1, 0, 0, 1, 2, 3]
    allowed = torch.zeros(6, 10, dtype=torch.bool)
    allowed[:, :4] = True
    for row, parent in enumerate(parents):
        allowed[row, 4 + row] = True
        while parent != -1:
            allowed[row, 4 + parent] = True
            parent = parents[parent]
    layout = layout_of(allowed, 6)
    assert not layout.plain and layout.seen == (1, 2, 2, 3, 3, 4)
    groups = {path: set(members) for members, path in layout.groups}
    assert groups == {(0, 1, 3, 5): {0, 1, 3, 5}, (0, 2, 4): {2, 4}}          # one group per leaf
    chain = layout_of(torch.ones(3, 7, dtype=torch.bool).tril(4), 3)
    assert chain.plain and chain.seen == (1, 2, 3) and layout_of(None, 3) == chain
    windowed = allowed.clone()
    windowed[:, 0] = False                              # a sliding window: the cache is not all visible
    assert layout_of(windowed, 6) is None


@needs_bf16
def test_tree_rows_of_the_bf16_model_are_the_bits_of_their_paths_fed_one_by_one():
    lm = _bf16(tiny_causal("llama", seed=5, scale=4.0))
    check_mask_support(lm)
    tree = TokenTree((5, 6, 7, 8, 9, 10, 11, 12, 13), (-1, -1, 0, 0, 1, 4, 2, 6, 5))
    assert _tree_rows_equal_their_paths(lm, tree) == [True] * (2 * len(tree.tokens))


def _tree_rows_equal_their_paths(lm, tree) -> list[bool]:
    same = []
    for context in (3, 37):
        prefix = prompt(context, seed=context)
        session = Session(lm)
        session.prefill(prefix)
        got = tree_forward(session, [3], tree)                                   # [1 + nodes, V]
        for node in range(len(tree.tokens)):
            path, j = [], node
            while j != -1:
                path.append(tree.tokens[j])
                j = tree.parents[j]
            plain = Session(lm)
            plain.prefill(prefix)
            for token in [3] + path[::-1]:
                want = plain.forward(plain.tensor([[token]]))[0, -1]
            same.append(bool(torch.equal(got[node + 1], want)))
    return same


@needs_bf16
def test_lossless_strategies_equal_the_bf16_models_own_greedy():
    lm = _bf16(tiny_causal("llama", seed=0, scale=8.0))
    pair = ModelPair(lm, prophet=random_prophet(lm, seed=1))
    runs = [("prophet", {}), ("prophet", {"tree": False}), ("prompt_lookup", {}), ("lookahead", {}),
            ("jacobi", {}), ("suffix", {})]
    for seed in (0, 1):
        results = run_comparison(prompt(10, seed=seed), pair, runs, max_new_tokens=24, warmup=False, trace=False)
        ref = results[0].token_ids
        assert len(ref) == 24 or lm.eos_token_ids
        for r in results[1:]:
            assert r.error is None and r.token_ids == ref, (r.strategy, r.error)


def test_the_bf16_weights_field_is_checked():
    presets = load_presets()
    assert presets[PRESET].weights == "bf16" and presets[PRESET].base == "smollm2-135m-instruct"
    assert runs_here(presets[PRESET], device="cpu") == kernels.bf16_available()
    assert not runs_here(presets[PRESET], device="cuda")


def rows_alone_at_every_width(layer, x: torch.Tensor, widths, calls, label) -> torch.Tensor:
    """``layer``'s rows of ``x`` computed one at a time, after checking that a product over each of ``widths`` rows
    gives those rows the same bits, that no rows give none, and that the project's kernel ran every product
    (``calls()``: its counter). ``label`` names the layer in a failure."""
    before = calls()
    with torch.inference_mode():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
        for m in widths:
            assert torch.equal(layer(x[:m]), alone[:m]), (*label, m)
        assert layer(x[:0]).shape == (0, layer.out_features)
    assert calls() == before + x.shape[0] + len(widths)               # the project's kernel is what ran
    return alone


def its_own_model_drafting_to_its_greedy(lm, full) -> list:
    """A reduced-weight preset of the bundled model (``lm``) against its float32 base (``full``): its logits close to
    the base's but not the same (another model), and the prophet, prompt lookup, lookahead and transformers' greedy
    giving its own greedy's tokens. The race's results (greedy first)."""
    ids = torch.tensor([lm.tokenizer("The capital of France is").input_ids])
    with torch.inference_mode():
        gap = float((lm.model(ids).logits[0, -1] - full.model(ids).logits[0, -1]).abs().max())
    assert 0 < gap < 3.0, gap                       # rounded: close to float32, not the same model
    pair = ModelPair(lm, None, prophet=prophet_for(lm))
    results = run_comparison(ids[0].tolist(), pair, [("prophet", {}), ("prompt_lookup", {}), ("lookahead", {}),
                                                     ("hf_greedy", {})],
                             max_new_tokens=24, warmup=False, trace=False)
    assert [r.token_ids for r in results[1:]] == [results[0].token_ids] * 4
    return results


def _bundled():
    preset = load_presets()[PRESET]
    return preset if bundled_file(preset.bundled, assemble=False) is not None else None


@needs_bf16
@pytest.mark.skipif(_bundled() is None, reason="the bundled SmolLM2 package is not installed")
def test_the_shipped_bf16_preset_is_its_own_model_and_its_drafts_equal_its_greedy():
    with pytest.raises(ModelLoadError, match="CPU option"):
        load_model(PRESET, dtype="bfloat16")
    with pytest.raises(ModelLoadError, match="does not apply"):
        load_model(PRESET, kernels="packed")
    bf, full = load_model(PRESET), load_model("smollm2-135m-instruct")
    assert bf is not full and bf.weights == "bf16" and bf.kernels == "bf16-weights"
    assert sum(isinstance(m, kernels.Bf16Linear) for m in bf.model.modules()) == 30 * 7 + 1
    assert bf.model.config._attn_implementation == ROWS_NAME and full.model.config._attn_implementation == NAME
    assert shipped_head(bf) == PROPHET_DIR / "smollm2-135m-instruct.safetensors"
    results = its_own_model_drafting_to_its_greedy(bf, full)
    # where a tree row is not the bits of a plain forward the probe refuses trees (simulated: the masked forward's
    # rows drift by a last bit, as the plain grouped attention's do on an AMD EPYC Zen 5; whether this CPU's do is
    # its kernels' matter, so the test injects it)
    import decoding.runtime.attention as attention_module

    class Drifting(Session):
        def forward(self, ids, **kwargs):
            out = super().forward(ids, **kwargs)
            return torch.nextafter(out, torch.full_like(out, float("inf"))) if "attention_mask" in kwargs else out
    try:
        attention_module.Session = Drifting
        bf.state.mask_support = None
        with pytest.raises(ValueError, match="bfloat16"):
            check_mask_support(bf)
    finally:
        attention_module.Session = Session
        bf.state.mask_support = None
    check_mask_support(bf)
    assert results[1].target_forwards < len(results[0].token_ids)   # the head's chains were accepted: fewer forwards


def test_the_target_picker_labels_the_bf16_preset():
    from web.page_form import target_choices
    values = {(c[1] if isinstance(c, tuple) else c): c for c in target_choices(load_presets())}
    if kernels.bf16_available():
        label, value = values[PRESET]
        assert value == PRESET and "bfloat16 weights" in label and "own greedy" in label
    else:
        assert PRESET not in values


def test_the_projects_bf16_product_gives_a_row_the_same_bits_at_every_width_and_bf16_linears_arithmetic(own_kernel):
    """``attention_kernels.bf16_linear`` (AVX-512 BF16 pair products where the CPU has them, float32 multiply-adds on
    widened pairs elsewhere: ``bf16_info()['dot']`` says which ran). What would break it: row groups that skip or
    repeat a row at some M (6 + 5 + 5, 13, 70), a row's sums that depend on its group, a padded tail (K = 100,
    N = 202) read as weights or written out, a k-chunk or the bias dropped, the result not rounded to bfloat16, or
    a kernel built but never called."""
    ak = own_kernel
    gen = torch.Generator().manual_seed(2)
    widths = (1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 16, 17, 40, 70)
    for n, k in ((202, 100), (96, 64), (1536, 576), (576, 1536)):
        layer = torch.nn.Linear(k, n)
        with torch.no_grad():
            layer.bias.mul_(4.0)
        fast = kernels.Bf16Linear(layer, own=True)
        assert fast.own and fast.packed.shape == (-(-n // 4), -(-k // 32), 4, 32)
        x = torch.randn(70, k, generator=gen)
        alone = rows_alone_at_every_width(fast, x, widths, lambda: ak.bf16_info()["calls"], (n, k))
        assert torch.equal(alone, alone.bfloat16().float())                # bfloat16 values, handed back as float32
        exact = F.linear(x.bfloat16().double(), layer.weight.bfloat16().double(), layer.bias.bfloat16().double())
        # float32 sums of exact products: within a bfloat16 rounding of the exact sum, plus the float32 sums' error
        terms = F.linear(x.bfloat16().double().abs(), layer.weight.bfloat16().double().abs()) + layer.bias.abs()
        assert torch.all((alone.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + terms * 2.0 ** -18), (n, k)
        assert (alone.double() - exact).abs().max() > 0 or k < 128      # rounded, not computed in double


def test_the_bf16_route_is_the_one_that_passes_and_measures_faster(monkeypatch):
    """Which kernel runs bfloat16-weight linears is measured per machine (``kernels.bf16_route``): a route that
    fails its checks (oneDNN's rows change with the width on an AMD EPYC Zen 5) is never taken, where both pass
    the faster one runs, and ``DECODING_BF16_ROUTE`` picks one unmeasured. What would break it: a failing route
    taken, a measurement that picks the slower route, or a switch that overrides a route's failed checks."""
    def route(passing: set, faster: str = "onednn", forced: str = "") -> object:
        monkeypatch.setattr(kernels, "_BF16_ROUTE", [])
        monkeypatch.setattr(kernels, "_bf16_checks", lambda name="onednn": name in passing)
        measured = []
        monkeypatch.setattr(kernels, "_faster_bf16_route", lambda routes: measured.append(routes) or faster)
        monkeypatch.setenv(kernels.BF16_ROUTE_SWITCH, forced)
        return kernels.bf16_route(), measured
    assert route({"own"}) == ("own", [])
    assert route({"onednn"}) == ("onednn", [])
    assert route(set()) == (None, [])
    assert not kernels.bf16_available()
    assert route({"own", "onednn"}, faster="onednn") == ("onednn", [["own", "onednn"]])
    assert route({"own", "onednn"}, faster="own") == ("own", [["own", "onednn"]])
    assert route({"own", "onednn"}, forced="own") == ("own", [])
    assert route({"onednn"}, forced="own") == ("onednn", [])         # forcing cannot revive a failing route


def test_the_faster_bf16_route_is_the_one_that_times_faster(monkeypatch, own_kernel):
    """``_faster_bf16_route`` times the routes themselves: with the project's product slowed down by 2 ms a call and
    oneDNN's standing in as an allocation of its output (microseconds on any CPU: a real bfloat16 product would make
    the outcome depend on how fast this CPU multiplies bfloat16), oneDNN wins."""
    import time as _time
    slow = kernels.Bf16Linear.reduced

    def slowed(self, rows):
        if self.own:
            _time.sleep(0.002)
        return slow(self, rows)
    monkeypatch.setattr(kernels.Bf16Linear, "reduced", slowed)
    monkeypatch.setattr(kernels, "_pack", lambda weight: weight.detach().contiguous())
    monkeypatch.setattr(kernels, "onednn_linear", lambda rows, packed, bias, n: rows.new_zeros(rows.shape[0], n))
    assert kernels._faster_bf16_route(["own", "onednn"]) == "onednn"


def test_the_projects_bf16_route_passes_its_checks_here(own_kernel):
    """The project's kernel is width-exact by construction on every CPU it builds on (the property is still
    measured at run time: ``_bf16_checks('own')``), so the bfloat16-weight presets run wherever it builds."""
    assert kernels._bf16_checks("own")
    assert kernels.bf16_available()


def test_a_routes_checks_give_the_same_verdict_in_every_process():
    """The checks draw their layers from seeds of their own: on an AMD EPYC Zen 5 oneDNN's bfloat16 product keeps a
    row's bits for some random layers and not others, so checks on layers drawn from the process's random state
    let a process take a route that is not width-exact (a race's tokens then differ from greedy's, in about one
    process in five, measured). What would break it: a layer drawn from the global generator, or one draw only."""
    verdicts = {route: set() for route in ("own", "onednn")}
    for seed in (0, 5, 11):
        torch.manual_seed(seed)
        for route in verdicts:
            verdicts[route].add(kernels._bf16_checks(route))
    assert all(len(v) == 1 for v in verdicts.values()), verdicts
    assert len(kernels.BF16_CHECK_SEEDS) >= 3 and (576, 960) in kernels.BF16_CHECK_SHAPES


def test_onednn_replaces_the_projects_bf16_kernel_only_when_clearly_faster(monkeypatch, own_kernel):
    """Both routes passing, oneDNN runs only when it measured ``BF16_ROUTE_MARGIN`` faster (AMX's tiles are several
    times faster at 16 rows); within the margin the project's kernel, exact by construction, keeps the route."""
    ak = own_kernel
    for own_ms, onednn_ms, want in ((1.0, 0.95, "own"), (1.0, 0.80, "onednn"), (1.0, 1.2, "own")):
        monkeypatch.setattr(ak, "_fastest", lambda options, use, run, repeats, ms={"own": own_ms, "onednn": onednn_ms}:
                            (min(ms, key=ms.get), ms))
        monkeypatch.setattr(kernels, "_pack", lambda weight: weight.detach().contiguous())
        assert kernels._faster_bf16_route(["own", "onednn"]) == want, (own_ms, onednn_ms)


def test_the_starts_line_names_the_bf16_route_and_why(monkeypatch):
    """The start's log says which kernel runs the bfloat16 products and why (``kernels.bf16_note``): the project's
    kernel with the instructions it multiplies on, oneDNN's, the measurement that chose between them, the operator's
    switch, or that only one route passed. A line naming the wrong route, or a measurement it did not make, fails."""
    from decoding.runtime import attention_kernels as ak
    monkeypatch.setattr(ak, "bf16_info", lambda: {"dot": True, "calls": 0, "rows": 6})
    monkeypatch.delenv(kernels.BF16_ROUTE_SWITCH, raising=False)
    monkeypatch.setattr(kernels, "_BF16_TIMES", {})
    monkeypatch.setattr(kernels, "_BF16_ROUTE", ["own"])
    assert kernels.bf16_note() == ("bfloat16 products on the project's kernel (AVX-512 BF16 pair products) (the only "
                                   "route whose rows keep their bits at every width here)")
    monkeypatch.setattr(ak, "bf16_info", lambda: {"dot": False, "calls": 0, "rows": 2})
    assert "float32 multiply-adds on widened pairs" in kernels.bf16_note()
    monkeypatch.setattr(kernels, "_BF16_TIMES", {"own": 1.5, "onednn": 0.5})
    monkeypatch.setattr(kernels, "_BF16_ROUTE", ["onednn"])
    assert kernels.bf16_note() == "bfloat16 products on oneDNN's kernel (measured: onednn 0.50 ms, own 1.50 ms)"
    monkeypatch.setattr(kernels, "_BF16_TIMES", {})
    monkeypatch.setenv(kernels.BF16_ROUTE_SWITCH, "onednn")
    assert kernels.bf16_note().endswith(f"({kernels.BF16_ROUTE_SWITCH}=onednn)")
    monkeypatch.setattr(kernels, "_BF16_ROUTE", [None])
    assert kernels.bf16_note() == ""
