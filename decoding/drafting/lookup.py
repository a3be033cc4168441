"""Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``): copy what followed the last n-gram.

Model-free and deterministic (q_draft is one-hot on each drafted token): the
latest earlier occurrence of the context's last ``ngram_size`` tokens (falling
back to shorter n-grams, down to ``min_ngram``) proposes the tokens that followed it.

Multi-candidate (``max_candidates`` > 1, on a target that verifies trees): when
the n-gram occurred several times, the distinct continuations of its latest
occurrences are merged by common prefix into a tree (latest first), at most
``MAX_TREE_NODES`` nodes; the target verifies all of them in one forward.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.suffix import source_event
from decoding.params import MAX_TREE_NODES, PromptLookupParams
from decoding.tracer import NULL_TRACER
from decoding.tree import TokenTree


class PromptLookupDrafter(Drafter):
    source = "prompt_lookup"

    def __init__(self, params: PromptLookupParams, *, tree: bool = False, tracer: Any = NULL_TRACER, clock: Any = None) -> None:
        super().__init__()
        self.params = params
        self.candidates = params.max_candidates if tree else 1
        self.tracer, self.clock = tracer, clock or (lambda: 0)
        self.prompt_len = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_len = len(prompt_ids)

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        context = list(context)
        starts, n = self._matches(context)
        if not starts:
            return Proposal.empty()
        # distinct continuations, latest occurrence first; each is at most k tokens
        paths: list[list[int]] = []
        origins: list[int] = []           # where each path was copied from (its first token's index)
        seen: set[tuple[int, ...]] = set()
        for start in starts:
            follow = tuple(context[start + n:start + n + k])
            if follow in seen or any(p[:len(follow)] == list(follow) for p in paths):
                continue
            seen.add(follow)
            paths.append(list(follow))
            origins.append(start + n)
            if len(paths) == self.candidates:
                break
        if len(paths) == 1:
            proposal = Proposal.chain(paths[0], origins=[self._text(origins[0] + i) for i in range(len(paths[0]))])
        else:
            proposal = self._tree(paths, origins)
        if self.tracer.enabled:
            self._trace(context, starts[0], n, len(paths[0]), len(starts), len(proposal))
        return proposal

    def _matches(self, context: list[int]) -> tuple[list[int], int]:
        """Start indices of the earlier occurrences of the longest matching n-gram (latest first), and n; none
        shorter than ``shortest_match`` counts."""
        L = len(context)
        for n in range(min(self.params.ngram_size, L - 1), self.params.shortest_match - 1, -1):
            tail = context[L - n:]
            first = tail[0]
            found = (s for s in range(L - n - 1, -1, -1) if context[s] == first and context[s:s + n] == tail)
            # every start < L - n has a non-empty continuation; a few spares for repeated continuations
            starts = list(itertools.islice(found, 1 if self.candidates == 1 else 4 * self.candidates))
            if starts:
                return starts, n
        return [], 0

    def _tree(self, paths: list[list[int]], origins: list[int]) -> Proposal:
        """Merge ``paths`` by common prefix, keeping whole paths while the tree has room."""
        kept: list[list[int]] = []
        for path in paths:
            if len(TokenTree.from_paths(kept + [path])) > MAX_TREE_NODES:
                break
            kept.append(path)
        tree = TokenTree.from_paths(kept)
        # each node's origin: the first path (in ranking order) that passes through it
        where: dict[tuple[int, ...], int] = {}
        for path, first in zip(kept, origins):
            for i in range(len(path)):
                where.setdefault(tuple(path[:i + 1]), first + i)
        prefix: list[tuple[int, ...]] = []
        for i, tok in enumerate(tree.tokens):
            p = tree.parents[i]
            prefix.append((prefix[p] if p >= 0 else ()) + (tok,))
        return Proposal(tree, None, [1.0] * len(tree), origins=[self._text(where[pre]) for pre in prefix])

    def _text(self, index: int) -> tuple[str, int, int]:
        return ("prompt", -1, index) if index < self.prompt_len else ("output", -1, index - self.prompt_len)

    def _trace(self, context: list[int], start: int, n: int, copied: int, occurrences: int, nodes: int) -> None:
        text, _, _ = self._text(start + n)
        floor = 0 if text == "prompt" else self.prompt_len
        self.tracer.emit(source_event(context, start, n, copied, floor, step=self.clock(),
                                      position=len(context) - self.prompt_len, text=text,
                                      occurrences=occurrences, nodes=nodes, score=float(copied),
                                      source=self.source))
