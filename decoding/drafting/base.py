"""The drafter contract: everything the propose -> verify -> accept loop asks of a drafter.

The loop (``decoding/strategies/speculative.py``) never asks which drafter it has. It calls:

* ``begin(prompt_ids)`` once per generation;
* ``draft(context, k)``: a timed ``propose``, returning a :class:`Proposal` of at
  most ``k`` tokens deep (a chain, or a tree of candidates);
* ``observe(hidden, tokens)`` after every target forward, only when the drafter
  declares ``needs_hidden``: the target's last-layer states ``[m, H]`` that
  predicted the newly committed ``tokens`` (as transformers' candidate
  generators declare ``requires_model_outputs``);
* ``feedback(proposal, accepted)`` after verification, with the tokens the step
  committed (the accepted path plus the target's correction or bonus);

and reads ``forwards`` and ``ms`` (the drafter's own model forwards and the
time spent drafting), so the cost ratio ``c`` is right for every drafter, the
model-free ones included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from decoding.params import MAX_DRAFT
from decoding.tree import TokenTree


@dataclass(frozen=True)
class LayerForm:
    """Which of the target's own layers drafted (a self-draft, ``drafting/selfdraft.py``): of its ``layers``
    decoder layers, those below ``exit_layer`` except ``skipped``, then its final norm and LM head."""
    layers: int
    exit_layer: int
    skipped: tuple[int, ...] = ()

    def event_fields(self) -> dict:
        """The fields of a ``DraftProposed`` that say so."""
        return {"layers": self.layers, "exit_layer": self.exit_layer, "skipped": tuple(self.skipped)}


@dataclass
class Proposal:
    """A drafted chain or tree, with the draft distributions the verifier needs when sampling.

    ``q[i]`` is the distribution node ``i``'s token was drawn from given its parent
    (shared by siblings); ``None`` means the drafter is deterministic (q is one-hot
    on each node's token). ``replacement`` says whether siblings were drawn
    independently (True) or one after another without replacement (False).
    ``q_token[i]`` is q_draft of node ``i``'s token, for the trace.
    """
    tree: TokenTree
    q: Optional[torch.Tensor] = None
    q_token: list[float] = field(default_factory=list)
    replacement: bool = False
    origins: list[Any] = field(default_factory=list)      # per node, drafter-specific (views); may be empty
    layers: Optional[LayerForm] = None                    # a self-draft: which of the target's layers drafted

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Optional[torch.Tensor] = None,
              q_token: Optional[Sequence[float]] = None, origins: Optional[Sequence[Any]] = None) -> "Proposal":
        tokens = list(tokens)
        return cls(TokenTree.chain(tokens), q, list(q_token) if q_token is not None else [1.0] * len(tokens),
                   origins=list(origins or []))

    @classmethod
    def empty(cls) -> "Proposal":
        return cls.chain([])

    @property
    def tokens(self) -> list[int]:
        return list(self.tree.tokens)

    def __len__(self) -> int:
        return len(self.tree)

    def limited(self, depth: int) -> "Proposal":
        """The nodes no deeper than ``depth`` (the room left before ``max_new_tokens``)."""
        if self.tree.depth <= depth:
            return self
        tree, kept = self.tree.truncated(depth)
        return Proposal(tree, None if self.q is None else self.q[kept], [self.q_token[i] for i in kept],
                        self.replacement, [self.origins[i] for i in kept] if self.origins else [], self.layers)


class Drafter:
    """Base of every drafter. Subclasses implement ``propose`` and declare what they need.

    Class attributes a subclass may override:

    * ``source``: the name recorded in traces (``DraftProposed.source``);
    * ``accepted_source``: the ``TokenCommitted.source`` of its accepted tokens;
    * ``needs_hidden``: True when it drafts from the target's hidden states
      (then the loop asks the target for them and calls :meth:`observe`).
    """

    source = "draft"
    accepted_source = "accepted"
    needs_hidden = False
    hidden_layers: tuple = ()   # with needs_hidden: intermediate hidden-state indices wanted too
    forwards = 0               # the drafter's own model forwards (0 for model-free drafters)

    def __init__(self) -> None:
        self.ms = 0.0          # wall time spent in propose()
        self.proposals = 0

    # ------------------------------------------------------------------ the loop's calls
    def begin(self, prompt_ids: Sequence[int]) -> None:
        """A new generation starts with ``prompt_ids`` (drafters with per-generation state reset it)."""

    def draft(self, context: Sequence[int], k: int) -> Proposal:
        """``propose``, timed: the loop's only way to ask for a draft."""
        t0 = time.perf_counter()
        proposal = self.propose(context, k) if k > 0 else Proposal.empty()
        self.ms += (time.perf_counter() - t0) * 1e3
        self.proposals += 1
        return proposal

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        """A draft of at most ``k`` tokens deep continuing ``context`` (prompt + committed tokens)."""
        raise NotImplementedError

    def observe(self, hidden: torch.Tensor, tokens: Sequence[int]) -> None:
        """The target's states ``[m, H]`` that predicted the newly committed ``tokens`` (``needs_hidden`` only)."""
        raise NotImplementedError(f"{type(self).__name__} declares needs_hidden but does not observe")

    def feedback(self, proposal: Proposal, accepted: Sequence[int]) -> None:
        """The tokens a step committed for ``proposal``: its accepted path, then the target's own token.

        Drafters that keep state about the context (a draft model's KV cache, an
        index of the output) bring it up to date here; the default keeps nothing.
        """

    def finish(self, output: Sequence[int]) -> None:
        """The generation ended with ``output`` (every new token); drafters that learn across runs keep it."""

    # ------------------------------------------------------------------ what it reports
    def stats(self) -> dict:
        """The drafter's own statistics for the run's ``Result.stats`` (the loop never reads its attributes)."""
        return {}


class DraftLength:
    """Fixed, or transformers' heuristic: +2 after a fully accepted draft, -1 after a rejection."""

    def __init__(self, start: int, adaptive: bool, cap: int = MAX_DRAFT) -> None:
        self.k, self.adaptive, self.cap = start, adaptive, cap

    def update(self, drafted: int, accepted: int) -> None:
        """``drafted``: the draft's depth; ``accepted``: how many of its tokens the target accepted."""
        if not self.adaptive or drafted == 0:
            return
        self.k = min(self.cap, self.k + 2) if accepted >= drafted else max(1, self.k - 1)
