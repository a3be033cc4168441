"""A batch of sequences in one KV cache, each row with its own length: what a batched speculative loop needs
when every row accepts its own number of drafted tokens.

The cache's columns are shared by the rows; a row owns some of them. ``valid [B, L]`` says which column holds
one of row ``b``'s tokens, ``cols[b]`` lists those columns in the row's order and ``positions [B, L]`` the
position id each column's token was fed at (its rotary angle, or its position embedding, is in its keys).

* ``prefill`` left-pads the prompts: a row's pad columns are never valid, its positions count from 0 at
  its first real token, so the last column is every row's newest token.
* ``extend`` feeds each row its own tokens (right-padded to the widest row), every row attending to its own
  valid columns and, inside the new block, to what its ``allowed`` table says (causal for a chain, the
  ancestors for a token tree). A row with nothing to feed (it has finished) only waits: its pad queries see
  themselves, so no all-masked row turns into NaN, and none of its new columns become valid.
* ``keep(b, rows)`` keeps the rows of row ``b``'s last feed that were accepted (the root and the accepted
  path): the others are only marked invalid, nothing moves.
* ``tidy`` crops columns no row owns at the end of the cache, and compacts the cache when the holes grow.

So rejected drafts leave holes instead of shifting a row's cache (the approach of padding and shifting each
row, as batched speculative decoding often does, moves every layer's keys at every step). The masks are built
by ``attention.attention_mask`` one row at a time (sliding-window layers included, from each row's own key
positions) and stacked.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from decoding.runtime.attention import attention_mask
from decoding.runtime.kvcache import crop_cache, select_positions
from decoding.runtime.session import Session

PAD = 0                 # the id fed at pad positions (never attended to: any id gives the same logits)
COMPACT_AFTER = 32      # dead columns (owned by no row) that make ``tidy`` compact the cache


class RaggedBatch:
    """``session``'s model run over a batch whose rows have their own lengths (decoder-only models)."""

    def __init__(self, session: Session) -> None:
        if session.lm.is_encoder_decoder:
            raise ValueError("a batch with per-row lengths runs decoder-only models")
        self.session = session
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.positions = torch.zeros(0, 0, dtype=torch.long)
        self.cols: list[list[int]] = []
        self._fed: list[list[int]] = []     # per row, the columns its last feed wrote
        self.compactions = 0

    def length(self, b: int) -> int:
        """Tokens row ``b`` holds in the cache."""
        return len(self.cols[b])

    # ------------------------------------------------------------------ forwards
    def prefill(self, prompts: Sequence[Sequence[int]], hidden: bool = False) -> torch.Tensor:
        """Run the left-padded prompts; next-token logits ``[B, V]`` (float32)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every row of a batch needs a non-empty prompt")
        s = self.session
        width = max(len(p) for p in prompts)
        pads = [width - len(p) for p in prompts]
        ids = s.tensor([[PAD] * k + list(p) for k, p in zip(pads, prompts)])                   # [B, P]
        self.valid = torch.tensor([[c >= k for c in range(width)] for k in pads])              # [B, P]
        self.positions = (torch.arange(width)[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)
        self.cols = [list(range(k, width)) for k in pads]
        self._fed = [list(c) for c in self.cols]
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        allowed = (causal[None] & self.valid[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]
        s.cache = s.new_cache()
        logits = s.forward(ids, position_ids=self.positions.to(s.lm.device),
                           attention_mask=self._mask(allowed, self.positions, self.positions, 0),
                           last_only=True, hidden=hidden, kind="prefill")
        return logits[:, -1]

    def extend(self, feeds: Sequence[Sequence[int]], allowed: Sequence[Optional[torch.Tensor]],
               rel: Sequence[Optional[torch.Tensor]], hidden: bool = False, kind: str = "verify") -> torch.Tensor:
        """Feed row ``b`` the tokens ``feeds[b]`` (possibly none) after its own tokens; logits ``[B, W, V]``.

        ``allowed[b] [t, t]`` (bool) is the attention pattern inside the row's new block and ``rel[b] [t]`` each
        fed token's position relative to the row's next position (``tree.tree_layout`` gives both); ``None``
        means a plain causal chain. All fed tokens become the row's (``keep`` drops the rejected ones)."""
        s, big = self.session, self.valid.shape[1]
        width = max(len(f) for f in feeds)
        if width == 0:
            raise ValueError("nothing to feed: every row has finished")
        n = len(feeds)
        ids = torch.full((n, width), PAD, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        block = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1)                      # [B, W, W] pads: self
        new_valid = torch.zeros(n, width, dtype=torch.bool)
        for b, feed in enumerate(feeds):
            t = len(feed)
            base = len(self.cols[b])
            pos[b] = base
            if t:
                ids[b, :t] = torch.tensor(list(feed))
                pos[b, :t] = base + (rel[b] if rel[b] is not None else torch.arange(t))
                block[b, :t, :t] = allowed[b] if allowed[b] is not None else \
                    torch.ones(t, t, dtype=torch.bool).tril()
                new_valid[b, :t] = True
        seen = self.valid[:, None, :].expand(n, width, big) & new_valid[:, :, None]         # [B, W, L]
        table = torch.cat([seen, block], dim=2)                                              # [B, W, L + W]
        keys = torch.cat([self.positions, pos], dim=1)                                       # [B, L + W]
        logits = s.forward(s.tensor(ids), position_ids=pos.to(s.lm.device),
                           attention_mask=self._mask(table, pos, keys, big), hidden=hidden, kind=kind)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.positions = keys
        self._fed = [[big + j for j in range(len(f))] for f in feeds]
        for b, cols in enumerate(self._fed):
            self.cols[b].extend(cols)
        return logits

    def _mask(self, allowed: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor, cached: int) -> Any:
        """One float mask for the batch from each row's ``allowed [T, cached + T]`` (``attention_mask``'s rule)."""
        lm = self.session.lm
        masks = [attention_mask(lm, allowed[b], pos[b], cached, key_positions=keys[b]) for b in range(len(allowed))]
        if isinstance(masks[0], dict):
            return {k: torch.cat([m[k] for m in masks]) for k in masks[0]}
        return torch.cat(masks)                                                          # [B, 1, T, cached + T]

    # ------------------------------------------------------------------ what a row keeps
    def keep(self, b: int, rows: Sequence[int]) -> None:
        """Keep the rows ``rows`` (ascending indices into row ``b``'s last feed) and drop the rest of that feed."""
        fed = self._fed[b]
        kept = [fed[r] for r in rows]
        for c in fed:
            if c not in kept:
                self.valid[b, c] = False
        self.cols[b] = self.cols[b][:len(self.cols[b]) - len(fed)] + kept
        self._fed[b] = kept

    def last_hidden(self, b: int, rows: Sequence[int]) -> torch.Tensor:
        """Row ``b``'s hidden states ``[len(rows), H]`` at ``rows`` of its last feed (after a ``hidden`` forward)."""
        return self.session.last_hidden[b, list(rows)]

    def tidy(self) -> None:
        """Drop the columns no row owns: a crop when they are at the end, a compaction when enough pile up."""
        owned = self.valid.any(dim=0)                                                    # [L]
        big = owned.numel()
        if big == 0 or bool(owned.all()):
            return
        last = int(owned.nonzero().max()) + 1 if bool(owned.any()) else 0
        if last < big:                                               # the tail no row owns: a crop
            crop_cache(self.session.cache, last)
            self.valid, self.positions = self.valid[:, :last], self.positions[:, :last]
            self._fed = [[c for c in fed if c < last] for fed in self._fed]
        if last - int(owned.sum()) >= COMPACT_AFTER:                 # holes inside: a compaction
            self._select(owned[:last].nonzero().flatten())
            self.compactions += 1

    def _select(self, keep: torch.Tensor) -> None:
        """Keep only the cache columns ``keep`` (ascending), renumbering every row's columns."""
        select_positions(self.session.cache, keep)
        where = {int(c): i for i, c in enumerate(keep.tolist())}
        self.valid = self.valid[:, keep]
        self.positions = self.positions[:, keep]
        self.cols = [[where[c] for c in cols] for cols in self.cols]
        self._fed = [[where[c] for c in fed if c in where] for fed in self._fed]
