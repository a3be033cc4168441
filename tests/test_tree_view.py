"""The draft-tree view: which draft a replay step shows, node fates, the mask picture, escaping, old chains."""

from __future__ import annotations

import torch
from test_prophet import random_prophet

from decoding.harness.runner import run_comparison
from decoding.runtime.pair import ModelPair
from decoding.tree import tree_layout
from visualize.trees import draft_steps, has_trees, mask_matrix, tree_at, tree_figure

from tiny_models import prompt, tiny_causal


def _tree_result():
    return {"strategy": "prophet", "vocab": {"5": "<img src=x onerror=alert(1)>", "6": " b", "7": "c", "8": "d",
                                             "9": "e"},
            "events": [
                {"type": "DraftTree", "step": 2, "position": 1, "tokens": [5, 6, 7, 8], "parents": [-1, 0, -1, 1],
                 "q": [0.5, 0.4, 0.3, 0.2], "accepted": [0, 1], "next_token": 9, "mask_size": 5,
                 "source": "prophet"},
                {"type": "DraftTree", "step": 3, "position": 4, "tokens": [7], "parents": [-1],
                 "q": [0.9], "accepted": [], "next_token": 6, "mask_size": 2, "source": "prophet"}]}


def test_the_view_follows_the_replay_clock_and_marks_fates():
    r = _tree_result()
    assert draft_steps(r) == [2, 3] and has_trees(r)
    assert tree_at(r, 1) is None
    t = tree_at(r, 2)
    assert t["accepted"] == [0, 1] and t["next_token"] == 9 and t["kind"] == "tree"
    assert tree_at(r, 99)["step"] == 3
    fig = tree_figure(r, 2)
    fates = {tr.name: [int(c[0]) for c in tr.customdata] for tr in fig.data
             if tr.name in ("accepted", "rejected", "not reached")}
    assert fates["accepted"] == [0, 1]
    assert fates["rejected"] == [3]            # the child of the last accepted node, tried and rejected
    assert fates["not reached"] == [2]
    assert any(tr.name == "target's correction" for tr in fig.data)


def test_token_text_is_escaped():
    fig = tree_figure(_tree_result(), 2)
    text = " ".join(" ".join(tr.text) for tr in fig.data if getattr(tr, "text", None) is not None)
    assert "<img" not in text and "&lt;img" in text
    heat = next(tr for tr in fig.data if tr.type == "heatmap")
    assert not any("<img" in str(x) for x in heat.x)


def test_mask_matrix_agrees_with_the_decoding_layout():
    parents = [-1, 0, 0, -1, 3, 1, 5]
    m = mask_matrix(parents)
    allowed, _ = tree_layout(1, tuple(parents))
    assert m == allowed.int().tolist()


def test_chains_of_old_traces_show_as_trees():
    r = {"strategy": "speculative", "vocab": {},
         "events": [{"type": "DraftProposed", "step": 2, "position": 1, "tokens": [4, 5, 6], "q": [1, 1, 1],
                     "source": "assistant"},
                    {"type": "TokenVerified", "step": 2, "position": 1, "token": 4, "accepted": True,
                     "p_target": 0.9, "q_draft": 1.0, "u": None},
                    {"type": "TokenVerified", "step": 2, "position": 2, "token": 5, "accepted": False,
                     "p_target": 0.1, "q_draft": 1.0, "u": None},
                    {"type": "CorrectionToken", "step": 2, "position": 2, "token": 7, "kind": "correction",
                     "p_target": 0.5}]}
    t = tree_at(r, 2)
    assert t["kind"] == "chain" and t["parents"] == [-1, 0, 1] and t["accepted"] == [0] and t["next_token"] == 7
    assert not has_trees(r) and tree_figure(r, 2).data


def test_a_real_prophet_tree_run_is_drawn_at_every_step():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=torch.float64)
    pair = ModelPair(lm, prophet=random_prophet(lm, 1))
    [ref, res] = run_comparison(prompt(6, 1), pair, [("prophet", {"tree_topk": 3, "tree_nodes": 9})],
                                max_new_tokens=16, warmup=False)
    doc = res.to_dict()
    steps = draft_steps(doc)
    assert has_trees(doc) and steps
    for s in steps:
        t = tree_at(doc, s)
        assert t["step"] == s and len(t["tokens"]) <= 9
        assert t["accepted"] == sorted(t["accepted"])
        tree_figure(doc, s)
