"""The token tree module: structure, the tree attention layout, KV compaction, tree verification (greedy and sampling)."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_speculative import _chi_square, _passes

from decoding import verify as verify_mod
from decoding.runtime.attention import check_mask_support, tree_forward
from decoding.runtime.session import Session
from decoding.tree import TokenTree, tree_layout
from decoding.verify import verify_tree_greedy, verify_tree_sampling

from tiny_models import ARCHS, prompt, tiny_causal, tiny_marian

F64 = torch.float64


# --------------------------------------------------------------------------- structure

def test_structure_paths_and_validation():
    tree = TokenTree.from_paths([(5, 6, 7), (5, 6, 8), (9, 1), (5, 2)])
    assert tree.tokens[:3] == (5, 6, 7)                    # the first path stays contiguous
    assert len(tree) == 7 and tree.depth == 3
    assert [tree.tokens[c] for c in tree.children(-1)] == [5, 9]
    six = tree.child_with(tree.child_with(-1, 5), 6)
    assert [tree.tokens[c] for c in tree.children(six)] == [7, 8]
    assert [tree.tokens[n] for n in tree.path(tree.tokens.index(8))] == [5, 6, 8]
    # walk: the accepted path of committed tokens, down the branch they spell, up to the first miss
    assert tree.walk([5, 6, 8, 3]) == tree.path(tree.tokens.index(8))
    assert [tree.tokens[n] for n in tree.walk([5, 2, 7])] == [5, 2] and tree.walk([9, 1]) == tree.path(tree.walk([9, 1])[-1])
    assert tree.walk([6, 5]) == [] and tree.walk([]) == []
    assert TokenTree.chain([4, 4, 4]).is_chain and not tree.is_chain
    short, kept = tree.truncated(2)
    assert short.depth == 2 and len(short) == 5 and [tree.tokens[k] for k in kept] == list(short.tokens)
    with pytest.raises(ValueError, match="parent"):
        TokenTree((1, 2), (-1, 5))
    with pytest.raises(ValueError, match="without its parent"):
        tree.subtree([1])


def test_layout_rows_see_exactly_their_ancestors():
    parents = (-1, 0, 0, -1, 3, 1)
    allowed, rel = tree_layout(2, parents)
    tree = TokenTree((10, 11, 12, 13, 14, 15), parents)
    for i in range(len(parents)):
        seen = {c - 2 for c in range(2, 2 + len(parents)) if allowed[2 + i, c]}
        assert seen == set(tree.path(i)), i
        assert bool(allowed[2 + i, :2].all()) and int(rel[2 + i]) == tree.depths[i]
    assert allowed[:2, :2].tolist() == [[True, False], [True, True]] and rel[:2].tolist() == [-1, 0]


# --------------------------------------------------------------------------- the tree forward

TREE = TokenTree.from_paths([(20, 21, 22), (20, 23), (24, 25), (20, 21, 26)])


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_separate_chain_forwards(arch):
    """Row 1 + i of one tree forward equals a plain causal forward over context + path(i)."""
    lm = tiny_causal(arch, seed=3, dtype=F64)
    context = prompt(9, 5)
    fused = Session(lm)
    fused.prefill(context[:-1])
    got = tree_forward(fused, context[-1:], TREE)                               # [1 + n, V]
    for node in [-1] + list(range(len(TREE))):
        chain = [] if node < 0 else [TREE.tokens[k] for k in TREE.path(node)]
        plain = Session(lm)
        plain.prefill(context[:-1])
        ref = plain.forward(plain.tensor([context[-1:] + chain]))[0, -1]
        torch.testing.assert_close(got[1 + node], ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fast", [False, True])
def test_keep_compacts_the_cache_onto_the_accepted_path(arch, fast):
    """After a tree forward, keeping the root and one branch leaves the cache a plain forward would have built."""
    lm = tiny_causal(arch, seed=4, dtype=F64)
    if fast and not __import__("decoding.runtime.fastpath", fromlist=["x"]).supported(lm):
        pytest.skip("no fast path for this model")
    context = prompt(7, 6)
    branch = TREE.path(TREE.tokens.index(26))                                 # 20 -> 21 -> 26: not contiguous
    assert branch != list(range(len(branch)))
    s = Session(lm, static_len=64 if fast else None)
    s.prefill(context[:-1])
    base = s.length
    tree_forward(s, context[-1:], TREE)
    s.keep(base, [0] + [1 + k for k in branch])
    assert s.length == base + 1 + len(branch)
    after = s.forward(s.tensor([[7, 8]]))[0]
    ref_s = Session(lm)
    ref_s.prefill(context + [TREE.tokens[k] for k in branch] + [7, 8])
    ref = Session(lm)
    ref.prefill(context + [TREE.tokens[k] for k in branch])
    want = ref.forward(ref.tensor([[7, 8]]))[0]
    torch.testing.assert_close(after, want, rtol=1e-8, atol=1e-8)


def test_chains_need_no_mask_support_but_trees_do():
    lm = tiny_marian(seed=0)
    s = Session(lm)
    s.prefill(prompt(5, 1) + [2])
    assert tree_forward(s, [3], TokenTree.chain([4, 5])).shape[0] == 3
    with pytest.raises(ValueError, match="custom 4D attention mask"):
        check_mask_support(lm)
    with pytest.raises(ValueError, match="custom 4D attention mask"):
        tree_forward(s, [3], TREE)


# --------------------------------------------------------------------------- greedy verification

def test_greedy_tree_verification_walks_the_argmax_path():
    tree = TokenTree.from_paths([(5, 6, 7), (5, 8), (9,)])
    V = 12
    logits = torch.zeros(1 + len(tree), V)

    def argmax(row, tok):
        logits[row] = 0.0
        logits[row, tok] = 3.0
    five = tree.child_with(-1, 5)
    eight = tree.child_with(five, 8)
    argmax(0, 5)
    argmax(1 + five, 8)
    argmax(1 + eight, 11)
    v = verify_tree_greedy(logits, tree)
    assert v.path == [five, eight] and v.next_token == 11 and v.tried == [(five, True), (eight, True)]
    argmax(0, 4)                                     # no child matches: the correction is the argmax
    v = verify_tree_greedy(logits, tree)
    assert v.path == [] and v.next_token == 4 and v.tried == [(five, False)]


# --------------------------------------------------------------------------- sampling verification

V, N_OUT = 4, 3


def _draws(q_row, k, gen, mode):
    """k sibling tokens from q_row: without replacement (sequential), i.i.d., or the k most probable."""
    if mode == "deterministic":
        return torch.topk(q_row, k).indices.tolist()
    if mode == "iid":
        return [int(torch.multinomial(q_row, 1, generator=gen)) for _ in range(k)]
    out, q = [], q_row.clone()
    for _ in range(k):
        x = int(torch.multinomial(q / q.sum(), 1, generator=gen))
        out.append(x)
        q[x] = 0.0
    return out


def _simulate_tree(p, q, k, depth, samples, seed, mode):
    """Outputs of N_OUT tokens from a loop of tree drafts + verify_tree_sampling (history-free toy rows)."""
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    for _ in range(samples):
        out: list[int] = []
        while len(out) < N_OUT:
            i0 = len(out)
            d = min(depth, N_OUT - i0)
            tokens, parents, frontier = [], [], [-1]
            for level in range(d):               # every node of a level gets k children
                nxt = []
                for parent in frontier:
                    for x in _draws(q[i0 + level], k, gen, mode):
                        tokens.append(x)
                        parents.append(parent)
                        nxt.append(len(tokens) - 1)
                frontier = nxt
            tree = TokenTree(tuple(tokens), tuple(parents))   # i.i.d. siblings may repeat a token: kept apart
            depths = tree.depths
            p_rows = torch.stack([p[i0]] + [p[i0 + depths[n]] for n in range(len(tree))])
            q_rows = None if mode == "deterministic" else torch.stack([q[i0 + depths[n] - 1] for n in range(len(tree))])
            v = verify_tree_sampling(p_rows, tree, q_rows, gen, replacement=(mode == "iid"))
            out += [tree.tokens[n] for n in v.path] + [v.next_token]
        key = tuple(out[:N_OUT])
        counts[key] = counts.get(key, 0) + 1
    return counts


# Draws of the toy's checks (history-free rows: the simulation is all verify_tree_sampling, no model). At 3,000
# the 64 cells pool to 42 degrees of freedom, where the bound's false-positive rate is 4e-5 (3e-5 at 12,000's
# 52); the three correct modes score 34, 53 and 34 against the bound's 88, and the two planted bugs 1,393 and
# 2,778 (a noncentrality ~15x the bound: their power is 1 to double precision).
SIM_DRAWS = 3000


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(N_OUT + 1, V) * 1.5, -1)
    q = torch.softmax(torch.randn(N_OUT, V) * 3.0, -1)      # a poor drafter
    exact = {seq: float(p[0, seq[0]] * p[1, seq[1]] * p[2, seq[2]])
             for seq in itertools.product(range(V), repeat=N_OUT)}
    return p, q, exact


@pytest.mark.parametrize("mode", ["without_replacement", "iid", "deterministic"])
def test_tree_speculative_sampling_keeps_the_target_distribution(toy, mode):
    p, q, exact = toy
    n = SIM_DRAWS
    stat, dof = _chi_square(_simulate_tree(p, q, 2, 2, n, 1, mode), exact, n)
    assert _passes(stat, dof), (mode, stat, dof)


def test_breaking_the_recursive_residual_is_caught(toy, monkeypatch):
    """Negative control: a sibling tried against the unchanged target (no residual) biases the output."""
    p, q, exact = toy
    n = SIM_DRAWS
    monkeypatch.setattr(verify_mod, "residual_distribution", lambda p_row, q_row, token: p_row)
    stat, dof = _chi_square(_simulate_tree(p, q, 2, 2, n, 1, "without_replacement"), exact, n)
    assert not _passes(stat, dof), (stat, dof)


def test_treating_draws_without_replacement_as_independent_is_caught(toy):
    """Negative control: ignoring that later siblings were drawn from q minus the earlier ones biases the output."""
    p, q, exact = toy
    n = SIM_DRAWS
    gen_counts: dict[tuple, int] = {}
    real = verify_mod.verify_tree_sampling

    def wrong(p_rows, tree, q_rows, rng, replacement=False):
        return real(p_rows, tree, q_rows, rng, replacement=True)
    try:
        verify_mod.verify_tree_sampling = wrong
        globals()["verify_tree_sampling"] = wrong
        gen_counts = _simulate_tree(p, q, 3, 1, n, 2, "without_replacement")
    finally:
        globals()["verify_tree_sampling"] = real
        verify_mod.verify_tree_sampling = real
    stat, dof = _chi_square(gen_counts, exact, n)
    assert not _passes(stat, dof), (stat, dof)
