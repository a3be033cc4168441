"""Many Jacobi states in one forward: documents and their blocks packed into one sequence with a 4D mask.

A *document* is a context (chat prompt + the base model's greedy answer, the fixed point) and blocks
hung on it. A block is a Jacobi state seen after the context's first ``anchor + 1`` tokens: its
tokens sit at positions ``anchor + 1, anchor + 2, ...`` and attend to that part of the context and,
causally, to each other, never to other blocks or documents. So the output at block token ``j``
is what the model predicts at that position of a Jacobi iteration whose state holds the block's
tokens: for a state ``y`` of a block starting at answer token ``t`` (its first token is predicted
by context position ``anchor = P + t - 1``), the block's tokens are ``y[:-1]`` and output ``j``
should be the fixed point's ``context[anchor + 2 + j]``.

The same layout serves the trajectory recording (blocks fed after the cached contexts) and the
training loss (contexts and blocks in one forward, with gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class Doc:
    context: list[int]
    blocks: list[tuple[int, list[int]]] = field(default_factory=list)   # (anchor, tokens)


@dataclass
class Packed:
    ids: torch.Tensor          # [T] long
    positions: torch.Tensor    # [T] long
    allowed: torch.Tensor      # [T, T] bool: query row may attend to key column
    ctx_start: list[int]       # per doc: where its context starts in the sequence
    block_start: list[list[int]]   # per doc, per block: where its tokens start


def pack(docs: Sequence[Doc], contexts: bool = True) -> Packed:
    """Lay out ``docs`` (their contexts when ``contexts``, then every block) as one sequence.

    Without ``contexts`` only the blocks are laid out, and ``allowed`` is ``[Tb, Tc + Tb]``: the
    contexts are already in a cache, in document order.
    """
    ctx_len = [len(d.context) for d in docs]
    ctx_start = [sum(ctx_len[:i]) for i in range(len(docs))]
    tc = sum(ctx_len)
    ids: list[int] = []
    pos: list[int] = []
    owner: list[tuple[int, int, int]] = []       # per block token: (doc, context end exclusive, block id)
    block_start: list[list[int]] = []
    counter = 0
    for d, doc in enumerate(docs):
        starts = []
        for anchor, tokens in doc.blocks:
            if not 0 <= anchor < len(doc.context):
                raise ValueError(f"block anchor {anchor} outside a context of {len(doc.context)} tokens")
            starts.append((tc if contexts else 0) + len(ids))
            ids += tokens
            pos += range(anchor + 1, anchor + 1 + len(tokens))
            owner += [(d, anchor + 1, counter)] * len(tokens)
            counter += 1
        block_start.append(starts)
    tb = len(ids)
    allowed = torch.zeros(tb, tc + tb, dtype=torch.bool)
    block_id = torch.tensor([o[2] for o in owner], dtype=torch.long)
    for r, (d, end, _) in enumerate(owner):
        allowed[r, ctx_start[d]:ctx_start[d] + end] = True
    if tb:
        same = block_id[:, None] == block_id[None, :]
        allowed[:, tc:] = same & torch.ones(tb, tb, dtype=torch.bool).tril()
    if not contexts:
        return Packed(torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long), allowed,
                      ctx_start, block_start)
    ctx_ids = [t for doc in docs for t in doc.context]
    ctx_pos = [p for n in ctx_len for p in range(n)]
    ctx_allowed = torch.zeros(tc, tc, dtype=torch.bool)
    for s, n in zip(ctx_start, ctx_len):
        ctx_allowed[s:s + n, s:s + n] = torch.ones(n, n, dtype=torch.bool).tril()
    full = torch.cat([torch.cat([ctx_allowed, torch.zeros(tc, tb, dtype=torch.bool)], dim=1), allowed], dim=0)
    return Packed(torch.tensor(ctx_ids + ids, dtype=torch.long), torch.tensor(ctx_pos + pos, dtype=torch.long),
                  full, ctx_start, block_start)


def float_mask(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[1, 1, T, S]``: 0 where allowed, -inf elsewhere (what transformers takes as a 4D mask)."""
    mask = torch.zeros(1, 1, *allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.to(device)[None, None], float("-inf"))
