"""The prophet drafter: drafts from the target's own hidden states with a trained head (``decoding/runtime/head.py``).

The verify forward the loop runs anyway returns the target's last-layer states;
``observe`` queues them with the tokens they predicted, and the next ``propose``
feeds them into the head's own KV cache in one call (step 0), whose output
feature gives the first draft distribution. Then either

* a chain: each further step fuses the head's previous feature with the token it
  just drafted (one head position per step), stopping early when the head's top
  probability is below ``confidence_threshold``; or
* an EAGLE-2 dynamic tree (``tree=true``, ``drafting/dynamic.py``): each depth
  runs the head once over the ``tree_topk`` most probable nodes of the newest
  depth, every node attending to the committed pairs and its own ancestors; the
  tree is cut to the ``tree_nodes`` most probable nodes; or, with
  ``budget="measured"``, to the most probable prefix worth its verify forward
  on this machine (``drafting/budget.py``: expected tokens per ms, from the
  target's measured forward-cost curve ``cost``). The chosen sizes and their
  predicted gains are in ``stats()["tree_budget"]``.

``q_draft`` is zero outside the head's draft vocabulary; verification always uses
the target's full vocabulary, so greedy output is exactly greedy's whatever the
head predicts.

With ``fast=true`` on a GPU the head's calls run on a static cache as captured CUDA graphs, one per call shape
(``runtime/headgraph.py``); on the CPU they do so only within ``graphs.emulation()`` (the tests' check of the
graph discipline), and otherwise stay eager as with ``fast=false``.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.budget import Budget, Cost, choose_budget
from decoding.drafting.dynamic import Growth, grow, visible_ancestors
from decoding.events import ForwardPass
from decoding.runtime import graphs, headgraph
from decoding.sampling import probs as filtered_probs
from decoding.sampling import sample
from decoding.tracer import NULL_TRACER


class ProphetDrafter(Drafter):
    source = "prophet"
    needs_hidden = True

    def __init__(self, prophet: Any, params: Any, *, tracer: Any = NULL_TRACER, clock: Any = None,
                 rng: Optional[torch.Generator] = None, cost: Optional[Cost] = None) -> None:
        """``cost``: the target's verify-forward cost c(T) in ms (``runtime/forward_cost.py``), needed by
        ``budget="measured"``."""
        super().__init__()
        self.prophet, self.params, self.rng, self.tracer = prophet, params, rng, tracer
        self.clock = clock or (lambda: 0)
        self.greedy = params.is_greedy
        self.keep_q = not self.greedy or tracer.enabled
        self.threshold = float(params.confidence_threshold or 0.0)
        self.measured = params.budget == "measured" and bool(params.tree)
        if self.measured and cost is None:
            raise ValueError("budget=measured needs the target's forward-cost curve (make_drafter measures it)")
        self.cost = cost
        self.hidden_layers = tuple(prophet.config.feature_layers)
        self.fast = bool(getattr(params, "fast", False))
        self.runner: Optional[headgraph.HeadRunner] = None
        self.begin(())

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.finish(())
        graphed = self.fast and (self.prophet.device.type == "cuda" or graphs.emulating())
        self.runner = headgraph.checkout(self.prophet, self, headgraph.BUCKET) if graphed else None
        self.state = headgraph.HeadState() if self.runner is not None else self.prophet.new_state()
        self._graph_counts = [0, 0]              # the head's captures and replays in this generation
        self._seen = self._counters()
        self._pending: list[tuple[torch.Tensor, list[int]]] = []
        self._last: Optional[tuple[torch.Tensor, torch.Tensor]] = None      # (feature [1, H], logits [1, Vd])
        self.budgets: list[Budget] = []          # the measured budget's choice at each tree step

    def finish(self, output: Sequence[int]) -> None:
        """The static head's runner goes back to the head's pool (its regions stay captured for the next run)."""
        if self.runner is not None:
            self._tally_graphs()
            headgraph.release(self.prophet, self.runner)

    def _counters(self) -> tuple[int, int]:
        r = self.runner
        return (r.graphs.captures, r.graphs.replays) if r is not None else (0, 0)

    def _tally_graphs(self) -> None:
        now = self._counters()
        self._graph_counts = [a + b - c for a, b, c in zip(self._graph_counts, now, self._seen)]
        self._seen = now

    def _room(self, k: int) -> None:
        """Grow the static head cache when this draft (its pending pairs and up to ``k`` depths) would not fit."""
        pending = sum(len(t) for _, t in self._pending)
        topk = self.params.tree_shape(self.prophet.device)[0] if self.params.tree else 1
        rows, positions = pending + k * topk, pending + k + 1
        if not self.runner.fits(self.state, rows, positions):
            self._tally_graphs()
            need = max(self.state.length + rows, self.state.n + positions + 1)
            self.runner = headgraph.checkout(self.prophet, self, need, keep=(self.runner, self.state))
            self._seen = self._counters()

    def observe(self, hidden: torch.Tensor, tokens: Sequence[int]) -> None:
        """Newly committed tokens and the target's last-layer states ``[m, H]`` that predicted them (for a
        layer-fusion head ``[m, (1 + k) H]``: the last layer's, then each of ``hidden_layers``')."""
        m = min(hidden.shape[0], len(tokens))
        if m:
            self._pending.append((hidden[:m], list(tokens[:m])))

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if not (self._pending or self.state.n):
            return Proposal.empty()
        t0 = time.perf_counter()
        if self.runner is not None:
            self._room(k)
        g0, logits0 = self._catch_up()                                            # [1, H], [1, Vd]
        self._count(1, t0)
        if self.params.tree:
            return self._tree(g0, logits0, k, t0)
        return self._chain(g0, logits0[0], k)

    def _count(self, positions: int, t0: float) -> None:
        self.forwards += 1
        if self.tracer.enabled:
            self.tracer.emit(ForwardPass(step=self.clock(), model="draft", positions=positions,
                                         ms=round((time.perf_counter() - t0) * 1e3, 3), kind="draft"))

    def _catch_up(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the pairs committed since the last draft into the head's cache; the newest pair's feature and
        its draft logits."""
        p = self.prophet
        if self._pending:
            hidden = torch.cat([h for h, _ in self._pending]).to(p.dtype)
            ids = torch.tensor([t for _, toks in self._pending for t in toks], device=p.device)
            self._pending.clear()
            H, k = p.config.hidden, len(self.hidden_layers)
            extra = hidden[:, H:].reshape(-1, k, H) if k else None   # [last | layer i | ...] from the session
            if self.runner is not None:
                self._last = self.runner.extend(self.state, hidden[:, :H], ids, extra)
            else:
                g = p.extend(self.state, hidden[:, :H], ids, extra)
                self._last = (g, p.draft_logits(g))
        return self._last

    def _head(self, scratch: Any, g: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor | int,
              visible: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One head call over ``K`` draft positions (``Prophet.draft_nodes``): features ``[K, H]``, logits
        ``[K, Vd]``; on the static cache's replayed region when there is one."""
        if self.runner is None:
            out = self.prophet.draft_nodes(self.state, scratch, g, tokens, pos, visible)
            return out, self.prophet.draft_logits(out)
        out, logits = self.runner.draft_nodes(self.state, scratch.used, g, tokens, pos, visible)
        scratch.used += g.shape[0]
        return out, logits

    def _full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` -> full-vocabulary logits ``[..., V]`` (-inf outside)."""
        p = self.prophet
        full = torch.full((*draft_logits.shape[:-1], p.full_to_draft.shape[0]), float("-inf"),
                          device=draft_logits.device)
        full[..., p.vocab] = draft_logits.float()
        return full

    def _chain(self, g: torch.Tensor, logits: torch.Tensor, k: int) -> Proposal:
        p = self.prophet
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        q_token: list[float] = []
        scratch = p.new_scratch()
        for j in range(k):
            if j:   # 1. one head position: the previous feature fused with the token just drafted
                t0 = time.perf_counter()
                g, logits = self._head(scratch, g, torch.tensor([tokens[-1]], device=p.device), self.state.n - 1 + j)
                logits = logits[0]                                                 # [Vd]
                self._count(1, t0)
            # 2. a token: argmax, or a sample from the filtered q_draft over the full vocabulary
            if self.greedy:
                tok = int(p.vocab[int(logits.argmax())])
                q = self._full_logits(logits).softmax(-1) if self.keep_q else None
            else:
                q = filtered_probs(self._full_logits(logits), self.params)          # [V]
                tok = sample(q, self.rng)
            # 3. an unsure head stops early: every drafted token costs a verified position
            if tokens and self.threshold and float(logits.softmax(-1).max()) < self.threshold:
                break
            tokens.append(tok)
            if q is not None:
                rows.append(q)
                q_token.append(float(q[tok]))
        return Proposal.chain(tokens, torch.stack(rows) if rows else None, q_token or None)

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Children's log q ``[K, Vd]`` (greedy, draft vocabulary) or ``[K, V]`` (sampling, filtered, full)."""
        if self.greedy:
            return logits.float().log_softmax(-1)
        return filtered_probs(self._full_logits(logits), self.params).log()

    def _tree(self, g0: torch.Tensor, logits0: torch.Tensor, depth: int, t_start: float) -> Proposal:
        p = self.prophet
        n = self.state.n
        feats: dict[int, torch.Tensor] = {-1: g0}          # node -> the head's output feature there
        slots: dict[int, int] = {}                          # node -> its column in the scratch cache
        scratch = p.new_scratch()

        def expand(g: Growth, nodes: list[int]) -> torch.Tensor:
            t0 = time.perf_counter()
            g_par = torch.cat([feats[g.parents[e]] for e in nodes])                  # [K, H]
            toks = torch.tensor([g.tokens[e] for e in nodes], device=p.device)
            pos = torch.tensor([n - 1 + g.depths[e] for e in nodes], device=p.device)
            vis = visible_ancestors(g, nodes, slots, len(slots)) if slots else None       # [K, S] on the host
            if vis is not None and self.runner is None:
                vis = vis.to(p.device)
            out, logits = self._head(scratch, g_par, toks, pos, vis)                   # [K, H], [K, Vd]
            for r, e in enumerate(nodes):
                slots[e] = len(slots)
                feats[e] = out[r:r + 1]
            rows = self._rows(logits)
            self._count(len(nodes), t0)
            return rows

        def choose(path_probs: list[float]) -> int:
            """The measured budget: this step's drafting so far is the d of drafting/budget.py."""
            chosen = choose_budget(path_probs, self.cost, (time.perf_counter() - t_start) * 1e3)
            self.budgets.append(chosen)
            return chosen.nodes

        topk, nodes = self.params.tree_shape(p.device)
        return grow(self._rows(logits0)[0], expand, depth=depth, topk=topk, budget=nodes, threshold=self.threshold,
                    sample=not self.greedy, rng=self.rng, ids=p.vocab if self.greedy else None,
                    vocab=p.full_to_draft.shape[0], choose=choose if self.measured else None)

    # ------------------------------------------------------------------ what it reports
    def stats(self) -> dict:
        """With a measured budget: ``tree_budget`` (means over the steps, and the cost curve's points) and
        ``tree_budget_nodes`` (the nodes kept at each step)."""
        if self.runner is not None:
            self._tally_graphs()
        graphed = {"head_graphs": {"captures": self._graph_counts[0], "replays": self._graph_counts[1]}} \
            if self.fast and self.runner is not None else {}
        if not self.measured:
            return graphed
        b, n = self.budgets, max(1, len(self.budgets))
        summary = {"mode": "measured", "steps": len(b),
                   "mean_offered_nodes": round(sum(x.offered for x in b) / n, 3),
                   "mean_kept_nodes": round(sum(x.nodes for x in b) / n, 3),
                   "mean_expected_tokens": round(sum(x.expected for x in b) / n, 4),
                   "mean_predicted_ms": round(sum(x.ms for x in b) / n, 4),
                   "mean_predicted_gain": round(sum(x.gain for x in b) / n, 4),
                   "mean_predicted_speedup": round(sum(x.predicted_speedup for x in b) / n, 4)}
        record = getattr(self.cost, "record", None)
        if callable(record):
            summary.update(record())
        return {**graphed, "tree_budget": summary, "tree_budget_nodes": [x.nodes for x in b]}
