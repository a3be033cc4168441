"""The prophet's measured tree budget (#26 item 4): verify the prefix of the ranked tree that maximizes
expected tokens per ms of the measured verify forward.

The rule must read both the costs and the probabilities (a rule that ignores either fails here), the
kept nodes always form a tree, the output stays greedy's, and the forward-cost curve is measured once
per model, positive and finite.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from test_prophet import _greedy, exactness_cases, random_prophet

from decoding.drafting.budget import choose_budget, rank_nodes
from decoding.drafting.dynamic import grow
from decoding.params import MEASURED_NODES, TREE_DEFAULTS
from decoding.drafting.prophet import ProphetDrafter
from decoding.harness.runner import run_comparison
from decoding.params import ProphetParams, parse_params
from decoding.runtime import forward_cost as fc
from decoding.runtime.forward_cost import ForwardCost, calibrate, forward_cost
from decoding.runtime.pair import ModelPair
from decoding.strategies.speculative import prophet
from decoding.tracer import Tracer
from playground.cli import _parse_sets
from visualize.checks import check_result

from tiny_models import prompt, tiny_causal

F64 = torch.float64
FLAT = ForwardCost({1: 10.0, 65: 10.0})                      # a wide forward costs a narrow one (a GPU)
STEEP = ForwardCost({1: 1e6, 65: 65e6})                      # every position costs a whole forward
PROBS = [0.9, 0.8, 0.6, 0.5, 0.3, 0.2, 0.1, 0.05]            # path probabilities, best first


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def brute_force(probs, cost, draft_ms):
    """The best prefix by trying every one (the rule's definition, written out)."""
    values = [(1 + sum(probs[:n])) / (cost(1 + n) + draft_ms) for n in range(len(probs) + 1)]
    return max(range(len(values)), key=lambda n: (values[n], -n))


# --------------------------------------------------------------------------- (a) the costs decide

def test_a_flat_curve_keeps_the_whole_tree_and_a_steep_one_keeps_fewer():
    assert choose_budget(PROBS, FLAT, 0.0).nodes == len(PROBS)
    assert choose_budget(PROBS, FLAT, 5.0).nodes == len(PROBS)
    assert choose_budget(PROBS, STEEP, 0.0).nodes == 0          # no path is sure enough to pay a whole forward
    # a CPU-like curve: flat up to 9 positions, then each position costs 8 % of a forward
    cpu = ForwardCost({1: 10.0, 9: 10.0, 65: 10.0 + 0.8 * 56})
    assert choose_budget(PROBS + [0.04] * 20, cpu, 2.0).nodes == 8
    # hand-computed: c(T) = 10 + 2 (T - 1), d = 0: value(n) = (1 + S_n) / (10 + 2n)
    linear = ForwardCost({1: 10.0, 65: 138.0})
    chosen = choose_budget(PROBS, linear, 0.0)
    assert chosen.nodes == 4 and chosen.expected == pytest.approx(3.8) and chosen.ms == pytest.approx(18.0)


def test_two_cost_curves_give_two_sizes_on_the_same_probabilities():
    """Fails when the rule ignores the costs."""
    cheap = ForwardCost({1: 10.0, 5: 10.5, 65: 40.0})
    dear = ForwardCost({1: 10.0, 3: 14.0, 65: 200.0})
    sizes = {choose_budget(PROBS, curve, 1.0).nodes for curve in (FLAT, cheap, dear, STEEP)}
    assert len(sizes) == 4
    for curve in (FLAT, cheap, dear, STEEP):
        for d in (0.0, 1.0, 30.0):
            assert choose_budget(PROBS, curve, d).nodes == brute_force(PROBS, curve, d)


def test_drafting_time_counts_against_every_tree_alike():
    """A long draft makes the forward's extra width relatively cheaper: never fewer nodes."""
    curve = ForwardCost({1: 10.0, 65: 138.0})
    sizes = [choose_budget(PROBS, curve, d).nodes for d in (0.0, 10.0, 100.0, 1e4)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] == len(PROBS)


# --------------------------------------------------------------------------- (b) the probabilities decide

def test_confident_and_unsure_trees_get_different_sizes_under_one_curve():
    """Fails when the rule ignores the probabilities."""
    curve = ForwardCost({1: 10.0, 65: 138.0})
    assert choose_budget([0.95] * 8, curve, 0.0).nodes == 8
    assert choose_budget([0.05] * 8, curve, 0.0).nodes == 0
    assert choose_budget([0.9, 0.9, 0.1, 0.1], curve, 0.0).nodes == 2
    chosen = choose_budget([0.9, 0.9, 0.1, 0.1], curve, 0.0)
    assert chosen.expected == pytest.approx(2.8) and chosen.full_value < chosen.value and chosen.gain > 1


def test_random_cases_match_the_definition():
    rng = random.Random(0)
    for _ in range(300):
        probs = sorted((rng.random() ** 2 for _ in range(rng.randint(0, 20))), reverse=True)
        pts = {1: rng.uniform(1, 20)}
        for t in sorted(rng.sample(range(2, 66), 4)):
            pts[t] = pts[max(pts)] + rng.uniform(0, 30)
        curve, d = ForwardCost(pts), rng.choice([0.0, rng.uniform(0, 50)])
        assert choose_budget(probs, curve, d).nodes == brute_force(probs, curve, d)


def _fake_expand(rows_by_node):
    def expand(g, nodes):
        return torch.stack([rows_by_node(g, e) for e in nodes])
    return expand


def test_grow_offers_path_probabilities_in_rank_order():
    """The rule is given each kept node's path probability (product of confidences), best first."""
    root = torch.tensor([0.6, 0.3, 0.1, 0.0]).clamp_min(1e-9).log()

    def child_row(g, e):          # node e's children: 0.5, 0.25, ... of its own token + 1
        return torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    seen = []

    def choose(probs):
        seen.append(list(probs))
        return len(probs)
    prop = grow(root, _fake_expand(child_row), depth=2, topk=2, budget=6, choose=choose)
    assert len(seen) == 1 and len(prop) == 6
    want = sorted([0.6, 0.3, 0.6 * 0.5, 0.6 * 0.3, 0.3 * 0.5, 0.3 * 0.3], reverse=True)
    assert seen[0] == pytest.approx(want)
    cut = grow(root, _fake_expand(child_row), depth=2, topk=2, budget=6, choose=lambda probs: 3)
    assert len(cut) == 3 and sorted(cut.tree.tokens) == [0, 0, 1]   # 0.6, 0.3, then 0.6 * 0.5


def _counting(rows_by_node):
    calls = []

    def expand(g, nodes):
        calls.append(len(nodes))
        return torch.stack([rows_by_node(g, e) for e in nodes])
    return expand, calls


def _path_row(g, e, width=6, sharp=2.0):
    """A fixed pseudo-random child distribution per path (the same node gets the same row in every tree)."""
    path = tuple(g.tokens[a] for a in reversed([e] + g.ancestors(e)))
    gen = torch.Generator().manual_seed(hash(path) % (2**31))
    return (torch.randn(width, generator=gen) * sharp).log_softmax(-1)


def test_nodes_that_cannot_reach_the_kept_set_are_not_expanded():
    """Four equally likely first tokens and a budget of 4: nothing below them can be kept, so no head call."""
    flat = torch.full((4,), 0.25).log()
    expand, calls = _counting(lambda g, e: flat)
    prop = grow(flat, expand, depth=5, topk=4, budget=4)
    assert calls == [] and sorted(prop.tree.tokens) == [0, 1, 2, 3]
    expand, calls = _counting(lambda g, e: flat)
    same = grow(flat, expand, depth=5, topk=4, budget=4, prune=False)
    assert len(calls) == 4 and same.tree.tokens == prop.tree.tokens and same.tree.parents == prop.tree.parents


def test_pruning_never_costs_kept_probability_and_never_adds_head_calls():
    rng = random.Random(0)
    fewer = 0
    for case in range(200):
        width, topk = rng.randint(3, 6), rng.randint(1, 4)
        budget, depth, sharp = rng.randint(2, 16), rng.randint(2, 7), rng.uniform(0.5, 4.0)
        root = (torch.randn(width, generator=torch.Generator().manual_seed(case)) * sharp).log_softmax(-1)
        row = lambda g, e: _path_row(g, e, width, sharp)          # noqa: E731
        results = {}
        for prune in (True, False):
            expand, calls = _counting(row)
            seen = []
            grow(root, expand, depth=depth, topk=topk, budget=budget, prune=prune,
                 choose=lambda probs: seen.append(list(probs)) or len(probs))
            results[prune] = (sum(seen[0]), calls)
        (kept_p, calls_p), (kept_u, calls_u) = results[True], results[False]
        assert kept_p >= kept_u - 1e-9, case                     # the kept nodes' path probability mass
        assert len(calls_p) <= len(calls_u) and sum(calls_p) <= sum(calls_u), case
        fewer += sum(calls_p) < sum(calls_u)
    assert fewer > 20                                              # it does save head positions


# --------------------------------------------------------------------------- (d) always a tree

def test_every_prefix_of_the_ranking_is_a_tree():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 40)
        parents = [-1] + [rng.randint(-1, i - 1) for i in range(1, n)]
        scores = [rng.uniform(-5, 0) for _ in range(n)]     # children may outscore parents here
        order = rank_nodes(scores, parents)
        assert sorted(order) == list(range(n))
        placed = set()
        for node in order:
            assert parents[node] < 0 or parents[node] in placed
            placed.add(node)
        # where children never outscore their parents it is the plain ranking (the fixed budget's)
        mono = [0.0] * n
        for i in range(n):
            mono[i] = (0.0 if parents[i] < 0 else mono[parents[i]]) + rng.uniform(-2, 0)
        assert rank_nodes(mono, parents) == sorted(range(n), key=lambda i: (-mono[i], i))


def test_sampled_trees_keep_a_prefix_of_each_nodes_draws():
    """Under sampling the kept children of a node are its first draws (lossless verification needs it)."""
    gen = torch.Generator().manual_seed(0)
    root = torch.randn(30, dtype=F64).log_softmax(-1)
    grown = {}

    def expand(g, nodes):
        grown["g"] = g
        return torch.stack([torch.randn(30, generator=gen, dtype=F64).log_softmax(-1) for _ in nodes])
    for n in range(0, 20):
        prop = grow(root, expand, depth=3, topk=4, budget=20, sample=True, rng=gen, choose=lambda probs, n=n: n)
        tree, g = prop.tree, grown["g"]
        assert len(tree) == n
        # each node is known by its token path (siblings drawn without replacement differ)
        def path(tokens, parents, i):
            out = []
            while i >= 0:
                out.append(tokens[i])
                i = parents[i]
            return tuple(reversed(out))
        drawn = {}
        for i in range(len(g.tokens)):
            drawn.setdefault(path(g.tokens, g.parents, g.parents[i]) if g.parents[i] >= 0 else (), []).append(
                g.tokens[i])
        for node in [-1] + list(range(len(tree))):
            at = () if node < 0 else path(tree.tokens, tree.parents, node)
            kept = [tree.tokens[c] for c in tree.children(node)]
            assert kept == drawn.get(at, [])[:len(kept)], (n, at)


# --------------------------------------------------------------------------- (c) exact, in the real loop

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_measured_budget_is_exactly_greedy(arch):
    for seed, pair, p, want in exactness_cases(arch):
        for kw in ({"lookup": False}, {}, {"tree_nodes": 5, "tree_topk": 2, "draft_tokens": 3}, {"fast": True}):
            tracer = Tracer()
            res = prophet(p, pair, ProphetParams(budget="measured", **kw), max_new_tokens=30, tracer=tracer)
            assert res.token_ids == want, (arch, seed, kw)
            summary, sizes = res.stats["tree_budget"], res.stats["tree_budget_nodes"]
            assert summary["mode"] == "measured" and len(sizes) == summary["steps"] > 0
            cap = kw.get("tree_nodes", MEASURED_NODES["cpu"])
            assert all(0 <= s <= cap for s in sizes)
            assert summary["mean_kept_nodes"] <= summary["mean_offered_nodes"]
            assert math.isfinite(summary["mean_predicted_speedup"]) and summary["mean_expected_tokens"] >= 1
            for e in tracer.events:      # every verified tree is a tree, its mask the root and its nodes
                if type(e).__name__ == "DraftTree":
                    assert all(-1 <= q < i for i, q in enumerate(e.parents))
                    assert e.mask_size == 1 + len(e.tokens)


def test_the_drafter_keeps_what_the_injected_costs_say():
    """In the loop: a flat curve verifies every grown node, a steep one none; the same head and prompts.
    Fails when the drafter ignores the costs."""
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair = ModelPair(target, prophet=random_prophet(target, 0))
    params = ProphetParams(budget="measured", lookup=False, tree_nodes=12)
    p = prompt(9, seed=3)
    want = _greedy(pair, p, 24)
    kept = {}
    for name, curve in (("flat", FLAT), ("steep", STEEP)):
        target.state.forward_cost = {False: curve}                 # the model's curve, as if measured
        res = prophet(p, pair, params, max_new_tokens=24)
        assert res.token_ids == want
        kept[name] = res.stats
    flat, steep = kept["flat"]["tree_budget"], kept["steep"]["tree_budget"]
    assert flat["mean_kept_nodes"] == flat["mean_offered_nodes"] > 1
    assert steep["mean_kept_nodes"] == 0 and kept["steep"]["drafted_nodes"] == 0
    assert kept["flat"]["drafted_nodes"] > 0 and kept["steep"]["mean_tokens_per_target_forward"] == 1
    assert flat["c1_ms"] == 10.0 and steep["c65_ms"] == 65e6


def test_the_drafter_keeps_more_of_a_confident_heads_tree():
    """The same curve, a peaky head and a nearly uniform one: the confident tree keeps more nodes.
    Fails when the drafter ignores the probabilities."""
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    curve = ForwardCost({1: 1e5, 65: 1e5 * (1 + 0.5 * 64)})  # each node costs half a forward; drafting is noise
    target.state.forward_cost = {False: curve}
    params = ProphetParams(budget="measured", lookup=False, tree_nodes=12)
    means = []
    for scale in (40.0, 0.001):
        res = prophet(prompt(9, seed=3), ModelPair(target, prophet=random_prophet(target, 0, scale=scale)), params,
                      max_new_tokens=20)
        means.append(res.stats["tree_budget"]["mean_kept_nodes"])
    assert means[0] > means[1] == 0


def test_a_fixed_budget_is_unchanged_and_reports_nothing():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair = ModelPair(target, prophet=random_prophet(target, 0))
    target.state.forward_cost = {False: FLAT}
    res = prophet(prompt(9, seed=3), pair, ProphetParams(lookup=False), max_new_tokens=20)
    assert "tree_budget" not in res.stats and res.stats["mean_nodes_per_step"] <= TREE_DEFAULTS["cpu"][1]
    with pytest.raises(ValueError, match="forward-cost curve"):
        ProphetDrafter(pair.prophet, ProphetParams(budget="measured"))


def test_sampling_with_a_measured_budget_runs_and_reports():
    target = tiny_causal("llama", seed=0, scale=2.0, dtype=F64)
    pair = ModelPair(target, prophet=random_prophet(target, 0))
    target.state.forward_cost = {False: ForwardCost({1: 1.0, 65: 20.0})}
    res = prophet(prompt(9, seed=3), pair, ProphetParams(budget="measured", temperature=1.0), max_new_tokens=20,
                  rng=torch.Generator().manual_seed(0))
    assert len(res.token_ids) == 20 and res.stats["tree_budget"]["steps"] > 0


# --------------------------------------------------------------------------- (e) the curve

def test_calibration_is_positive_finite_and_measured_once_per_model():
    target = tiny_causal("llama", seed=0, dtype=F64)
    calls = []

    def measure(lm, max_width, **kw):
        calls.append((lm.uid, max_width))
        return calibrate(lm, max_width, repeats=1, **kw)
    curve = forward_cost(target, 9, measure=measure)
    assert curve.source == "measured" and curve.max_width == 9
    assert sorted(curve.points) == [1, 2, 3, 4, 6, 9]
    assert all(math.isfinite(ms) and ms > 0 for ms in curve.points.values())
    assert all(curve(t) > 0 for t in (0, 1, 5, 7.5, 9, 100))
    assert forward_cost(target, 9, measure=measure) is curve                 # cached on the model
    assert forward_cost(target, 4, measure=measure) is curve
    assert len(calls) == 1
    wider = forward_cost(target, 18, measure=measure)                        # wider than measured: again
    assert wider.max_width == 18 and len(calls) == 2 and forward_cost(target, 18, measure=measure) is wider
    other = tiny_causal("gpt2", seed=0, dtype=F64)
    forward_cost(other, 9, measure=measure)
    assert len(calls) == 3 and target.state.forward_cost[False] is wider        # each model its own


def test_calibration_times_each_width_with_the_timer_it_is_given():
    target = tiny_causal("llama", seed=0, dtype=F64)
    timed = []

    def timer(fn):
        fn()
        timed.append(1)
        return 2.0 + len(timed)
    curve = calibrate(target, 13, repeats=2, timer=timer)
    widths = [1, 2, 3, 4, 6, 9, 10, 13]
    # each width twice, and the star tree (the cost of a path, ForwardCost.per_path_ms) twice
    assert sorted(curve.points) == widths and len(timed) == 2 * len(widths) + 2
    assert all(ms >= 3.0 for ms in curve.points.values())   # the fastest of each width's two timings


def test_the_curve_interpolates_and_refuses_nonsense():
    curve = ForwardCost({1: 10.0, 9: 10.0, 17: 30.0})
    assert curve(5) == 10.0 and curve(13) == pytest.approx(20.0) and curve(40) == 30.0 and curve(0) == 10.0
    for bad in ({}, {1: 0.0}, {1: float("nan")}, {0: 1.0}, {1: -3.0}):
        with pytest.raises(ValueError):
            ForwardCost(bad)


# --------------------------------------------------------------------------- parameters

def test_the_budget_parameter_is_validated_and_reaches_the_cli():
    assert ProphetParams().budget == "fixed"
    assert parse_params(ProphetParams, {"budget": " measured "}).budget == "measured"
    with pytest.raises(ValueError, match=r"budget must be one of fixed, measured .* got 'auto'"):
        parse_params(ProphetParams, {"budget": "auto"})
    with pytest.raises(ValueError, match="budget must be"):
        ProphetParams(budget=3)
    with pytest.raises(ValueError, match="needs tree=true"):
        parse_params(ProphetParams, {"budget": "measured", "tree": "false"})
    assert _parse_sets(["prophet.budget=measured"], ["greedy", "prophet"])["prophet"] == {"budget": "measured"}
    assert ProphetParams(budget="measured").tree_shape("cpu") == (TREE_DEFAULTS["cpu"][0], MEASURED_NODES["cpu"])
    assert ProphetParams(budget="measured", tree_nodes=20).tree_shape("cuda") == (TREE_DEFAULTS["cuda"][0], 20)
    assert ProphetParams.CHOICES["budget"] == ("fixed", "measured")    # the app's dropdown


def test_a_comparison_shows_the_budget_and_its_result_imports():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    pair = ModelPair(target, prophet=random_prophet(target, 0))
    target.state.forward_cost = {False: ForwardCost({1: 1.0, 9: 1.2, 65: 6.0})}
    results = run_comparison(prompt(8), pair, [("greedy", {}), ("prophet", {"budget": "measured"})],
                             max_new_tokens=12, seed=0)
    rr = results[1]
    assert rr.matches_greedy and rr.params["budget"] == "measured"
    assert rr.params["tree_nodes"] == MEASURED_NODES["cpu"]                 # the cap the run used, not 0
    assert "tree_budget" in rr.stats
    check_result(rr.to_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the device check runs it)")
def test_on_cuda_the_curve_is_timed_between_synchronisations_and_the_output_stays_greedys(monkeypatch):
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float32, device="cuda")
    pair = ModelPair(lm, prophet=random_prophet(lm, 0))
    p = prompt(9, seed=3)
    want = _greedy(pair, p, 30)
    syncs = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (syncs.append(1), real(*a, **k))[1])
    curve = calibrate(lm, 9, repeats=2)
    assert len(syncs) >= 2 * 2 * len(curve.points)          # before and after every timed forward
    monkeypatch.setattr(torch.cuda, "synchronize", real)
    for fast in (False, True):
        res = prophet(p, pair, ProphetParams(budget="measured", fast=fast), max_new_tokens=30)
        assert res.token_ids == want, fast
        measured = lm.state.forward_cost[fast]
        assert measured.max_width == 1 + MEASURED_NODES["cuda"]
        assert all(math.isfinite(ms) and ms > 0 for ms in measured.points.values())
        print(f"cuda fast={fast}: {measured.record()} kept {res.stats['tree_budget']['mean_kept_nodes']} "
              f"of {res.stats['tree_budget']['mean_offered_nodes']}")


def test_a_greedy_expansions_children_from_one_topk_are_the_row_by_row_picks():
    """``grow`` picks a greedy expansion's children with one ``topk`` over its rows (``_picks``): the same
    tokens and log-probs, in the same order (ties included), as ``_pick`` row by row: -inf entries (fewer finite
    ones than ``topk``) dropped, indices mapped through the draft vocabulary."""
    from decoding.drafting.dynamic import _pick, _picks
    gen = torch.Generator().manual_seed(5)
    for _ in range(50):
        rows = torch.randn(4, 300, generator=gen).log_softmax(-1)
        rows[1, :298] = float("-inf")                                   # two finite entries, topk 4
        rows[2, 5] = rows[2, 9] = rows[2].max() + 1.0                  # a tie at the top
        ids = torch.randperm(1000, generator=gen)[:300]
        for vocab in (None, ids):
            want = [_pick(row, 4, False, None, vocab) for row in rows]
            assert _picks(rows, 4, vocab) == want
            tied = {5, 9} if vocab is None else set(ids[[5, 9]].tolist())
            assert len(want[1][0]) == 2 and set(want[2][0][:2]) == tied
