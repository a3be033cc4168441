"""Graph discipline on the CPU: the fast path's regions replayed by emulation (``runtime/graphs.py``).

A CUDA graph replays the kernels and addresses it recorded; an input that reached a region other than through
its static buffers is read stale on every replay. CI has no GPU, so within ``graphs.emulation()`` each region's
later calls re-run the FIRST call's closure over the static buffers: the target's forwards (causal, custom masks,
tree layouts) and the prophet head's draft calls (``runtime/headgraph.py``) must then still give greedy's tokens,
and the head the eager head's drafts. Each planted bug below (an input passed around the buffers, a host read
inside a region) is what a graph would silently get wrong; the tests show that emulation catches it.
"""

from __future__ import annotations

import pytest
import torch
from test_prophet import random_prophet

from decoding.events import DraftProposed, DraftTree
from decoding.params import GreedyParams, LookaheadParams, ProphetParams
from decoding.runtime import fastpath, graphs, headgraph
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from decoding.strategies.lookahead import lookahead
from decoding.strategies.speculative import prophet
from decoding.tracer import Tracer

from tiny_models import prompt, tiny_causal

F64 = torch.float64
N = 24


def _fresh_target(seed: int = 0):
    """A tiny float64 Llama with no runner captured yet (a region is stored at its first call)."""
    return tiny_causal("llama", seed=seed, scale=8.0, dtype=F64)


def _drafts(tracer: Tracer) -> list[tuple]:
    """Every step's drafted tokens (and tree shape): what the head proposed, whatever the verifier did."""
    return [(tuple(e.tokens), tuple(getattr(e, "parents", ()))) for e in tracer.events
            if isinstance(e, (DraftTree, DraftProposed))]


# --------------------------------------------------------------------------- the emulation itself

def test_a_replay_reruns_the_stored_closure_into_the_stored_outputs():
    g = graphs.Graphs(torch.device("cpu"))
    buf = torch.tensor([1.0, 2.0])
    with graphs.emulation():
        first = g.run("k", lambda: buf * 2)
        buf.copy_(torch.tensor([5.0, 7.0]))               # a new input, through the buffer
        fresh = torch.tensor([100.0, 100.0])
        again = g.run("k", lambda: fresh * 2)             # a new closure: ignored, as a graph ignores it
    assert again is first                                 # the recorded output tensor, written in place
    assert again.tolist() == [10.0, 14.0]
    assert (g.captures, g.replays) == (1, 1)
    # outside the emulation the same object runs every closure eagerly, counting nothing
    assert g.run("k", lambda: fresh * 2).tolist() == [200.0, 200.0] and g.replays == 1


def test_a_host_read_inside_a_region_is_refused():
    g = graphs.Graphs(torch.device("cpu"))
    x = torch.tensor([3.0])
    with graphs.emulation():
        with pytest.raises(graphs.HostReadInRegion, match="item"):
            g.run("sync", lambda: x * x.item())
        with pytest.raises(graphs.HostReadInRegion, match="tensor"):
            g.run("host data", lambda: x + torch.tensor([4.0]))
    assert float(g.run("sync", lambda: x * x.item())) == 9.0       # eager: allowed


# --------------------------------------------------------------------------- the target and the head, emulated

def test_fast_strategies_keep_greedy_tokens_with_regions_replayed():
    lm = _fresh_target()
    head = random_prophet(lm, 1)
    pair = ModelPair(lm, prophet=head)
    ids = prompt(7, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=N).token_ids
    eager_tree, eager_chain = Tracer(), Tracer()
    prophet(ids, pair, ProphetParams(draft_tokens=4), max_new_tokens=N, tracer=eager_tree)
    prophet(ids, pair, ProphetParams(draft_tokens=4, tree=False), max_new_tokens=N, tracer=eager_chain)
    with graphs.emulation():
        assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=N).token_ids == ref
        assert lookahead(ids, ModelPair(lm), LookaheadParams(window=3, ngram=3, guess_set=2, fast=True),
                         max_new_tokens=N).token_ids == ref
        for params, eager in ((ProphetParams(draft_tokens=4, fast=True), eager_tree),
                              (ProphetParams(draft_tokens=4, fast=True, tree=False), eager_chain)):
            traced = Tracer()
            res = prophet(ids, pair, params, max_new_tokens=N, tracer=traced)
            assert res.token_ids == ref
            assert _drafts(traced) == _drafts(eager), "the graphed head must draft what the eager head drafts"
            assert res.stats["head_graphs"]["replays"] > 0
    # every head call went through a region: captured once per shape, replayed otherwise
    stats = headgraph.pool_stats(head)
    assert stats["captures"] == len(stats["keys"]) and stats["replays"] > 3 * stats["captures"]
    assert ("extend", 1) in stats["keys"] and ("draft", 1) in stats["keys"]
    runner = lm.state.fastpath_runners[0][0]
    kinds = {k[0] for k in runner.graphs.keys()}
    assert {"causal", "custom", "tree", "keep"} <= kinds, kinds    # greedy's, lookahead's, trees', accepted paths'
    assert runner.replays > runner.captures


def test_a_newest_pair_head_and_a_growing_head_cache_draft_as_the_eager_head(monkeypatch):
    """A head without context (its cache holds only the newest pair) and a head cache that outgrows its first
    capacity mid-run (rows copied to a bigger runner, regions captured again) draft what the eager head drafts."""
    monkeypatch.setattr(headgraph, "BUCKET", 16)          # 16 rows: outgrown after a few steps
    lm = _fresh_target()
    ids = prompt(5, 3)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=N).token_ids
    for context in (False, True):
        pair = ModelPair(lm, prophet=random_prophet(lm, 2, context=context))
        eager, traced = Tracer(), Tracer()
        prophet(ids, pair, ProphetParams(draft_tokens=3), max_new_tokens=N, tracer=eager)
        with graphs.emulation():
            res = prophet(ids, pair, ProphetParams(draft_tokens=3, fast=True), max_new_tokens=N, tracer=traced)
        assert res.token_ids == ref and _drafts(traced) == _drafts(eager), context
        capacities = {e[0].capacity for e in pair.prophet.__dict__["_head_runners"]}
        assert max(capacities) > 16 and res.stats["head_graphs"]["replays"] > 0, capacities


def test_a_layer_fusion_head_drafts_on_replayed_regions_as_the_eager_head():
    """The extend region reads the fused layers' states from its input buffer (``[m, (1 + k) H]``)."""
    from test_prophet_fusion import _head, _wake_fusion
    lm = _fresh_target()
    pair = ModelPair(lm, prophet=_wake_fusion(_head(lm, layers=(0, 1), dtype=F64)))
    ids = prompt(6, 2)
    eager, traced = Tracer(), Tracer()
    want = prophet(ids, pair, ProphetParams(draft_tokens=3), max_new_tokens=N, tracer=eager).token_ids
    with graphs.emulation():
        res = prophet(ids, pair, ProphetParams(draft_tokens=3, fast=True), max_new_tokens=N, tracer=traced)
    assert res.token_ids == want == greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=N).token_ids
    assert _drafts(traced) == _drafts(eager) and res.stats["head_graphs"]["replays"] > 0


def test_without_emulation_the_cpu_head_stays_eager():
    lm = _fresh_target()
    head = random_prophet(lm, 1)
    res = prophet(prompt(7, 1), ModelPair(lm, prophet=head), ProphetParams(draft_tokens=3, fast=True),
                  max_new_tokens=8)
    assert "head_graphs" not in res.stats and headgraph.pool_stats(head)["runners"] == 0


# --------------------------------------------------------------------------- planted bugs

def _target_ids_around_the_buffer(monkeypatch):
    real = fastpath.StaticRunner._load
    monkeypatch.setattr(fastpath.StaticRunner, "_load",
                        lambda self, key, ids, pos, mask: {**real(self, key, ids, pos, mask), "ids": ids})


def _window_positions_around_the_buffer(monkeypatch):
    real = fastpath.StaticRunner._load

    def load(self, key, ids, pos, mask):
        buf = real(self, key, ids, pos, mask)
        return buf if mask is None else {**buf, "pos": pos}
    monkeypatch.setattr(fastpath.StaticRunner, "_load", load)


def _tree_layout_around_the_buffer(monkeypatch):
    real = fastpath.StaticRunner._load_tree
    monkeypatch.setattr(fastpath.StaticRunner, "_load_tree", lambda self, key, ids, allowed, offsets: {
        **real(self, key, ids, allowed, offsets), "allowed": allowed, "offsets": offsets})


RUNS = {"greedy": lambda lm, ids: greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=N)}


def test_ids_passed_around_the_target_buffer_break_the_emulated_run(monkeypatch):
    lm = _fresh_target()
    ids = prompt(7, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=N).token_ids
    _target_ids_around_the_buffer(monkeypatch)
    assert RUNS["greedy"](lm, ids).token_ids == ref, "eagerly the planted bug is invisible"
    lm.state.fastpath_runners.clear()                     # nothing captured before the bug
    with graphs.emulation():
        assert RUNS["greedy"](lm, ids).token_ids != ref


def _tree_logits(lm, fast: bool) -> list[torch.Tensor]:
    """Two verify forwards of trees of the same size and different shapes, one after the other."""
    from decoding.runtime.attention import tree_forward
    from decoding.runtime.session import Session
    from decoding.tree import TokenTree
    s = Session(lm, fast=fast, max_len=40)
    s.prefill(prompt(6, 2))
    return [tree_forward(s, [4], TokenTree((5, 9, 14), (-1, 0, 0))),
            tree_forward(s, [7], TokenTree((21, 3, 8), (-1, -1, 1)))]


def _only_the_replay_breaks(lm, two_forwards, plant, region: str | None = None) -> None:
    """``two_forwards(lm, fast)`` gives the plain path's logits when emulated (its forwards in ``region`` regions,
    where named);
    with the bug ``plant()`` put in, still eagerly, but in emulation the second forward (a replay) differs."""
    plain = two_forwards(lm, fast=False)
    with graphs.emulation():
        fast = two_forwards(lm, fast=True)
    assert all(torch.allclose(a, b) for a, b in zip(plain, fast))
    assert region is None or {k[0] for k in lm.state.fastpath_runners[0][0].graphs.keys()} == {region}
    plant()
    assert all(torch.allclose(a, b) for a, b in zip(plain, two_forwards(lm, fast=True)))       # eagerly
    lm.state.fastpath_runners.clear()
    with graphs.emulation():
        first, second = two_forwards(lm, fast=True)
    assert torch.allclose(first, plain[0]) and not torch.allclose(second, plain[1])


def test_a_tree_layout_passed_around_the_buffers_breaks_the_emulated_forward(monkeypatch):
    _only_the_replay_breaks(_fresh_target(), _tree_logits, lambda: _tree_layout_around_the_buffer(monkeypatch),
                            "tree")


def _window_logits(lm, fast: bool) -> list[torch.Tensor]:
    """Two custom-mask forwards of the same width (a window after one token, then after two more)."""
    from decoding.runtime.attention import attention_mask
    from decoding.runtime.session import Session
    s = Session(lm, fast=fast, max_len=40)
    s.prefill(prompt(6, 2))
    out = []
    for block in ([5, 9, 14], [21, 3, 8]):
        allowed = torch.ones(3, 3, dtype=torch.bool).tril()
        allowed[2, 1] = False                                    # a window row that skips its neighbour
        pos = torch.arange(s.length, s.length + 3)
        pos[2] -= 1
        out.append(s.forward(s.tensor([block]), position_ids=pos[None],
                             attention_mask=attention_mask(lm, allowed, pos, s.length)))
    return out


def test_custom_positions_passed_around_the_buffer_break_the_emulated_forward(monkeypatch):
    _only_the_replay_breaks(_fresh_target(), _window_logits, lambda: _window_positions_around_the_buffer(monkeypatch))


def _kept_logits(lm, fast: bool) -> torch.Tensor:
    """Two trees verified and an accepted path of two nodes kept after each (other rows each time), then the
    logits of a forward after them: they read every kept row."""
    from decoding.runtime.attention import tree_forward
    from decoding.runtime.session import Session
    from decoding.tree import TokenTree
    s = Session(lm, fast=fast, max_len=40)
    s.prefill(prompt(6, 2))
    for root, tree, path in ((4, TokenTree((5, 9, 14, 30), (-1, -1, 1, 2)), [1, 2]),
                             (7, TokenTree((21, 3, 8, 11), (-1, 0, -1, 2)), [2, 3])):
        base = s.length
        tree_forward(s, [root], tree)
        s.keep(base, [0] + [1 + i for i in path])
    return s.forward(s.tensor([[12, 13]]))


def test_kept_rows_passed_around_the_buffer_break_the_emulated_cache(monkeypatch):
    lm = _fresh_target()
    plain = _kept_logits(lm, fast=False)
    with graphs.emulation():
        assert torch.allclose(plain, _kept_logits(lm, fast=True))
    real = fastpath.StaticRunner._load_keep
    monkeypatch.setattr(fastpath.StaticRunner, "_load_keep", lambda self, key, src, base: {
        **real(self, key, src, base), "src": torch.tensor(src)})
    lm.state.fastpath_runners.clear()
    with graphs.emulation():
        assert not torch.allclose(plain, _kept_logits(lm, fast=True))


def test_a_write_position_read_on_the_host_is_refused(monkeypatch):
    lm = _fresh_target()
    monkeypatch.setattr(fastpath.StaticRunner, "_write_position",
                        lambda self: torch.tensor(int(self.cache.layers[0].cumulative_length)))
    with graphs.emulation(), pytest.raises(graphs.HostReadInRegion):
        greedy(prompt(7, 1), ModelPair(lm), GreedyParams(fast=True), max_new_tokens=4)


@pytest.mark.parametrize("field", ["pos", "slot", "mask"])
def test_a_head_input_passed_around_its_buffers_changes_the_drafts(monkeypatch, field):
    lm = _fresh_target()
    head = random_prophet(lm, 1)
    ids = prompt(7, 1)
    eager = Tracer()
    prophet(ids, ModelPair(lm, prophet=head), ProphetParams(draft_tokens=4), max_new_tokens=N, tracer=eager)
    real = headgraph.HeadRunner._load

    def load(self, key, inputs, tokens, pos, start, seen):
        fresh = {"pos": pos, "slot": self.rows[start:start + key[1]].clone(), "mask": seen}
        return {**real(self, key, inputs, tokens, pos, start, seen), field: fresh[field]}
    monkeypatch.setattr(headgraph.HeadRunner, "_load", load)
    traced = Tracer()
    with graphs.emulation():
        res = prophet(ids, ModelPair(lm, prophet=head), ProphetParams(draft_tokens=4, fast=True),
                      max_new_tokens=N, tracer=traced)
    assert res.token_ids == greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=N).token_ids   # verified
    assert _drafts(traced) != _drafts(eager)


# --------------------------------------------------------------------------- the bundled model

def test_bundled_model_prophet_on_emulated_graphs_equals_greedy():
    from decoding.harness.runner import encode_prompt
    from decoding.runtime.models import load_model
    lm = load_model("smollm2-135m-instruct")
    pair = ModelPair(lm)
    for text in ("Explain what a binary search does.", "Name three primary colors."):
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        want = greedy(ids, pair, GreedyParams(), max_new_tokens=10).token_ids
        with graphs.emulation():
            res = prophet(ids, pair, ProphetParams(fast=True), max_new_tokens=10)
        assert res.token_ids == want
        assert res.stats["head_graphs"]["replays"] > 0
        assert res.stats["mean_tokens_per_target_forward"] > 1.0     # the shipped head's drafts are accepted
