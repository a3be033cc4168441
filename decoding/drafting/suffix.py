"""Suffix decoding (SuffixDecoding, arXiv 2411.04975; vLLM ``method: "suffix"``): model-free, frequency-scored drafts.

Two suffix trees (``suffix_tree.SuffixTree``) are searched at every step:

* the *local* tree over this generation's prompt and output, built once from the prompt in ``begin``
  and extended as tokens commit (``feedback``), never rebuilt;
* the *history* (:class:`SuffixHistory`): earlier outputs, bounded, passed in by the caller through
  ``RunContext.history`` (the app keeps one per browser session, the CLI and the benchmarks one per process).

For each distinct way the context's last tokens occurred before (a match of ``m`` tokens), the drafter
may propose up to ``min(k, m * spec_factor + spec_offset)`` tokens: the most frequent continuation (a
chain) or a tree of the most probable continuations, stopping below ``min_token_prob``. The draft with
the highest score (the summed empirical probabilities of its tokens) wins. Drafts are deterministic
(q is one-hot), so greedy verification is exact and speculative sampling keeps the target distribution.

*Following edits* (``edit_tokens``, our addition; not in the paper). A match-based drafter is blind right
after an edit: when the target writes ``total`` where the prompt had ``x``, the context's end matches
nothing useful, although the text after ``x`` is what comes next. So when the target cuts a copy short,
the drafter keeps two *cursors* into the copied text: just after the rejected token (the target replaced
it) and at it (the target inserted text before it). For the next few steps their continuations join the
draft after the best match, match or not, and a cursor that the target follows moves along with it.
``benchmarks/suffix_bound.py`` measures how far this can go: with a perfect chooser, matches plus these
cursors ("edit bound") against matches alone ("match bound").
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import Any, Optional, Sequence

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.suffix_tree import SEP, Continuation, SuffixTree
from decoding.events import DraftSource
from decoding.params import SuffixParams
from decoding.tracer import NULL_TRACER
from decoding.tree import TokenTree

SOURCE_WINDOW = 6          # tokens shown before a match in the draft view (DraftSource.tokens)
EDIT_CURSORS = 4           # cursors kept (two per cut-short copy: the newest two copies)
EDIT_PATIENCE = 4          # steps a cursor may go unfollowed before it is dropped
EDIT_START = 4             # tokens drafted at a cursor at first; doubles when the target follows one, halves when not


class SuffixHistory:
    """Earlier outputs a suffix drafter may copy from: a suffix tree over at most ``max_tokens`` tokens.

    One instance per scope (a browser session, a CLI or benchmark process); never shared across
    visitors. ``add`` appends one output; when the total would pass ``max_tokens`` the oldest outputs
    are dropped and the tree is rebuilt from the rest (once per eviction, between generations).
    ``version`` changes on every change, so a drafter that walked the tree knows to walk it again.
    """

    def __init__(self, max_tokens: int = 16384, max_depth: int = 32) -> None:
        if not 1 <= int(max_tokens) <= 1 << 20:
            raise ValueError(f"max_tokens must be in [1, {1 << 20}], got {max_tokens!r}")
        if not 2 <= int(max_depth) <= 256:
            raise ValueError(f"max_depth must be in [2, 256], got {max_depth!r}")
        self.max_tokens, self.max_depth = int(max_tokens), int(max_depth)
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        """Forget every earlier output."""
        with self.lock:
            self.items: list[list[int]] = []
            self.tree = SuffixTree(self.max_depth)
            self.version = getattr(self, "version", 0) + 1

    def __len__(self) -> int:
        return len(self.items)

    @property
    def tokens(self) -> int:
        return sum(len(i) for i in self.items)

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one output (its last ``max_tokens`` tokens at most)."""
        tokens = [int(t) for t in tokens][-self.max_tokens:]
        if not tokens:
            return
        with self.lock:
            self.items.append(tokens)
            if self.tokens > self.max_tokens:
                while self.tokens > self.max_tokens:
                    self.items.pop(0)
                self.tree = SuffixTree(self.max_depth)
                for item in self.items:
                    self.tree.start_sequence()
                    self.tree.extend(item)
            else:
                self.tree.start_sequence()
                self.tree.extend(tokens)
            self.version += 1

    def locate(self, index: int) -> tuple[int, int]:
        """(item, offset in it) of index ``index`` of the tree's sequence."""
        item = bisect.bisect_right(self.tree.starts, index) - 1
        return item, index - self.tree.starts[item]


class SuffixDrafter(Drafter):
    source = "suffix"
    accepted_source = "suffix"

    def __init__(self, params: SuffixParams, *, history: Optional[SuffixHistory] = None, tree: bool = False,
                 tracer: Any = NULL_TRACER, clock: Any = None) -> None:
        super().__init__()
        self.params, self.tree_mode = params, tree
        self.history = history if params.history else None
        self.tracer, self.clock = tracer, clock or (lambda: 0)
        self.local = SuffixTree(params.max_depth)
        self.prompt_len = 0
        self._hist_states: list[tuple[int, int]] = []
        self._hist_version = -1
        self.accepted_from = {"prompt": 0, "output": 0, "history": 0}
        # following edits: cursors (where, index of the next source token, steps unfollowed), and the raw
        # (where, index) of each node of the last proposal
        self._cursors: list[tuple[str, int, int]] = []
        self._last: tuple[Optional[Proposal], list[tuple[str, int]]] = (None, [])
        # how many tokens a cursor drafts now (adapted per generation), and whether the last draft held any
        self._edit_len, self._edit_offered = min(EDIT_START, params.edit_tokens), False

    # ------------------------------------------------------------------ the loop's calls
    def stats(self) -> dict:
        """Where the accepted tokens were copied from, and whether it drafted trees."""
        return {"accepted_from": dict(self.accepted_from), "tree": self.tree_mode}

    def finish(self, output: Sequence[int]) -> None:
        """The run's output joins the history it drafted from (the next run can copy it)."""
        if self.history is not None:
            self.history.add(list(output))

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.local = SuffixTree(self.params.max_depth)
        self.local.extend(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self._hist_version = -1          # walk the history over the new context at the first draft
        self._cursors, self._last = [], (None, [])
        self._edit_len, self._edit_offered = min(EDIT_START, self.params.edit_tokens), False

    def feedback(self, proposal: Proposal, accepted: Sequence[int]) -> None:
        path = proposal.tree.walk(accepted)        # the drafted nodes the step committed
        self._count_accepted(proposal, path)
        if self.params.edit_tokens:
            self._follow_edits(proposal, accepted, path[:len(accepted) - 1])
        self._extend(accepted)

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        # 1. catch up with tokens committed without feedback (the prefill's token)
        if len(context) > len(self.local.seq):
            self._extend(context[len(self.local.seq):])
        # 2. drafts from every distinct match in the prompt and output so far, and in the history
        cands = [(d, "local") for d in self._drafts(self.local, [(n, 0) for n in self.local.open], k)]
        hist = self.history
        with hist.lock if hist is not None else contextlib.nullcontext():
            if hist is not None:
                if self._hist_version != hist.version:
                    self._rewalk(context)
                cands += [(d, "history") for d in self._drafts(hist.tree, self._hist_states, k,
                                                                self.params.history_min_match)]
            cands.sort(key=lambda c: -c[0].score)          # stable: the local text wins ties
            edits = self._edit_drafts(min(k, self._edit_len))
            cands[1:1] = edits                              # after the best match
            if not cands:
                self._last = (None, [])
                return Proposal.empty()
            # 3. the best draft, or a tree of the best drafts' nodes; where each node was copied from
            used = cands if self.tree_mode else cands[:1]
            self._edit_offered = any(c is e for c in used for e in edits)
            tokens, parents, raw = merge(used, self.params.tree_nodes if self.tree_mode else k)
            origins = [self._text(where, i) for where, i in raw]
            if self.tracer.enabled:
                self._trace(cands[0][0], cands[0][1], len(context), len(tokens))
        proposal = Proposal(TokenTree(tuple(tokens), tuple(parents)), None, [1.0] * len(tokens), origins=origins)
        self._last = (proposal, raw)
        return proposal

    # ------------------------------------------------------------------ following edits
    def _seq(self, where: str) -> list[int]:
        return self.history.tree.seq if where == "history" else self.local.seq

    def _edit_drafts(self, budget: int) -> list[tuple[Continuation, str]]:
        """A chain of up to ``budget`` source tokens at each cursor, newest first, match or not. A tree
        takes them in that order after the best match, as far as its node budget goes: the reading "the
        target replaced the token" (the common edit) first, "it inserted text before it" with the nodes
        left (on the grounded benchmark prompts a longer first chain beat sharing the nodes evenly)."""
        out: list[tuple[Continuation, str]] = []
        for where, at, _ in self._cursors:
            seq = self._seq(where)
            draft = Continuation()
            for i in range(at, min(len(seq), at + budget)):
                if seq[i] == SEP:
                    break
                draft.tokens.append(seq[i])
                draft.where.append(i)
            if draft.tokens:
                draft.parents = list(range(-1, len(draft.tokens) - 1))
                draft.probs = [1.0] * len(draft.tokens)
                out.append((draft, where))
        return out

    def _follow_edits(self, proposal: Proposal, committed: Sequence[int], path: Sequence[int]) -> None:
        """Bring the cursors up to date with a step's committed tokens (the last one is the target's own;
        ``path``: the proposal's nodes the others were accepted from).

        A cursor the tokens followed moves along; one they followed for a while and then left, like the copy
        the accepted path came from, is *cut*: two cursors take its place, after the token the target did
        not write (it replaced it) and at it (it inserted text before it). Others age and go after
        ``EDIT_PATIENCE`` steps; the newest ``EDIT_CURSORS`` are kept. When the step's draft held cursor
        chains, their length doubles (up to ``edit_tokens``) if the target followed one for two tokens or
        more, and halves (down to 1) if it followed none: a model that does not edit its input (a chat
        model writing new prose) soon pays for one or two extra verify positions, not ``edit_tokens``."""
        cuts: list[tuple[str, int]] = []
        moved: list[tuple[str, int, int]] = []
        aged: list[tuple[str, int, int]] = []
        followed = [run_length(self._seq(where), at, committed) for where, at, _ in self._cursors]
        if self._edit_offered:   # the edit drafts' length adapts, so text that is not being edited costs little
            if max(followed, default=0) >= 2:
                self._edit_len = min(self.params.edit_tokens, 2 * self._edit_len)
            elif max(followed, default=0) == 0:
                self._edit_len = max(1, self._edit_len // 2)
        for (where, at, idle), n in zip(self._cursors, followed):
            if n == len(committed):
                moved.append((where, at + n, 0))            # the target wrote the source: move along
            elif n:
                cuts.append((where, at + n))
            elif idle + 1 < EDIT_PATIENCE:
                aged.append((where, at, idle + 1))
        if moved or cuts:
            aged = []            # the target is back in the source: the other readings of the edit are refuted
        last, raw = self._last
        if last is proposal and raw and path:
            where, at = raw[path[-1]]                        # the end of the accepted path
            if run_length(self._seq(where), at + 1, committed[-1:]) == 0:
                cuts.insert(0, (where, at + 1))             # the source token the copy did not get to
        fresh: list[tuple[str, int, int]] = []
        for where, cut in cuts:
            seq = self._seq(where)
            if cut < len(seq) and seq[cut] != SEP:
                fresh += [(where, cut + 1, 0), (where, cut, 0)]
        seen: set[tuple[str, int]] = set()
        kept = []
        for c in fresh + moved + aged:
            if c[:2] not in seen:
                seen.add(c[:2])
                kept.append(c)
        self._cursors = kept[:EDIT_CURSORS]

    def _extend(self, tokens: Sequence[int]) -> None:
        """Committed tokens: into the local tree, and one step further along the history."""
        self.local.extend(tokens)
        hist = self.history
        if hist is not None and self._hist_version == hist.version:
            with hist.lock:
                for t in tokens:
                    self._hist_states = hist.tree.advance(self._hist_states, int(t), self.params.max_depth)

    # ------------------------------------------------------------------ drafting
    def _drafts(self, tree: SuffixTree, states: list[tuple[int, int]], k: int,
                min_match: int = 1) -> list[Continuation]:
        """One draft per distinct match in ``states`` (depths ascending) at least ``min_match`` tokens
        long: chains, or trees in tree mode."""
        p = self.params
        out: list[Continuation] = []
        seen_count = -1
        for state in reversed(states):       # deepest first: the deepest match of each count wins
            m = tree.state_depth(state)
            if m < min_match:                # shallower ones follow: none is long enough
                break
            count = tree.state_count(state)
            if count == seen_count:          # same occurrences as a deeper match: same continuations
                continue
            seen_count = count
            budget = min(k, int(m * p.spec_factor + p.spec_offset + 1e-6))
            if budget < 1:
                continue
            draft = tree.draft_tree(state, budget, p.min_token_prob, p.tree_nodes) if self.tree_mode \
                else tree.draft_path(state, budget, p.min_token_prob)
            if draft.tokens:
                out.append(draft)
        return out

    def _rewalk(self, context: Sequence[int]) -> None:
        """Match the whole context against the history again (a new generation, or the history changed)."""
        tree, depth = self.history.tree, self.params.max_depth
        states: list[tuple[int, int]] = []
        for t in context[-depth:]:      # a match is at most ``depth`` tokens long
            states = tree.advance(states, int(t), depth)
        self._hist_states, self._hist_version = states, self.history.version
        self._cursors = [c for c in self._cursors if c[0] != "history"]     # its indices may have moved

    # ------------------------------------------------------------------ where drafts came from
    def _text(self, where: str, index: int) -> tuple[str, int, int]:
        """(text, item, offset): which earlier text a sequence index lies in."""
        if where == "history":
            item, offset = self.history.locate(index)
            return "history", item, offset
        if index < self.prompt_len:
            return "prompt", -1, index
        return "output", -1, index - self.prompt_len

    def _count_accepted(self, proposal: Proposal, path: Sequence[int]) -> None:
        if proposal.origins:
            for node in path:
                self.accepted_from[proposal.origins[node][0]] += 1

    def _trace(self, draft: Continuation, where: str, position: int, nodes: int) -> None:
        """A ``DraftSource`` event: the occurrence the first path was copied from, with the match."""
        path = [0]
        while True:
            kids = [i for i, par in enumerate(draft.parents) if par == path[-1]]
            if not kids:
                break
            path.append(kids[0])
        last = path[-1]
        seq = self.history.tree.seq if where == "history" else self.local.seq
        copy0 = draft.where[last] - len(path) + 1                 # the first copied token of that occurrence
        text, item, _ = self._text(where, copy0)
        floor = self.history.tree.starts[item] if where == "history" else \
            (0 if copy0 < self.prompt_len else self.prompt_len)
        self.tracer.emit(source_event(
            seq, copy0 - draft.match_len, draft.match_len, len(path), floor, step=self.clock(),
            position=position - self.prompt_len, text=text, item=item,
            occurrences=max(0, draft.occurrences - (where == "local")), nodes=nodes,
            score=round(draft.score, 4), source=self.source))


def run_length(seq: Sequence[int], at: int, tokens: Sequence[int]) -> int:
    """How many of ``tokens`` ``seq`` holds from index ``at`` on."""
    n = 0
    while n < len(tokens) and at + n < len(seq) and seq[at + n] == tokens[n]:
        n += 1
    return n


def merge(cands: list[tuple[Continuation, str]], max_nodes: int) -> tuple[list[int], list[int], list[tuple[str, int]]]:
    """The nodes of ranked drafts as one tree of at most ``max_nodes`` nodes (a path already drafted by a
    better draft is not repeated). Returns tokens, parents (parents first) and each node's (text, index)."""
    tokens: list[int] = []
    parents: list[int] = []
    origins: list[tuple[str, int]] = []
    index: dict[tuple[int, int], int] = {}              # (parent node, token) -> node
    for draft, where in cands:
        mine: list[int] = []                              # this draft's node -> merged node
        for tok, par, at in zip(draft.tokens, draft.parents, draft.where):
            parent = mine[par] if par >= 0 else -1
            node = index.get((parent, tok))
            if node is None:
                if len(tokens) >= max_nodes:
                    return tokens, parents, origins
                node = index[(parent, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(parent)
                origins.append((where, at))
            mine.append(node)
    return tokens, parents, origins


def source_event(seq: Sequence[int], match_start: int, match_len: int, copied: int, floor: int,
                 **fields: Any) -> DraftSource:
    """The ``DraftSource`` of a copy: ``seq[match_start:][:match_len]`` matched the context's end and the
    next ``copied`` tokens were drafted. The window starts at most ``SOURCE_WINDOW`` tokens before the
    match, never before ``floor`` (where the copied text begins), so a match reaching back across the
    prompt/output boundary shows only its part in the copied text."""
    copy0 = match_start + match_len
    lo = max(match_start - SOURCE_WINDOW, floor)
    m0 = max(match_start, lo)
    return DraftSource(tokens=tuple(seq[lo:copy0 + copied]), match_at=m0 - lo, match_len=copy0 - m0,
                       copied=copied, start=lo - floor, **fields)
