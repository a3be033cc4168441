"""The prophet head's draft on the fast path: static buffers, each head call a captured region (CUDA graphs).

The eager head (``runtime/head.py``) writes its keys at rows sliced by Python ints and attends over a view as
long as the rows so far: shapes and offsets change every call, so nothing can be replayed. Here the head's KV
cache has a fixed ``capacity`` of rows, and each call's inputs are copied into static buffers kept per call
shape: the rows' input features and tokens, their absolute positions, the cache rows they write (``slots``,
written by ``index_copy_``) and which rows they see (``mask [K, capacity]``). The region itself (every head
layer, the final norm and the draft-vocabulary logits) reads only those, so it is captured once per shape and
replayed (``runtime/graphs.py``): on CUDA as a graph, on the CPU within ``graphs.emulation()`` by emulation.
Everything decided on the host (which nodes to expand, the argmax of a chain, which rows a node sees) happens
outside the region, between replays.

Two regions, keyed by their row count: ``("extend", m)`` feeds ``m`` committed pairs (the step-0 catch-up) and
gives the newest pair's feature and logits; ``("draft", K)`` runs ``K`` draft positions (a chain's step, a
tree's depth). Rows beyond those a call may see are masked; the cache starts zeroed, so masked rows add exact
zeros. The head's tokens can differ from the eager head's in the last bits (a longer attention sum), never the
committed output: verification decides that.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F

from decoding.runtime.graphs import Graphs, admit

BUCKET = 256          # capacities (rows of the head's cache, and positions) are rounded up to this
MAX_RUNNERS = 4       # per head: runners idle beyond this are dropped


def capacity_for(rows: int) -> int:
    return -(-max(rows, 1) // BUCKET) * BUCKET


class HeadState:
    """A generation's place in a runner's cache: committed pairs held (``length``) and seen (``n``)."""

    def __init__(self) -> None:
        self.length = 0
        self.n = 0


class HeadRunner:
    """One static KV cache of ``capacity`` rows for ``prophet`` and its captured regions."""

    def __init__(self, prophet: Any, capacity: int) -> None:
        c, dev, dt = prophet.config, prophet.device, prophet.dtype
        self.prophet, self.capacity = prophet, capacity
        self.keys = [torch.zeros(1, c.kv_heads, capacity, c.head_dim, dtype=dt, device=dev) for _ in prophet.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        cos, sin = prophet._rope(0, capacity)              # [capacity, d]: the eager head's own table
        self.cos, self.sin = cos.to(dt).clone(), sin.to(dt).clone()
        self.rows = torch.arange(capacity, device=dev)
        self._host_rows = torch.arange(capacity)          # the masks are made on the host, copied over once
        self.graphs = Graphs(dev)
        self._buffers: dict[tuple, dict[str, torch.Tensor]] = {}

    # ------------------------------------------------------------------ the regions
    def _through(self, b: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``x [K, H]`` through every head layer at ``b["pos"]``, writing its keys/values at rows ``b["slot"]``,
        each row attending to the rows ``b["mask"] [K, capacity]`` marks (static buffers only)."""
        c, K = self.prophet.config, x.shape[0]
        h, kv, d = c.heads, c.kv_heads, c.head_dim
        cos, sin = self.cos[b["pos"]][:, None], self.sin[b["pos"]][:, None]            # [K, 1, d]
        for i, layer in enumerate(self.prophet.layers):
            y = layer.qkv_rows(layer.input_norm(x)).view(K, h + 2 * kv, d)
            qk = y[:, :h + kv]
            qk = qk * cos + qk.roll(d // 2, -1) * sin                                   # RoPE on q and k at once
            self.keys[i].index_copy_(2, b["slot"], qk[:, h:].transpose(0, 1)[None])
            self.values[i].index_copy_(2, b["slot"], y[:, h + kv:].transpose(0, 1)[None])
            att = F.scaled_dot_product_attention(qk[:, :h].transpose(0, 1)[None], self.keys[i], self.values[i],
                                                 attn_mask=b["mask"], enable_gqa=h != kv)   # [1, h, K, d]
            x = x + layer.o(att[0].transpose(0, 1).reshape(K, h * d))
            x = x + layer.mlp_rows(layer.post_norm(x))
        return x

    def _extend_region(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.prophet
        H, k = p.config.hidden, len(p.config.feature_layers)
        hid = b["input"]
        extra = hid[:, H:].reshape(hid.shape[0], k, H) if k else None
        x = self._through(b, p._fuse(p.features(hid[:, :H], extra), b["tok"]))
        g = p.norm(x[-1:])                                                               # [1, H]
        return g, p.draft_logits(g).float()

    def _draft_region(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.prophet
        g = p.norm(self._through(b, p._fuse(b["input"], b["tok"])))                     # [K, H]
        return g, p.draft_logits(g).float()

    def _buffers_for(self, key: tuple, width: int) -> dict[str, torch.Tensor]:
        b = self._buffers.get(key)
        if b is None:
            K, dev = key[1], self.rows.device
            b = self._buffers[key] = {
                "input": torch.zeros(K, width, dtype=self.prophet.dtype, device=dev),
                "tok": torch.zeros(K, dtype=torch.long, device=dev),
                "pos": torch.zeros(K, dtype=torch.long, device=dev),
                "slot": torch.zeros(K, dtype=torch.long, device=dev),
                "mask": torch.zeros(K, self.capacity, dtype=torch.bool, device=dev)}
        return b

    def _load(self, key: tuple, inputs: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, start: int,
              seen: torch.Tensor) -> dict[str, torch.Tensor]:
        """``key``'s static buffers with one call's inputs copied into them (its region reads only these)."""
        K = key[1]
        b = self._buffers_for(key, inputs.shape[-1])
        b["input"].copy_(inputs)
        b["tok"].copy_(tokens)
        b["pos"].copy_(pos)
        b["slot"].copy_(self.rows[start:start + K])
        b["mask"].copy_(seen)
        return b

    def _call(self, kind: str, inputs: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, start: int,
              seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy one call's inputs into its shape's buffers (rows ``start ..`` of the cache, ``seen [K, capacity]``),
        run its region; (features, float logits), copies the next replay will not overwrite."""
        key = (kind, tokens.shape[0])
        b = self._load(key, inputs, tokens, pos, start, seen)
        region = self._extend_region if kind == "extend" else self._draft_region
        g, logits = self.graphs.run(key, lambda: region(b))
        return g.clone(), logits.clone()

    # ------------------------------------------------------------------ the head's calls, as the eager head's
    def extend(self, state: HeadState, hidden: torch.Tensor, tokens: torch.Tensor,
               extra: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``Prophet.extend`` on the static cache: the newest pair's feature ``[1, H]`` and its logits ``[1, Vd]``."""
        p = self.prophet
        if not p.config.context:      # only the newest pair is ever attended to
            state.n += hidden.shape[0] - 1
            hidden, tokens = hidden[-1:], tokens[-1:]
            extra = None if extra is None else extra[-1:]
            state.length = 0
        m, old = hidden.shape[0], state.length
        inputs = hidden.to(p.dtype) if extra is None else torch.cat([hidden.to(p.dtype),
                                                                      extra.to(p.dtype).flatten(1)], dim=-1)
        # the new pairs see every older pair and, causally, each other
        seen = self._host_rows[None, :] <= (old + self._host_rows[:m])[:, None]          # [m, capacity]
        out = self._call("extend", inputs, tokens, self.rows[state.n:state.n + m], old, seen)
        state.n += m
        state.length = old + m
        return out

    def draft_nodes(self, state: HeadState, used: int, g: torch.Tensor, tokens: torch.Tensor,
                    pos: torch.Tensor | int, visible: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``Prophet.draft_nodes`` on the static cache, after ``used`` draft rows of this draft: (features
        ``[K, H]``, logits ``[K, Vd]``). ``visible [K, used]`` on the host (copied with the rest of the mask)."""
        K, n = g.shape[0], state.length
        start = n + used
        seen = torch.zeros(K, self.capacity, dtype=torch.bool)                           # on the host
        seen[:, :n] = True                                                               # committed pairs
        if used:
            seen[:, n:start] = True if visible is None else visible.cpu()
        seen[:, start:start + K] = torch.eye(K, dtype=torch.bool)
        if isinstance(pos, int):
            pos = self.rows[pos:pos + K]
        return self._call("draft", g, tokens, pos, start, seen)

    def fits(self, state: HeadState, rows: int, positions: int) -> bool:
        """Whether ``rows`` more rows and positions up to ``state.n + positions`` fit."""
        return state.length + rows <= self.capacity and state.n + positions < self.capacity

    def grown(self, state: HeadState, capacity: int) -> "HeadRunner":
        """A runner of ``capacity`` rows holding this one's committed rows."""
        bigger = HeadRunner(self.prophet, capacity)
        n = state.length
        for old, new in zip(self.keys + self.values, bigger.keys + bigger.values):
            new[:, :, :n].copy_(old[:, :, :n])
        return bigger


# --------------------------------------------------------------------------- runners kept on the head

_LOCK = threading.Lock()


def _pool(prophet: Any) -> list[list]:
    """``[runner, weak reference to its owner]`` of the head (kept on it: freed with it)."""
    return prophet.__dict__.setdefault("_head_runners", [])


def checkout(prophet: Any, owner: Any, rows: int, keep: Optional[tuple[HeadRunner, HeadState]] = None
             ) -> Optional[HeadRunner]:
    """A runner for ``owner`` (a drafter) with room for ``rows``, reused across generations (its regions stay
    captured), never shared by two live owners; None when all are busy. ``keep``: the owner's current runner and
    state, whose committed rows the new one takes over (then the old one is dropped)."""
    capacity = capacity_for(rows)
    with _LOCK:
        pool = _pool(prophet)
        if keep is not None:
            pool[:] = [e for e in pool if e[0] is not keep[0]]
            runner = keep[0].grown(keep[1], capacity)
            pool.append([runner, weakref.ref(owner)])
            return runner
        free = [e for e in pool if e[1]() is None]
        for entry in sorted(free, key=lambda e: e[0].capacity):     # the smallest that fits: its regions stay
            if entry[0].capacity >= capacity:
                entry[1] = weakref.ref(owner)
                return entry[0]
        return admit(pool, free, owner, lambda: HeadRunner(prophet, capacity), MAX_RUNNERS)


def release(prophet: Any, runner: HeadRunner) -> None:
    with _LOCK:
        for entry in _pool(prophet):
            if entry[0] is runner:
                entry[1] = lambda: None


def pool_stats(prophet: Any) -> dict:
    """The head's runners and their regions' captures and replays (what a test asserts)."""
    with _LOCK:
        pool = _pool(prophet)
        return {"runners": len(pool), "captures": sum(e[0].graphs.captures for e in pool),
                "replays": sum(e[0].graphs.replays for e in pool),
                "keys": sorted({k for e in pool for k in e[0].graphs.keys()})}
