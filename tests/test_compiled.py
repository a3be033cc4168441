"""The compiled CPU path (decoding/runtime/compiled.py): the same tokens as eager, really used, and eager with a
reason where it cannot run.

Compiling costs seconds per graph (inductor runs a C++ compiler), so the tiny model's engine is built once per
module and its graphs are shared by the tests; inductor's disk cache makes a second run of the suite cheaper.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_prophet import random_prophet

from decoding.harness.runner import encode_prompt
from decoding.params import (
    GreedyParams,
    JacobiParams,
    LookaheadParams,
    PromptLookupParams,
    ProphetParams,
    SpeculativeParams,
)
from decoding.runtime import compiled, fastpath, omp_pool
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import make_generator
from decoding.strategies.baselines import greedy
from decoding.strategies.jacobi import jacobi
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prompt_lookup, prophet, speculative

from tiny_models import prompt, tiny_causal

pytestmark = pytest.mark.skipif(compiled.compiler_missing() is not None,
                                reason=f"no compiler here: {compiled.compiler_missing()}")


@pytest.fixture(scope="module")
def lm():
    model = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float32)
    assert compiled.enable(model) is None
    yield model
    compiled.disable(model)


def _repetitive(lm, n=20):
    seed = prompt(6, 2)
    return seed + greedy(seed, ModelPair(lm), GreedyParams(), max_new_tokens=n).token_ids + seed


def _runs(ids, lm, fast):
    return {
        "greedy": lambda: greedy(ids, ModelPair(lm), GreedyParams(fast=fast), max_new_tokens=36),
        "speculative (self)": lambda: speculative(ids, ModelPair(lm, lm), SpeculativeParams(
            draft_tokens=3, fast=fast), max_new_tokens=36),
        "prompt_lookup": lambda: prompt_lookup(ids, ModelPair(lm), PromptLookupParams(ngram_size=2, fast=fast),
                                               max_new_tokens=36),
        "lookahead": lambda: lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=2,
                                                                            fast=fast), max_new_tokens=36),
        "jacobi": lambda: jacobi(ids, ModelPair(lm), JacobiParams(block_size=5, fast=fast), max_new_tokens=36,
                                 rng=make_generator(0)),
        "prophet (tree)": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                          ProphetParams(draft_tokens=3, tree=True, fast=fast), max_new_tokens=36),
        "prophet (chain)": lambda: prophet(ids, ModelPair(lm, prophet=random_prophet(lm, 1)),
                                           ProphetParams(draft_tokens=3, tree=False, fast=fast), max_new_tokens=36),
    }


def test_every_lossless_strategy_gives_eagers_tokens_compiled(lm):
    engine = compiled.engine(lm)
    for ids in (prompt(7, 1), _repetitive(lm)):
        eager = {name: run().token_ids for name, run in _runs(ids, lm, fast=False).items()}
        assert all(tokens == eager["greedy"] for tokens in eager.values()), "the eager reference itself differs"
        for name, run in _runs(ids, lm, fast=True).items():
            before = engine.calls
            result = run()
            assert result.token_ids == eager["greedy"], name
            # every forward after the prefill went through a compiled graph
            assert engine.calls - before == result.target_forwards - 1 + (
                result.draft_forwards - 1 if name == "speculative (self)" else 0), name


def test_a_counter_shows_the_compiled_forwards_are_the_ones_that_ran(lm):
    ids = prompt(5, 3)
    session = Session(lm, fast=True, max_len=len(ids) + 20)
    session.prefill(ids)
    runner, engine = session.runner, compiled.engine(lm)
    assert runner.engine is engine
    calls, ran = engine.calls, runner.compiled_forwards
    for width in (1, 3, 9):                       # three widths, one graph
        session.forward(session.tensor([[4] * width]))
    assert runner.compiled_forwards == ran + 3 and engine.calls == calls + 3
    # and the logits are eager's for the same cache (the compiled graph is not a stand-in)
    plain = Session(lm)
    plain.prefill(ids)
    for width in (1, 3, 9):
        plain.forward(plain.tensor([[4] * width]))
    session.crop(len(ids) + 4)
    plain.crop(len(ids) + 4)
    fast_logits, eager_logits = session.forward(session.tensor([[5, 6]])), plain.forward(plain.tensor([[5, 6]]))
    assert torch.allclose(fast_logits, eager_logits, atol=1e-4)


def test_wide_forwards_run_in_chunks_and_trees_share_the_one_graph(lm):
    engine = compiled.engine(lm)
    ids = prompt(6, 2)
    plain, fast = Session(lm), Session(lm, fast=True, max_len=len(ids) + 90)
    for session in (plain, fast):
        session.prefill(ids)
    calls = engine.calls
    wide = [[(7 * i) % 90 + 3 for i in range(compiled.ROWS + 8)]]           # 40 rows: two graph calls
    assert torch.allclose(plain.forward(plain.tensor(wide)), fast.forward(fast.tensor(wide)), atol=1e-4)
    assert engine.calls == calls + 2
    # a tree (root, two children that do not see each other): the same graph, eager's logits
    from decoding.runtime.attention import tree_forward
    from decoding.tree import TokenTree
    tree = TokenTree((11, 12, 13), (-1, 0, 0))
    graphs = engine.stats()["graphs"]
    assert torch.allclose(tree_forward(plain, [9], tree), tree_forward(fast, [9], tree), atol=1e-4)
    assert engine.stats()["graphs"] == graphs and engine.calls == calls + 3
    # one compiled entry: no width, layout or caller's tensor made dynamo compile the graph again (other code,
    # which could round a row differently from greedy's)
    assert engine.entries() == graphs


def test_the_graph_checks_few_guards_and_still_one_graph_per_thread_count(lm):
    """Dynamo's guards on the model's modules and the cache's tensors are dropped (checked before every forward,
    they cost ~1 ms of a 6-7 ms one on the bundled int8 model). What stays decides: a forward on another thread
    count must still get a graph of its own (inductor's loops are built for a count), with eager's tokens."""
    engine = compiled.engine(lm)
    ids = prompt(6, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=10).token_ids
    assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=10).token_ids == ref
    guards = next(iter(engine.guards.values()))
    assert 0 < guards.kept < guards.total / 4, (guards.kept, guards.total)
    entries = engine.entries()
    other = 2 if torch.get_num_threads() == 1 else 1
    with omp_pool.threads(other):
        assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=10).token_ids == ref
        # that count's graph takes every width as the first one does (no graph special to one row, then a third)
        wide = lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=2, fast=True),
                         max_new_tokens=10)
        assert wide.token_ids == ref
    assert engine.entries() == entries + 1
    assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=10).token_ids == ref
    assert engine.entries() == entries + 1          # back on the first count: its graph, no third one


def test_the_guard_filter_drops_the_closures_and_the_caches_tensors_only():
    entry = lambda name, kind="TENSOR_MATCH": type("Entry", (), {"name": name, "guard_type": kind})()  # noqa: E731
    keep = compiled.GuardFilter(frozenset({"body", "head", "joined"}))
    names = [entry("body.layers[0].self_attn.q_proj.weight"), entry("type(joined[3]).__call__", "CLOSURE_MATCH"),
             entry("dict(type(body).forward)", "CONSTANT_MATCH"), entry("keys[4]"), entry("keys_t[0]", "TYPE_MATCH"),
             entry("keys", "SEQUENCE_LENGTH"), entry("ids"), entry("mask", "TYPE_MATCH"), entry("", "GLOBAL_STATE"),
             entry("G['torch']", "MODULE_MATCH"), entry("headroom")]
    assert keep(names) == [False, False, False, False, False, True, True, True, True, True, True]
    assert (keep.kept, keep.total) == (6, 11)


def test_one_set_of_graphs_serves_every_cache_capacity(lm):
    engine = compiled.engine(lm)
    greedy(prompt(6, 0), ModelPair(lm), GreedyParams(fast=True), max_new_tokens=8)
    graphs = engine.stats()["graphs"]
    long = prompt(fastpath.BUCKET + 40, 5)            # a second capacity (two buckets) and a runner that grows
    ref = greedy(long, ModelPair(lm), GreedyParams(), max_new_tokens=12).token_ids
    assert greedy(long, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=12).token_ids == ref
    assert engine.stats()["graphs"] == graphs


def test_the_hidden_states_are_the_ones_transformers_reports(lm):
    ids = prompt(6, 4)
    plain, fast = Session(lm), Session(lm, fast=True, max_len=len(ids) + 8)
    plain.prefill(ids)
    fast.prefill(ids)
    ran = fast.runner.compiled_forwards
    for session in (plain, fast):
        session.forward(session.tensor([[7, 8, 9]]), hidden=True)
    assert fast.runner.compiled_forwards == ran + 1
    assert torch.allclose(plain.last_hidden, fast.last_hidden, atol=1e-5)
    plain.hidden_layers = fast.hidden_layers = (1,)   # a layer-fusion head's input: the last layer's, then layer 1's
    for session in (plain, fast):
        session.forward(session.tensor([[10]]), hidden=True)
    assert plain.last_hidden.shape == fast.last_hidden.shape
    assert torch.allclose(plain.last_hidden, fast.last_hidden, atol=1e-5)


def test_models_the_compiler_does_not_take_stay_eager_and_say_why():
    gpt2 = tiny_causal("gpt2", seed=0)
    assert "gpt2" in compiled.enable(gpt2) and compiled.engine(gpt2) is None
    session = Session(gpt2, fast=True, max_len=20)
    session.prefill(prompt(5, 0))
    ran = session.runner.compiled_forwards
    session.forward(session.tensor([[3]]))
    assert session.runner.engine is None and session.runner.compiled_forwards == ran == 0
    from decoding.runtime.kernels import HalfLinear, half_available
    if half_available():           # FBGEMM's float16 weights stay eager; the project's kernel's compile
        llama = tiny_causal("llama", seed=0)
        llama.model.lm_head = HalfLinear(llama.model.lm_head)
        assert "float16" in compiled.why_not(llama)
        llama.model.lm_head = HalfLinear(llama.model.lm_head.unpacked(), own=True)
        assert compiled.why_not(llama) is None


def test_without_a_compiler_the_model_runs_eagerly_and_says_why(monkeypatch):
    from web.requests import ui_default
    from web.settings import Settings
    from web.startup import compile_unpublished
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    assert "C++ compiler" in compiled.compiler_missing()
    model = tiny_causal("llama", seed=3)
    assert "C++ compiler" in compile_unpublished(model)
    assert compiled.engine(model) is None
    if not torch.cuda.is_available():
        assert ui_default("greedy", "fast", Settings(compiled=False)) is False
    # the run itself still works, eagerly
    ids = prompt(6, 1)
    assert greedy(ids, ModelPair(model), GreedyParams(fast=True), max_new_tokens=6).token_ids == \
        greedy(ids, ModelPair(model), GreedyParams(), max_new_tokens=6).token_ids
    monkeypatch.undo()
    monkeypatch.setenv(compiled.ENV_SWITCH, "0")
    assert "DECODING_COMPILE=0" in compiled.why_not(model)


def test_the_page_ticks_fast_where_the_forward_was_compiled():
    from web.requests import ui_default
    from web.settings import Settings
    assert ui_default("prophet", "fast", Settings(compiled=True)) is True
    assert ui_default("greedy", "fast", Settings(compiled=True)) is True
    assert ui_default("greedy", "fast", Settings(compiled=False)) is torch.cuda.is_available()


@pytest.fixture(scope="module")
def bundled():
    from decoding.runtime.models import load_model
    model = load_model("smollm2-135m-instruct")
    assert compiled.enable(model) is None
    yield model
    compiled.disable(model)


def test_the_bundled_model_gives_the_same_tokens_compiled_and_eager(bundled):
    from decoding.runtime.head import load_prophet, shipped_head
    text = "Repeat this list exactly, twice: apples, pears, plums, figs, dates."
    ids = encode_prompt(bundled.tokenizer, text, chat=True)
    eager = greedy(ids, ModelPair(bundled), GreedyParams(), max_new_tokens=24).token_ids
    engine = compiled.engine(bundled)
    before = engine.calls
    runs = [greedy(ids, ModelPair(bundled), GreedyParams(fast=True), max_new_tokens=24)]
    pair = ModelPair(bundled, None, prophet=load_prophet(shipped_head(bundled), bundled))
    runs.append(prophet(ids, pair, ProphetParams(fast=True), max_new_tokens=24))
    runs.append(prompt_lookup(ids, ModelPair(bundled), PromptLookupParams(fast=True), max_new_tokens=24))
    assert [run.token_ids for run in runs] == [eager] * 3
    assert runs[1].target_forwards < runs[0].target_forwards and runs[2].target_forwards < runs[0].target_forwards
    # every forward after each prefill ran compiled
    assert engine.calls - before == sum(run.target_forwards - 1 for run in runs)


@pytest.mark.parametrize("weights", ["bf16", "packed", "fp16"])
def test_joined_projections_are_used_and_keep_every_strategys_tokens(weights):
    """q/k/v and gate/up run as one product each in the compiled graph (runtime/compiled._Joined): on a model
    whose linears allow it, every layer is joined, and every lossless strategy still gives eager greedy's tokens
    (a join that split its output in the wrong order, or dropped a bias, would not). ``fp16``: a float16-weight
    target on the project's kernel (``kernels.half_linears``): compiled, every lossless strategy gives the
    compiled greedy's tokens, and the kernel is the one that ran (its calls counted); the same for bfloat16 weights
    on the project's kernel where that is this machine's route."""
    from decoding.runtime import attention_kernels, kernels
    if weights == "bf16" and not kernels.bf16_available():
        pytest.skip("no bfloat16-weight linears on this machine")
    if weights == "fp16" and not kernels.half_available():
        pytest.skip("no float16-weight linears on this machine")
    if not kernels.available():
        pytest.skip("no oneDNN linears in this PyTorch")
    model = tiny_causal("llama", seed=3, scale=8.0, dtype=torch.float32)
    swap = {"bf16": kernels.bf16_linears, "packed": kernels.pack_linears, "fp16": kernels.half_linears}
    assert swap[weights](model.model) > 0
    if weights == "fp16":
        assert attention_kernels.ready() and all(m.own for m in model.model.modules()
                                                 if isinstance(m, kernels.HalfLinear))
    assert compiled.enable(model) is None
    try:
        engine = compiled.engine(model)
        assert all(qkv is not None and gate_up is not None for qkv, gate_up in engine.joined())
        assert engine.joined()[0][0].sizes == [64, 32, 32] and engine.joined()[0][1].sizes == [128, 128]
        for ids in (prompt(7, 1), _repetitive(model)):
            want = greedy(ids, ModelPair(model), GreedyParams(fast=weights == "fp16"), max_new_tokens=36).token_ids
            if weights == "fp16":       # and eager greedy on the same kernel agrees here too
                assert greedy(ids, ModelPair(model), GreedyParams(), max_new_tokens=36).token_ids == want
            for name, run in _runs(ids, model, fast=True).items():
                assert run().token_ids == want, name
        assert engine.entries() == 1
        # the project's float16 kernel is what runs, eager and compiled
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            greedy(prompt(7, 1), ModelPair(model), GreedyParams(fast=True), max_new_tokens=3)
        calls = sum(e.count for e in prof.key_averages() if e.key == "decoding_attention::half_linear")
        bf16_calls = sum(e.count for e in prof.key_averages() if e.key == "decoding_attention::bf16_linear")
        layers = len(model.model.model.layers)
        # the eager prefill's 7 products a layer and the head, then 2 compiled forwards of 4 (joined) and the head
        assert calls == ((7 * layers + 1) + 2 * (4 * layers + 1) if weights == "fp16" else 0), calls
        # bfloat16 weights: the same count on the project's kernel where it is this machine's route (else oneDNN's)
        own_bf16 = weights == "bf16" and kernels.bf16_route() == "own"
        assert bf16_calls == ((7 * layers + 1) + 2 * (4 * layers + 1) if own_bf16 else 0), bf16_calls
    finally:
        compiled.disable(model)


def test_a_tree_row_gets_the_bits_of_greedys_one_position_forward():
    """The property the lossless strategies rest on in compiled mode (runtime/compiled._attend): a row of a tree
    forward, with siblings' slots between its ancestors, gets exactly the logits compiled greedy's one-position
    forward gives at its position. On a bfloat16-weight model, whose linears keep rows independent of the width
    (kernels.bf16_available), so a difference can only come from attention."""
    from decoding.runtime import kernels
    from decoding.runtime.attention import tree_forward
    from decoding.tree import TokenTree
    if not (kernels.available() and kernels.bf16_available()):
        pytest.skip("no bfloat16-weight linears on this machine")
    model = tiny_causal("llama", seed=5, dtype=torch.float32)
    kernels.bf16_linears(model.model)
    assert compiled.enable(model) is None
    try:
        ids = prompt(21, 4)                       # 21 + 7 rows: the span crosses a 16-slot boundary
        session = Session(model, fast=True, max_len=len(ids) + 40)
        session.prefill(ids)
        n = session.length
        path = [9, 21, 33, 45]
        one_by_one = [session.forward(session.tensor([[tok]]))[0, -1] for tok in path]
        session.crop(n)
        # after 9: 50 and 21; after 21: 60 and 33; after 33: 70 and 45 (each path node has a sibling before it)
        tree = TokenTree((50, 21, 60, 33, 70, 45), (-1, -1, 1, 1, 3, 3))
        rows = tree_forward(session, [9], tree)
        for got, want in zip((rows[0], rows[2], rows[4], rows[6]), one_by_one):
            assert torch.equal(got, want)
    finally:
        compiled.disable(model)


@pytest.mark.parametrize("kernel", [False, True], ids=["inductor", "cpp-kernel"])
def test_attention_gives_a_row_the_same_bits_wherever_its_keys_sit(kernel, tmp_path):
    """runtime/compiled._attend alone, compiled as the engine compiles it (one graph, rows and span symbols), on
    float32 data that rounds visibly: rows of a tree (each with siblings' slots between its keys) equal the same
    rows computed one at a time over their keys laid out one after another, bit for bit. A softmax denominator
    summed over the slots as they lie (holes in place), or any step whose order a hole changes, fails here."""
    from decoding.runtime import attention_kernels
    if kernel and attention_kernels.load(compiled.cache_dir() / "decoding-attention") is not None:
        pytest.skip(f"no attention kernel here: {attention_kernels.load(tmp_path)}")
    kv, rep, d, capacity, n = 2, 2, 16, 64, 21
    gen = torch.Generator().manual_seed(0)
    keys_t = torch.randn(kv, d, capacity, generator=gen)
    values = torch.randn(1, kv, capacity, d, generator=gen)
    attend = torch.compile(compiled._attend, dynamic=None, fullgraph=True)

    def call(q, keys_t, values, seen):
        span = -(-int(seen.shape[1]) // 16) * 16
        full = torch.zeros(q.shape[2], span, dtype=torch.bool)
        full[:, : seen.shape[1]] = seen
        mask = torch.zeros(full.shape).masked_fill_(~full, float("-inf"))
        slots = torch.arange(span).expand_as(full)
        order = torch.where(full, slots, slots + span).argsort(dim=1)
        for tensor, dim in ((q, 2), (mask, 0), (order, 0)):
            torch._dynamo.decorators.mark_unbacked(tensor, dim)
        torch._dynamo.mark_dynamic(mask, 1)
        torch._dynamo.mark_dynamic(order, 1)
        return attend(q, keys_t, values, mask, order, 0.25, kernel)

    parents = (-1, -1, 1, 1, 3, 3, 0)                 # a tree over slots n..n+6; each row sees its ancestors
    seen = torch.zeros(len(parents), n + len(parents), dtype=torch.bool)
    seen[:, :n] = True
    for row in range(len(parents)):
        node = row
        while node >= 0:
            seen[row, n + node] = True
            node = parents[node]
    q = torch.randn(1, kv * rep, len(parents), d, generator=gen)
    together = call(q, keys_t, values, seen)
    for row in range(len(parents)):
        slots = seen[row].nonzero().flatten()                  # its keys, laid out one after another
        packed_k, packed_v = keys_t.clone(), values.clone()
        packed_k[:, :, : len(slots)] = keys_t[:, :, slots]
        packed_v[:, :, : len(slots)] = values[:, :, slots]
        alone = call(q[:, :, row:row + 1].clone(), packed_k, packed_v,
                     torch.ones(1, len(slots), dtype=torch.bool))
        assert torch.equal(alone[0], together[row]), row


def test_the_accepted_path_moves_in_one_kernel_call_as_keep_moves_it(lm, monkeypatch):
    """``StaticRunner.keep`` on the compiled path (``move_rows`` of the attention kernel): the same cache as the
    tensor-by-tensor move, for keys, values and the transposed keys alike, and really the path a compiled
    prophet's steps take."""
    from decoding.runtime import attention_kernels
    if compiled.engine(lm).attention is not None:
        pytest.skip(f"no attention kernel here: {compiled.engine(lm).attention}")
    gen = torch.Generator().manual_seed(1)
    caches = [torch.randn(1, 2, 48, 16, generator=gen), torch.randn(2, 16, 48, generator=gen)]
    want = [c.clone() for c in caches]
    base, rows = 9, [0, 2, 3, 7, 11]
    src = torch.tensor([base + r for r in rows])
    want[0][:, :, base:base + len(rows)] = want[0].index_select(2, src)
    want[1][:, :, base:base + len(rows)] = want[1].index_select(2, src)
    torch.ops.decoding_attention.move_rows(caches, torch.tensor(rows), base)
    assert all(torch.equal(got, ref) for got, ref in zip(caches, want))
    assert attention_kernels.ready()
    moved = []
    original = fastpath.StaticRunner._move_in_one_call
    monkeypatch.setattr(fastpath.StaticRunner, "_move_in_one_call",
                        lambda self, base, rows: moved.append(original(self, base, rows)) or moved[-1])
    ids = _repetitive(lm)
    want_ids = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=36).token_ids
    run = _runs(ids, lm, fast=True)["prophet (tree)"]()
    assert run.token_ids == want_ids and moved and all(moved)


def test_the_kernels_argmax_gives_torchs_indices_and_greedy_verification_uses_it(lm, monkeypatch):
    """``argmax_rows`` (PyTorch's argmax costs ~10x a max over a wide forward's logits here): the first maximum,
    a NaN counting as largest, as ``torch.argmax``; and the greedy verification of a compiled run reads it."""
    from decoding.runtime import attention_kernels
    if compiled.engine(lm).attention is not None:
        pytest.skip(f"no attention kernel here: {compiled.engine(lm).attention}")
    gen = torch.Generator().manual_seed(3)
    ties = torch.randint(0, 3, (6, 1000), generator=gen).float()          # many equal maxima: the first wins
    late = torch.randn(2, 3000, generator=gen)
    late[:, 2999] = late[:, 64] = 50.0                                     # the same maximum early and at the tail
    nan = torch.randn(3, 500, generator=gen)
    nan[1, 300] = nan[1, 400] = float("nan")
    nan[2, 3] = float("inf")
    cases = [torch.randn(11, 49152, generator=gen), torch.randn(1, 17, generator=gen), ties, late, nan,
             torch.full((2, 100), float("-inf")), torch.tensor([[0.0, -0.0, 0.0]]), torch.tensor([[-0.0, 0.0]])]
    for case in cases:
        assert torch.equal(attention_kernels.argmax_rows(case), case.argmax(-1)), case
    calls = []
    original = torch.ops.decoding_attention.argmax_rows

    class Counting:                       # torch.ops attributes cannot be set: wrap the namespace's op
        def __call__(self, x):
            calls.append(x.shape)
            return original(x)
    monkeypatch.setattr(attention_kernels, "_argmax_op", Counting(), raising=False)
    ids = _repetitive(lm)
    want = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=24).token_ids
    assert _runs(ids, lm, fast=True)["prophet (tree)"]().token_ids[:24] == want
    assert calls and all(shape[0] >= 1 for shape in calls)
