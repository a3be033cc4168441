"""How many of a drafted tree's nodes to verify: the most expected tokens per unit of measured time.

Sequoia (Chen et al. 2024) sizes its trees for the hardware: the tree worth
verifying is the one that maximizes expected accepted tokens per unit of time,
with the verify forward's cost measured on the machine. Here the tree is grown
first (EAGLE-2 style, ``dynamic.grow``, with the most nodes allowed), its nodes
ranked by path probability (the product of the drafter's confidences along the
path: the chance its whole path is the target's), and then this rule keeps the
prefix of that ranking, of ``n`` nodes, that maximizes

    value(n) = (1 + P_1 + ... + P_n) / (c(1 + n) + d)

``P_i``: the path probability of the ``i``-th ranked node, so the numerator is
the expected tokens a step commits (the accepted nodes plus the target's own
correction or bonus token); ``c``: the target's verify forward over the root and
``n`` nodes, in ms (``runtime/forward_cost.py``); ``d``: this step's drafting
time, in ms. Where a child is never more probable than its parent (drafter
log-probabilities are <= 0), the best ``n``-node subtree of the grown tree is
the top ``n`` of that ranking, so the best prefix is the best subtree.

``rank_nodes`` gives the ranking as a priority-first walk from the root: a node
becomes eligible once its parent is ranked, so every prefix is a tree (closed
under ancestors, and under earlier siblings when siblings come in draw order).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

Cost = Callable[[int], float]          # c(T): ms for a verify forward over T positions


@dataclass(frozen=True)
class Budget:
    """The rule's choice for one tree."""
    nodes: int               # how many ranked nodes to verify
    offered: int             # how many were ranked
    expected: float          # 1 + the kept nodes' path probabilities: tokens the step is expected to commit
    ms: float                # c(1 + nodes) + d
    value: float             # expected / ms
    full_value: float        # the same for every offered node
    one_ms: float            # c(1): a step without a draft (as greedy)

    @property
    def gain(self) -> float:
        """How much more expected tokens per ms the choice gives than verifying every offered node."""
        return self.value / self.full_value if self.full_value > 0 else 1.0

    @property
    def predicted_speedup(self) -> float:
        """Expected tokens per c(1): the step's predicted speed against one token per one-position forward."""
        return self.value * self.one_ms


def choose_budget(path_probs: Sequence[float], cost: Cost, draft_ms: float = 0.0) -> Budget:
    """The prefix of ``path_probs`` (ranked nodes' path probabilities) worth verifying (see the module docstring).

    Ties go to the smaller tree. ``cost`` must give positive ms; ``draft_ms`` >= 0.
    """
    draft_ms = max(0.0, float(draft_ms))
    one = float(cost(1))
    best_n, best_expected, best_ms = 0, 1.0, one + draft_ms
    expected, ms = 1.0, best_ms
    for n, p in enumerate(path_probs, 1):
        expected += min(1.0, max(0.0, float(p)))
        ms = float(cost(1 + n)) + draft_ms
        if ms <= 0:
            raise ValueError(f"the forward-cost curve gave {ms!r} ms for {1 + n} positions; it must be positive")
        if expected * best_ms > best_expected * ms:          # expected / ms > best, without dividing
            best_n, best_expected, best_ms = n, expected, ms
    return Budget(best_n, len(path_probs), best_expected, best_ms, best_expected / best_ms, expected / ms, one)


def rank_nodes(scores: Sequence[float], parents: Sequence[int]) -> list[int]:
    """Every node, best ``scores`` first (ties: the earlier node), each after its parent (-1: the root).

    ``parents[i] < i``. Where scores never rise from a parent to its children, this is the plain ranking
    by score; otherwise a node waits for its parent, so every prefix of the result is ancestor-closed.
    """
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    heap = [(-scores[i], i) for i in kids.get(-1, [])]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for c in kids.get(i, []):
            heapq.heappush(heap, (-scores[c], c))
    return order
