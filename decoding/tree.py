"""Token trees: drafts that one target forward verifies, and the attention layout that verifies them.

A tree hangs below a *root*: the newest committed token, fed first in the verify
forward. ``parents[i]`` is node ``i``'s parent (``-1`` = the root) and nodes are
listed parents first. A node at depth ``d`` proposes the token ``d`` positions
after the root. A chain is the tree whose parents are ``i - 1``.

The layout of a forward over ``pending + nodes`` (``pending``: committed tokens
not yet in the KV cache, the last of which is the root) lets every pending token
attend causally, and every node attend to the whole cache, every pending token,
its ancestors and itself; a node's position is the root's position plus its
depth. So row ``len(pending) + i`` computes exactly what a plain causal forward
over ``context + path(i)`` computes at its last position (a test checks it).
Callers append their own rows after the tree (lookahead's Jacobi window).

After verification, ``lm.Session.keep`` compacts the KV cache onto the accepted
path (Medusa and EAGLE move the accepted rows the same way), so the next
forward continues from the committed tokens only.

``check_mask_support`` probes once per model whether it honours a custom 4D
float mask with explicit position ids (Marian and T5 compute their own decoder
positions, for example); chains never need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Optional, Sequence

import torch

from .treeshape import depth_first, merge_paths, reorder


@dataclass(frozen=True)
class TokenTree:
    """Nodes (tokens) with parent links; parents before children."""
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    _kids: dict = field(init=False, repr=False, compare=False)
    _depths: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree needs one parent per token ({len(self.tokens)} tokens, "
                             f"{len(self.parents)} parents)")
        kids: dict[int, list[int]] = {-1: []}
        depths: list[int] = []
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i}: parent {p} must be -1 or an earlier node")
            kids.setdefault(p, []).append(i)
            kids[i] = []
            depths.append(1 if p < 0 else depths[p] + 1)
        object.__setattr__(self, "_kids", kids)
        object.__setattr__(self, "_depths", tuple(depths))

    # ------------------------------------------------------------------ building
    @classmethod
    def chain(cls, tokens: Iterable[int]) -> "TokenTree":
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, tuple(range(-1, len(tokens) - 1)))

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> "TokenTree":
        """Merge token paths below the root by common prefix, depth first.

        The first path occupies nodes ``0..len-1``; later paths keep their order
        among siblings (the order the drafter ranked them in).
        """
        tokens, parents = merge_paths(paths)
        built = cls(tuple(tokens), tuple(parents))
        return built.reordered(built.depth_first())

    def reordered(self, order: Sequence[int]) -> "TokenTree":
        """The same tree with nodes listed in ``order`` (which must list parents first)."""
        tokens, parents = reorder(self.tokens, self.parents, order)
        return TokenTree(tuple(tokens), tuple(parents))

    def depth_first(self) -> list[int]:
        return depth_first(self.parents)

    def subtree(self, keep: Iterable[int]) -> tuple["TokenTree", list[int]]:
        """The nodes in ``keep`` (closed under ancestors) in their original order, and their old indices."""
        kept = sorted(set(keep))
        new = {old: i for i, old in enumerate(kept)}
        for old in kept:
            if self.parents[old] >= 0 and self.parents[old] not in new:
                raise ValueError(f"node {old} is kept without its parent {self.parents[old]}")
        tree = TokenTree(tuple(self.tokens[o] for o in kept),
                         tuple(-1 if self.parents[o] < 0 else new[self.parents[o]] for o in kept))
        return tree, kept

    def truncated(self, max_depth: int) -> tuple["TokenTree", list[int]]:
        """Nodes no deeper than ``max_depth``."""
        return self.subtree(i for i, d in enumerate(self._depths) if d <= max_depth)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        return self._depths

    @property
    def depth(self) -> int:
        return max(self._depths, default=0)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1: the root) in sibling order."""
        return self._kids[node]

    def child_with(self, node: int, token: int) -> Optional[int]:
        for c in self._kids[node]:
            if self.tokens[c] == token:
                return c
        return None

    def walk(self, tokens: Sequence[int]) -> list[int]:
        """The nodes from depth 1 that spell the longest prefix of ``tokens`` (an accepted path)."""
        out, node = [], -1
        for t in tokens:
            child = self.child_with(node, int(t))
            if child is None:
                break
            out.append(child)
            node = child
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from depth 1 down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


# --------------------------------------------------------------------------- layout and mask

@lru_cache(maxsize=1024)
def tree_layout(pending: int, parents: tuple[int, ...], extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention pattern of a forward over ``pending`` committed tokens, then the tree's nodes.

    Returns ``allowed [T, T]`` (bool, row = query may attend column = key) with
    ``T = pending + len(parents) + extra`` -- the ``extra`` rows are left for the
    caller to fill -- and positions ``rel [T]`` relative to the root (the last
    pending token) for the pending and tree rows (zeros for the extra rows).
    Every row also sees the whole cache, which is not part of this block.
    """
    n = len(parents)
    total = pending + n + extra
    allowed = torch.zeros(total, total, dtype=torch.bool)
    rel = torch.zeros(total, dtype=torch.long)
    # 1. pending tokens: plain causal
    allowed[:pending, :pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
    rel[:pending] = torch.arange(pending) - pending + 1
    # 2. nodes: every pending token, the ancestors and themselves
    depth: list[int] = []
    for i, p in enumerate(parents):
        r = pending + i
        allowed[r, :pending] = True
        if p >= 0:
            allowed[r] |= allowed[pending + p]
        allowed[r, r] = True
        depth.append(1 if p < 0 else depth[p] + 1)
        rel[r] = depth[i]
    return allowed, rel


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
    cached = session.length
    positions = rel + (cached + len(pending) - 1)                                  # [T]
    return session.forward(ids, position_ids=positions[None].to(session.lm.device),
                           attention_mask=attention_mask(session.lm, allowed, positions, cached),
                           hidden=hidden, kind=kind)[0]


# --------------------------------------------------------------------------- mask support

def check_mask_support(lm: Any) -> None:
    """Raise ``ValueError`` unless ``lm`` honours a custom 4D mask with explicit positions.

    Runs once per model (the verdict is kept in ``lm.extras``): the logits of a
    token fed after a sibling it must not see are compared with those of a plain
    forward that never saw the sibling.
    """
    verdict = lm.extras.get("lookahead_mask")
    if verdict is None:
        verdict = _probe(lm)
        lm.extras["lookahead_mask"] = verdict
    if verdict != "ok":
        raise ValueError(f"tree drafts and lookahead need a model that accepts a custom 4D attention mask "
                         f"with explicit position ids; {type(lm.model).__name__} does not ({verdict})")


def supports_trees(lm: Any) -> bool:
    try:
        check_mask_support(lm)
    except ValueError:
        return False
    return True


def _probe(lm: Any) -> str:
    from .lm import Session
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
    diff = float((got[[0, 2]] - ref).abs().max()) / scale
    return "ok" if diff <= tol else f"fused and separate logits differ by {diff:.3g} (relative)"


# --------------------------------------------------------------------------- KV compaction

def _self_attention_layers(cache: Any) -> list:
    inner = getattr(cache, "self_attention_cache", cache)
    return list(inner.layers)


def compact_cache(cache: Any, base: int, rows: Sequence[int]) -> None:
    """Keep positions ``base + r`` (``r`` in ``rows``, ascending) at ``base, base + 1, ...``; drop the rest.

    Works on transformers' dynamic caches (the layers keep every position since
    the last crop) and on static caches (``fastpath.StaticRunner`` does its own).
    """
    from .lm import crop_cache
    rows = list(rows)
    if rows != sorted(set(rows)):
        raise ValueError("rows to keep must be ascending and distinct")
    m = len(rows)
    if rows != list(range(m)):
        _move_rows(cache, base, rows)
    crop_cache(cache, base + m)


@torch.inference_mode()
def _move_rows(cache: Any, base: int, rows: list[int]) -> None:
    m = len(rows)
    for layer in _self_attention_layers(cache):
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        offset = layer.get_seq_length() - layer.keys.shape[-2]     # positions no longer stored
        if base - offset < 0:
            raise RuntimeError("cannot compact: the cache no longer holds the positions before the tree")
        src = torch.tensor([base + r - offset for r in rows], device=layer.keys.device)
        dst = slice(base - offset, base - offset + m)
        layer.keys[..., dst, :] = layer.keys.index_select(-2, src)
        layer.values[..., dst, :] = layer.values.index_select(-2, src)
