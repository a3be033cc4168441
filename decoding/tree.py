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
from typing import Iterable, Optional, Sequence

import torch

from decoding.treeshape import depth_first, merge_paths, reorder


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


# --------------------------------------------------------------------------- mask support


# --------------------------------------------------------------------------- KV compaction


