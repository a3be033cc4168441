"""A bounded-depth suffix tree over token sequences, built online, with frequency-scored continuations.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; Snowflake ArcticInference) drafts from suffix trees:
find where the context's last tokens occurred before, and propose what followed them, scored by how
often each continuation followed. This module is that structure in pure Python (no torch).

* Node 0 is the root; every other node is a substring of at most ``max_depth`` tokens of the sequences
  added so far, with ``count`` = how many times it occurs. A child's count over the sum of its
  siblings' counts is the empirical probability of that next token.
* ``extend`` appends tokens to the newest sequence. The suffixes of that sequence that occurred before
  ("open" suffixes, at most ``max_depth``) each move one token down; cost O(open suffixes) per token.
* Path compression the lazy way: a substring seen once is a leaf pointing at its occurrence (``ref``),
  whose continuation is read from the sequence itself. A second occurrence spells it out one token
  further. So unique text costs about one node per token, however deep the tree.
* ``SEP`` separates sequences (earlier outputs); no substring crosses it.

A *state* ``(node, off)`` is a position in the tree: ``node`` plus ``off`` more tokens along the
occurrence ``ref[node]`` (``off > 0`` only below a leaf or a node at the depth cap).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Optional

SEP = -1   # between sequences; never a token


@dataclass
class Continuation:
    """Drafted tokens below a state: a chain (``parents[i] == i - 1``) or a tree (parents first).

    ``probs[i]``: the empirical probability of the path down to node ``i``; ``score`` is their sum
    (the expected number of drafted tokens the text's statistics say will be right). ``where[i]``:
    index in the tree's sequence of the token node ``i`` was copied from.
    """
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    where: list[int] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    occurrences: int = 0


class SuffixTree:
    """Every substring of up to ``max_depth`` tokens of the sequences added so far, with its count."""

    def __init__(self, max_depth: int = 32) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {max_depth}")
        self.max_depth = int(max_depth)
        self.seq: list[int] = []
        self.starts: list[int] = []          # where each sequence begins in seq
        # per node: children (token -> node; None for a leaf), count, depth, token, first and newest occurrence
        self.kids: list[Optional[dict]] = [{}]
        self.count = [0]
        self.depth = [0]
        self.token = [SEP]
        self.ref = [0]
        self.last = [0]
        self.open: list[int] = []            # explicit nodes of the newest sequence's repeated suffixes, by depth

    def __len__(self) -> int:
        """Number of nodes."""
        return len(self.count)

    # ------------------------------------------------------------------ building
    def start_sequence(self) -> None:
        """Later tokens begin a new sequence: no substring spans the boundary."""
        if self.seq:
            self.seq.append(SEP)
        self.starts.append(len(self.seq))
        self.open = []

    def extend(self, tokens: Iterable[int]) -> None:
        if not self.starts:
            self.starts.append(0)
        for t in tokens:
            self._append(int(t))

    def _new(self, token: int, depth: int, start: int) -> int:
        self.kids.append(None)
        self.count.append(1)
        self.depth.append(depth)
        self.token.append(token)
        self.ref.append(start)
        self.last.append(start)
        return len(self.count) - 1

    def _append(self, t: int) -> None:
        seq, kids, count, depth, ref, last = self.seq, self.kids, self.count, self.depth, self.ref, self.last
        n = len(seq)
        seq.append(t)
        cap = self.max_depth
        still_open = []
        for node in [0] + self.open:              # root first: depths ascending
            d = depth[node]
            if d >= cap:
                continue
            child = kids[node].get(t)
            if child is None:                     # first occurrence of this suffix + t: a leaf
                kids[node][t] = self._new(t, d + 1, n - d)
                continue
            c = count[child] = count[child] + 1
            last[child] = n - d
            if c == 2:                            # a leaf until now: spell out its occurrence one token further
                kids[child] = {}
                j = ref[child] + d + 1            # the token after that occurrence (<= n)
                if d + 1 < cap and seq[j] != SEP:
                    kids[child][seq[j]] = self._new(seq[j], d + 2, ref[child])
            still_open.append(child)
        self.open = still_open

    # ------------------------------------------------------------------ matching
    def state_depth(self, state: tuple[int, int]) -> int:
        return self.depth[state[0]] + state[1]

    def state_count(self, state: tuple[int, int]) -> int:
        return self.count[state[0]] if state[1] == 0 else 1

    def step(self, state: tuple[int, int], t: int) -> Optional[tuple[int, int]]:
        """The state after token ``t``, or None when the text never continued that way."""
        node, off = state
        kids = self.kids[node]
        if off == 0 and kids:
            child = kids.get(t)
            return None if child is None else (child, 0)
        j = self.ref[node] + self.depth[node] + off
        if j < len(self.seq) and self.seq[j] == t:
            return node, off + 1
        return None

    def advance(self, states: list[tuple[int, int]], t: int, max_depth: int) -> list[tuple[int, int]]:
        """Matching states of a context (one per repeated suffix, depths ascending) after token ``t``."""
        out = []
        for s in [(0, 0)] + states:
            nxt = self.step(s, t)
            if nxt is not None and self.state_depth(nxt) <= max_depth:
                out.append(nxt)
        return out

    # ------------------------------------------------------------------ drafting
    def _children(self, node: int, off: int, p: float, min_prob: float) -> list[tuple[float, int, int, int, int]]:
        """(prob, token, node, off, where) of each continuation of a state, most probable (then newest) first."""
        kids = self.kids[node]
        if off == 0 and kids:
            count, last, depth = self.count, self.last, self.depth
            total = sum(count[c] for c in kids.values())
            out = [(p * count[c] / total, tok, c, 0, last[c] + depth[c] - 1) for tok, c in kids.items()]
            out = [o for o in out if o[0] >= min_prob]
            out.sort(key=lambda o: (-o[0], -o[4]))
            return out
        j = self.ref[node] + self.depth[node] + off
        if j < len(self.seq) and self.seq[j] != SEP:
            return [(p, self.seq[j], node, off + 1, j)]
        return []

    def draft_path(self, state: tuple[int, int], budget: int, min_prob: float) -> Continuation:
        """The most probable continuation, one token at a time, while its probability is >= ``min_prob``."""
        out = Continuation(match_len=self.state_depth(state), occurrences=self.state_count(state))
        node, off = state
        p = 1.0
        seq = self.seq
        while len(out.tokens) < budget:
            if off or not self.kids[node]:        # one occurrence (or the depth cap): copy it
                j = self.ref[node] + self.depth[node] + off
                end = min(len(seq), j + budget - len(out.tokens))
                for i in range(j, end):
                    if seq[i] == SEP:
                        break
                    out.tokens.append(seq[i])
                    out.where.append(i)
                break
            kids = self._children(node, 0, p, min_prob)
            if not kids:
                break
            p, tok, node, off, where = kids[0]
            out.tokens.append(tok)
            out.where.append(where)
            out.probs.append(p)
        out.probs += [p] * (len(out.tokens) - len(out.probs))
        out.parents = list(range(-1, len(out.tokens) - 1))
        out.score = sum(out.probs)
        return out

    def draft_tree(self, state: tuple[int, int], budget: int, min_prob: float, max_nodes: int) -> Continuation:
        """The ``max_nodes`` most probable continuation nodes no deeper than ``budget`` (best first)."""
        out = Continuation(match_len=self.state_depth(state), occurrences=self.state_count(state))
        heap: list = []
        tick = 0
        for prob, tok, node, off, where in self._children(state[0], state[1], 1.0, min_prob):
            heap.append((-prob, tick, tok, node, off, where, -1, 1))
            tick += 1
        heapq.heapify(heap)
        while heap and len(out.tokens) < max_nodes:
            neg, _, tok, node, off, where, parent, d = heapq.heappop(heap)
            out.tokens.append(tok)
            out.parents.append(parent)
            out.probs.append(-neg)
            out.where.append(where)
            if d < budget:
                me = len(out.tokens) - 1
                for prob, tok2, node2, off2, where2 in self._children(node, off, -neg, min_prob):
                    heapq.heappush(heap, (-prob, tick, tok2, node2, off2, where2, me, d + 1))
                    tick += 1
        out.score = sum(out.probs)
        return out
