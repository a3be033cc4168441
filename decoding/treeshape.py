"""The shape of a token tree in pure Python (no torch): what ``tree.TokenTree`` and the views share.

A tree is ``(tokens, parents)``: node ``i`` holds ``tokens[i]`` below ``parents[i]`` (-1 = the root,
the last committed token), parents listed before their children.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def merge_paths(paths: Iterable[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Token paths below the root merged by common prefix, nodes in first-seen order."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}        # (parent, token) -> node
    for path in paths:
        parent = -1
        for tok in path:
            node = index.get((parent, int(tok)))
            if node is None:
                node = index[(parent, int(tok))] = len(tokens)
                tokens.append(int(tok))
                parents.append(parent)
            parent = node
    return tokens, parents


def depth_first(parents: Sequence[int]) -> list[int]:
    """The nodes in depth-first order, siblings in their listed order."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    order: list[int] = []
    stack = list(reversed(kids.get(-1, [])))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(kids.get(node, [])))
    return order


def reorder(tokens: Sequence[int], parents: Sequence[int], order: Sequence[int]) -> tuple[list[int], list[int]]:
    """The same tree with its nodes listed in ``order`` (parents still before children)."""
    new = {old: i for i, old in enumerate(order)}
    return [tokens[o] for o in order], [-1 if parents[o] < 0 else new[parents[o]] for o in order]
