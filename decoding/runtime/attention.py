"""Attention beyond causal: custom 4D masks, the forward that verifies a token tree, and the probe that
a model honours them.

``attention_mask`` turns a ``[T, T]`` (or ``[T, cached + T]``) table of allowed pairs into the float
mask transformers takes (per layer type for sliding-window models). ``tree_forward`` runs
``pending + tree`` after a session's cache in one forward (``decoding.tree`` lays it out).
``check_mask_support`` probes once per model whether it honours a custom 4D mask with explicit
position ids (Marian and T5 compute their own decoder positions, for example); chains never need it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional, Sequence

import torch

from decoding.runtime.kernels import ROUNDED_INPUTS
from decoding.runtime.session import Session
from decoding.tree import TokenTree, tree_layout


def attention_mask(lm: Any, allowed: torch.Tensor, positions: torch.Tensor, cached: int,
                   key_positions: Optional[torch.Tensor] = None) -> Any:
    """The mask argument of a forward of ``T`` query positions after ``cached`` cached ones.

    ``allowed`` is ``[T, T]`` (the new block; every cached position visible) or
    ``[T, cached + T]`` (each row says which cached positions it sees too). The
    result is a float mask ``[1, 1, T, cached + T]`` (0 attend, -inf blocked), or
    a per-layer-type dict for sliding-window models, where a sliding layer also
    blocks keys ``sliding_window`` or more positions before the query. The keys'
    positions are ``0..cached-1`` then ``positions`` unless ``key_positions`` says.
    """
    t = allowed.shape[0]
    if allowed.shape[1] != cached + t:
        allowed = torch.cat([torch.ones(t, cached, dtype=torch.bool), allowed.cpu()], dim=1)
    mask = torch.zeros(1, 1, t, cached + t, dtype=lm.dtype, device=lm.device)
    mask[0, 0].masked_fill_(~allowed.to(lm.device), float("-inf"))
    kinds, window = _layer_kinds(lm.model.config)
    if "sliding_attention" not in kinds or not window:
        return mask
    key_pos = key_positions if key_positions is not None else \
        torch.cat((torch.arange(cached), positions.cpu()))
    far = positions.to(lm.device)[:, None] - key_pos.to(lm.device)[None, :] >= window              # [T, C+T]
    return {"full_attention": mask,
            "sliding_attention": mask.masked_fill(far[None, None], float("-inf"))}


def _layer_kinds(config: Any) -> tuple[set[str], Optional[int]]:
    kinds = set(getattr(config, "layer_types", None) or ())
    return kinds, getattr(config, "sliding_window", None)


def tree_forward(session: Any, pending: Sequence[int], tree: TokenTree, *, hidden: bool = False,
                 kind: str = "verify") -> torch.Tensor:
    """One forward over ``pending + tree`` after ``session``'s cache; logits ``[len(pending) + len(tree), V]``.

    A chain runs as a plain causal forward (any model); a branching tree needs a
    model that honours a custom 4D mask (:func:`check_mask_support`).
    """
    ids = session.tensor([list(pending) + list(tree.tokens)])
    if tree.is_chain:
        return session.forward(ids, hidden=hidden, kind=kind)[0]
    check_mask_support(session.lm)
    allowed, rel = tree_layout(len(pending), tree.parents)
    if session.runner is not None:      # the fast path: positions and mask made from the layout on the device
        logits = session.forward_tree(ids, tree.parents, (allowed, _offsets(len(pending), tree.parents)),
                                      hidden=hidden, kind=kind)
        if logits is not None:
            return logits[0]
    cached = session.length
    positions = rel + (cached + len(pending) - 1)                                  # [T]
    return session.forward(ids, position_ids=positions[None].to(session.lm.device),
                           attention_mask=attention_mask(session.lm, allowed, positions, cached),
                           hidden=hidden, kind=kind)[0]


@lru_cache(maxsize=1024)
def _offsets(pending: int, parents: tuple[int, ...]) -> torch.Tensor:
    """The rows' positions after the cache's write position (the first pending token's slot): ``tree_layout``'s
    positions relative to the root, moved by the pending tokens before it."""
    return tree_layout(pending, parents)[1] + (pending - 1)


def check_mask_support(lm: Any) -> None:
    """Raise ``ValueError`` unless ``lm`` honours a custom 4D mask with explicit positions.

    Runs once per model (the verdict is kept in ``lm.state``): the logits of a
    token fed after a sibling it must not see are compared with those of a plain
    forward that never saw the sibling.
    """
    verdict = lm.state.mask_support
    if verdict is None:
        verdict = _probe(lm)
        lm.state.mask_support = verdict
    if verdict == BF16_ROWS:
        raise ValueError(f"tree drafts and lookahead need every row of a masked forward to equal a plain "
                         f"forward's; {lm.name} rounds each linear layer's input "
                         f"({'to int8' if getattr(lm, 'weights', '') == 'w8a8' else 'to bfloat16'}), and its attention "
                         f"({lm.model.config._attn_implementation}) does not give a tree row the bits a plain forward "
                         f"gives it, so they would not be exact against its greedy. On it, drafts are chains; the "
                         f"float32 preset runs trees and lookahead")
    if verdict != "ok":
        raise ValueError(f"tree drafts and lookahead need a model that accepts a custom 4D attention mask "
                         f"with explicit position ids; {type(lm.model).__name__} does not ({verdict})")


def supports_trees(lm: Any) -> bool:
    try:
        check_mask_support(lm)
    except ValueError:
        return False
    return True


# The verdict for a bfloat16-weight model (models.WEIGHTS) whose tree rows are not bit-equal to a plain forward's
# (the row-exact attention, gqa_attention.rows_sdpa_forward, makes them equal; another attention would not).
BF16_ROWS = "bf16-rows"


def _probe(lm: Any) -> str:
    kinds, _ = _layer_kinds(lm.model.config)
    odd = kinds - {"full_attention", "sliding_attention"}
    if odd:
        return f"unsupported layer types {sorted(odd)}"
    vocab = lm.vocab_size
    a, b, c, d = (3 % vocab, 5 % vocab, 7 % vocab, 11 % vocab)
    try:
        fused = Session(lm)
        fused.prefill([a, b])
        cached = fused.length
        # rows: c, d (after c), b as a sibling of d (sees c only)
        allowed = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        pos = torch.tensor([0, 1, 1]) + cached
        got = fused.forward(fused.tensor([[c, d, b]]), position_ids=pos[None].to(lm.device),
                            attention_mask=attention_mask(lm, allowed, pos, cached))[0]
        plain = Session(lm)
        plain.prefill([a, b])
        ref = plain.forward(plain.tensor([[c, b]]))[0]
    except Exception as exc:  # a model that rejects the arguments outright
        return f"{type(exc).__name__}: {exc}"
    scale = float(ref.abs().max()) + 1e-6
    tol = 1e-3 if lm.dtype in (torch.float32, torch.float64) else 3e-2
    if getattr(lm, "weights", "full") in ROUNDED_INPUTS:   # rounded inputs: only bit-equal rows keep it exact
        return "ok" if torch.equal(got[[0, 2]], ref) else BF16_ROWS
    diff = float((got[[0, 2]] - ref).abs().max()) / scale
    return "ok" if diff <= tol else f"fused and separate logits differ by {diff:.3g} (relative)"
