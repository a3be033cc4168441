"""The fast path: a preallocated KV cache, explicit positions and masks, CUDA graphs.

A small model on a GPU spends most of a decode step launching kernels, not
computing: a 30-layer model issues hundreds of launches per forward, each a few
microseconds of Python and driver time. The fast path removes that overhead
without changing a single token:

* the KV cache is a transformers ``StaticCache`` of fixed capacity, so every
  forward of ``T`` query positions has the same tensor shapes whatever the
  prefix length;
* positions and the 4D float attention mask are computed from the cache's own
  write counter (plain causal forwards) or copied into fixed buffers (tree and
  window layouts), so they are data, not shapes;
* on CUDA each distinct forward shape is captured once as a CUDA graph and
  replayed afterwards: one launch per forward instead of hundreds.

On the CPU the same code runs without capture, which is how the tests check
that the fast path gives exactly the tokens of the plain one; within
``graphs.emulation()`` the CPU replays each region as a graph would (the first
call's closure, re-run over the static buffers), so the tests also check that
every input reaches a region through its buffers (``runtime/graphs.py``). Prefill (long,
variable length) always runs uncaptured. Decoder-only models only; a model
whose layers mix sliding-window and full attention keeps the plain path.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

import torch

from decoding.runtime import compiled
from decoding.runtime.gqa_attention import KEY_BLOCK
from decoding.runtime.graphs import Graphs, admit
from decoding.runtime.kvcache import cache_kwarg

BUCKET = 256          # capacities are rounded up to this, so prompts of similar length share graphs
MAX_GRAPH_T = 128     # forwards longer than this (prefill) run uncaptured
MAX_RUNNERS = 4       # per model: runners idle beyond this are dropped
MAX_LAYOUTS = 512     # per runner: tree layouts kept on the device


def supported(lm: Any) -> bool:
    """Whether ``lm`` can use the fast path (decoder-only, full attention in every layer)."""
    if lm.is_encoder_decoder:
        return False
    types = getattr(lm.model.config, "layer_types", None) or []
    return all(t == "full_attention" for t in types)


def capacity_for(positions: int) -> int:
    return -(-max(positions, 1) // BUCKET) * BUCKET


def pick_states(states: tuple, hidden: Any) -> torch.Tensor:
    """The hidden states a caller asked for: ``hidden`` True = the last layer's ``[B, T, H]``; a tuple of
    hidden-state indices = the last layer's followed by those layers', concatenated ``[B, T, (1 + k) H]``
    (a layer-fusion prophet head's input)."""
    if hidden is True or not isinstance(hidden, tuple):
        return states[-1]
    return torch.cat([states[-1]] + [states[i] for i in hidden], dim=-1)


class StaticRunner:
    """One static KV cache of ``capacity`` positions and the graphs captured over it."""

    def __init__(self, lm: Any, capacity: int) -> None:
        from transformers import StaticCache
        self.lm, self.model, self.capacity = lm, lm.model, capacity
        self.engine = compiled.engine(lm) if lm.device.type == "cpu" else None   # the compiled CPU path
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        self.length = 0
        self.graphs = Graphs(lm.device)     # captured on CUDA, emulated on the CPU in graphs.emulation()
        self._slots = torch.arange(capacity, device=lm.device)
        self._buffers: dict[tuple, dict[str, torch.Tensor]] = {}
        self._layouts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}     # tree shape -> its device layout
        self.compiled_forwards = 0   # forwards that ran compiled (runtime/compiled.py)
        # the compiled path's scores read the keys transposed, [kv, d, capacity] per layer: kept beside the cache,
        # written by the graph, and brought up to date from the cache after eager forwards (prefill) and moves
        self._keys_t: Optional[list[torch.Tensor]] = None
        self._mirrored = 0           # slots [0, _mirrored) of _keys_t hold the cache's keys

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self.rewind(0)

    def rewind(self, length: int) -> None:
        """Drop every position from ``length`` on (the slots stay; the mask hides them)."""
        length = min(length, self.length)
        self._mirrored = min(self._mirrored, length)
        if length != self.length or length == 0:
            self._set_counters(length)
        self.length = length

    def _set_counters(self, length: int) -> None:
        with torch.inference_mode():
            for layer in self.cache.layers:
                if isinstance(layer.cumulative_length, torch.Tensor):
                    layer.cumulative_length.fill_(length)
                else:
                    layer.cumulative_length = length

    def keep(self, base: int, rows: list[int]) -> None:
        """Move cached positions ``base + r`` (``r`` in ``rows``, ascending) to ``base, base + 1, ...``; drop the rest."""
        if self._move_in_one_call(base, rows) or self._move_in_a_region(base, rows):
            return
        src = torch.tensor([base + r for r in rows], device=self.lm.device)
        self._mirrored = min(self._mirrored, base)
        with torch.inference_mode():
            for layer in self.cache.layers:
                if getattr(layer, "is_initialized", False):
                    layer.keys[:, :, base:base + len(rows)] = layer.keys.index_select(2, src)
                    layer.values[:, :, base:base + len(rows)] = layer.values.index_select(2, src)
        self.rewind(base + len(rows))

    def _move_in_one_call(self, base: int, rows: list[int]) -> bool:
        """``keep`` for the compiled path's float32 caches: every layer's keys, values and transposed keys moved
        by one call of the attention kernel's ``move_rows`` (some 120 tensor operations otherwise, ~0.5 ms a
        step on the Intel Xeon). False where it does not apply (then ``keep`` moves them itself)."""
        layers = self.cache.layers
        if self.engine is None or self.engine.attention is not None or not self._initialized():
            return False
        caches = [layer.keys for layer in layers] + [layer.values for layer in layers]
        if any(c.dtype != torch.float32 or not c.is_contiguous() for c in caches):
            return False
        if self._keys_t is not None and self._mirrored >= base + (rows[-1] + 1 if rows else 0):
            caches += self._keys_t              # the mirror holds those rows: move them with the cache
            mirrored = base + len(rows)
        else:
            mirrored = min(self._mirrored, base)
        with torch.inference_mode():
            torch.ops.decoding_attention.move_rows(caches, torch.tensor(rows, dtype=torch.long), base)
        self._mirrored = mirrored
        self.rewind(base + len(rows))
        return True

    def _move_in_a_region(self, base: int, rows: list[int]) -> bool:
        """``keep`` as one replayed region per number of rows (CUDA: one graph launch instead of two kernels per
        layer and tensor, and one per layer to set its write counter); the rows to move, their destinations and
        the new length are data in static buffers. False where regions are not replayed (then ``keep`` moves
        them itself)."""
        n = len(rows)
        counters = [layer.cumulative_length for layer in self.cache.layers]
        if not (self.graphs.active and self.engine is None and n and base + n <= self.length
                and self._initialized() and all(isinstance(c, torch.Tensor) for c in counters)):
            return False
        with torch.inference_mode():
            buf = self._load_keep(("keep", n), [base + r for r in rows], base)
            self.graphs.run(("keep", n), lambda: self._move_rows(buf))
        self.length = base + n
        self._mirrored = min(self._mirrored, self.length)
        return True

    def _load_keep(self, key: tuple, src: list[int], base: int) -> dict[str, torch.Tensor]:
        """The static buffers of a move of ``len(src)`` rows: from cache slots ``src`` to ``base, base + 1, ...``."""
        n, dev = len(src), self._slots.device
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = {"src": torch.zeros(n, dtype=torch.long, device=dev),
                                        "dst": torch.zeros(n, dtype=torch.long, device=dev),
                                        "length": torch.zeros((), dtype=torch.long, device=dev)}
        buf["src"].copy_(torch.tensor(src))
        buf["dst"].copy_(self._slots[base:base + n])
        buf["length"].copy_(self._slots[base + n - 1] + 1)
        return buf

    def _move_rows(self, buf: dict[str, torch.Tensor]) -> tuple:
        """The region of a move: every layer's keys and values, rows ``src`` to rows ``dst``; every layer's write
        counter to the kept length."""
        for layer in self.cache.layers:
            for cache in (layer.keys, layer.values):
                cache.index_copy_(2, buf["dst"], cache.index_select(2, buf["src"]))
            layer.cumulative_length.copy_(buf["length"])
        return ()

    def _initialized(self) -> bool:
        return all(getattr(layer, "is_initialized", False) for layer in self.cache.layers)

    # ------------------------------------------------------------------ forwards
    def forward(self, ids: torch.Tensor, *, position_ids: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                last_only: bool, hidden: bool, capture: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``ids [1, T]`` after the cached prefix -> (float logits ``[1, T|1, V]``, last hidden or None).

        ``mask`` is the caller's ``[1, 1, T, length + T]`` float mask (0 attend, -inf
        blocked) with its ``position_ids``; without them the forward is plain causal
        and position ``i`` of the block sits at slot ``length + i``.
        """
        t = ids.shape[-1]
        if self.length + t > self.capacity:
            raise RuntimeError(f"static cache of {self.capacity} positions is full")
        custom = mask is not None
        if self.engine is not None and capture and self._initialized() and (
                t <= compiled.ROWS or mask is None or not _sees_later_rows(mask, self.length)):
            return self._compiled(ids, position_ids, mask, last_only, hidden)
        key = ("custom" if custom else "causal", t, last_only, hidden)
        buf = self._load(key, ids, position_ids, mask)
        fn = lambda: self._step(buf, "custom" if custom else "causal", last_only, hidden)   # noqa: E731
        out = self._run(key, fn, t) if capture else fn()
        self.length += t
        logits, states = out
        return logits.clone(), (None if states is None else states.clone())

    def forward_tree(self, ids: torch.Tensor, parents: tuple[int, ...], layout: tuple[torch.Tensor, torch.Tensor], *,
                     hidden: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A tree's verify forward: ``ids [1, T]`` = pending tokens then the nodes, ``layout`` = ``tree_layout``'s
        (``allowed [T, T]``, ``offsets [T]``: positions after the cache's write position). The layout goes to the
        device once per tree shape (``parents``); the region builds the positions and the ``[T, capacity]`` mask
        from it and the cache's write counter, so the host prepares nothing per step but the ids."""
        t = ids.shape[-1]
        if self.engine is not None:        # the compiled CPU path takes the whole mask
            allowed, offsets = layout
            mask = torch.zeros(1, 1, t, self.length + t, dtype=self.lm.dtype, device=ids.device)
            mask[0, 0, :, self.length:].masked_fill_(~allowed.to(ids.device), float("-inf"))
            pos = (offsets.to(ids.device) + self.length)[None]
            return self.forward(ids, position_ids=pos, mask=mask, last_only=False, hidden=hidden)
        if self.length + t > self.capacity:
            raise RuntimeError(f"static cache of {self.capacity} positions is full")
        key = ("tree", t, False, hidden)
        buf = self._load_tree(key, ids, *self._layout(parents, layout))
        out = self._run(key, lambda: self._step(buf, "tree", False, hidden), t)
        self.length += t
        return out[0].clone(), (None if out[1] is None else out[1].clone())

    def _load_tree(self, key: tuple, ids: torch.Tensor, allowed: torch.Tensor,
                   offsets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The static buffers of a tree region, with this tree's ids and layout copied into them."""
        t, dev = ids.shape[-1], ids.device
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = {"ids": torch.zeros(1, t, dtype=torch.long, device=dev),
                                        "allowed": torch.zeros(t, t, dtype=torch.bool, device=dev),
                                        "offsets": torch.zeros(t, dtype=torch.long, device=dev)}
        buf["ids"].copy_(ids)
        buf["allowed"].copy_(allowed)
        buf["offsets"].copy_(offsets)
        return buf

    def _layout(self, parents: tuple[int, ...], layout: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        """``layout`` on the device, made once per tree shape (a few hundred shapes kept)."""
        key = (layout[0].shape[0], parents)
        found = self._layouts.get(key)
        if found is None:
            if len(self._layouts) >= MAX_LAYOUTS:
                self._layouts.clear()
            found = self._layouts[key] = tuple(x.to(self.lm.device) for x in layout)
        return found

    def _compiled(self, ids: torch.Tensor, position_ids: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                  last_only: bool, hidden: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One forward through the model's compiled graph (``runtime/compiled.py``). Each row sees what the plain
        causal (or the caller's) mask gives it, laid out over the cache as a one-position forward sees it."""
        t, n, rows_max = ids.shape[-1], self.length, compiled.ROWS
        if t > rows_max:
            # wider than a graph call: chunks of ``ROWS`` rows, each after the keys of the last (the caller
            # checked that no row sees a later one, so each reads what it would have read in one forward)
            parts = []
            for a in range(0, t, rows_max):
                b = min(a + rows_max, t)
                parts.append(self._compiled(
                    ids[:, a:b], None if position_ids is None else position_ids[:, a:b],
                    None if mask is None else mask[:, :, a:b, : n + b], last_only and b == t, hidden))
            logits = parts[-1][0] if last_only else torch.cat([p[0] for p in parts], dim=1)
            states = None if parts[0][1] is None else torch.cat([p[1] for p in parts], dim=1)
            return logits, states
        dev, dtype = ids.device, self.lm.dtype
        new = torch.arange(n, n + t, device=dev)
        pos = position_ids if mask is not None and position_ids is not None else new
        # the graph's inputs in one layout and made here (a chunk's slice has other strides, a caller's tensor made
        # outside inference mode other dispatch keys: either would cost a recompile, and another graph's code)
        ids, pos = ids.reshape(1, -1).clone(), pos.reshape(1, -1).clone()
        # every row attends over the same span: the rows so far rounded up to KEY_BLOCK (whole vectors, so a row's
        # masked tail adds zeros after its own terms, runtime/compiled._attend); capacities are multiples of it
        span = min(-(-(n + t) // KEY_BLOCK) * KEY_BLOCK, self.capacity)
        slots = self._slots[:span].unsqueeze(0)
        if mask is None:                                        # causal: row i sees slots up to n + i
            seen = slots <= new.unsqueeze(1)
        else:                                                   # [1, 1, t, n + t]: a chain, a tree or a window
            seen = torch.zeros(t, span, dtype=torch.bool, device=dev)
            seen[:, : n + t] = mask[0, 0] == 0
        if mask is None or self.engine.attention is None:
            # causal rows' keys already lie in position order, and the attention kernel sums in slot order
            order = slots.expand(t, span).clone()
        else:           # each row's seen slots first, in slot (= position) order: the layout greedy cached them in
            order = torch.where(seen, slots, slots + span).argsort(dim=1)
        rows = torch.zeros(t, span, dtype=dtype, device=dev).masked_fill_(~seen, float("-inf"))
        layers = self.cache.layers
        logits, states = self.engine.run(ids, pos, rows, new, order, [layer.keys for layer in layers],
                                         [layer.values for layer in layers], self._mirror(n), hidden)
        self._mirrored = n + t
        self.length = n + t
        self._set_counters(self.length)
        self.compiled_forwards += 1
        return (logits[:, -1:] if last_only else logits), states

    def _mirror(self, n: int) -> list[torch.Tensor]:
        """The transposed keys, holding the cache's first ``n`` positions."""
        layers = self.cache.layers
        if self._keys_t is None:
            self._keys_t = [torch.zeros(k.shape[1], k.shape[3], k.shape[2], dtype=k.dtype, device=k.device)
                            for k in (layer.keys for layer in layers)]
            self._mirrored = 0
        if self._mirrored < n:
            a = self._mirrored
            for layer, keys_t in zip(layers, self._keys_t):
                keys_t[:, :, a:n].copy_(layer.keys[0, :, a:n].transpose(1, 2))
            self._mirrored = n
        return self._keys_t

    def _load(self, key: tuple, ids: torch.Tensor, position_ids: Optional[torch.Tensor],
              mask: Optional[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The static buffers of ``key``'s region, with this forward's inputs copied into them (a region reads
        only these: a graph replays the addresses it recorded)."""
        t, custom = ids.shape[-1], mask is not None
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self._new_buffers(t, custom)
        buf["ids"].copy_(ids)
        if custom:
            if position_ids is None:
                position_ids = torch.arange(self.length, self.length + t, device=ids.device).unsqueeze(0)
            buf["pos"].copy_(position_ids)
            buf["mask"].fill_(float("-inf"))
            buf["mask"][..., : self.length + t].copy_(mask)
        return buf

    def _new_buffers(self, t: int, custom: bool) -> dict[str, torch.Tensor]:
        dev = self.lm.device
        buf = {"ids": torch.zeros(1, t, dtype=torch.long, device=dev),
               "steps": torch.arange(t, device=dev)}
        if custom:
            buf["pos"] = torch.zeros(1, t, dtype=torch.long, device=dev)
            buf["mask"] = torch.zeros(1, 1, t, self.capacity, dtype=self.lm.dtype, device=dev)
        return buf

    def _step(self, buf: dict, mode: str, last_only: bool, hidden: bool) -> tuple:
        """The captured body: build positions and mask from device state, run the model. ``mode``: "causal"
        (from the write counter), "custom" (the caller's, in the buffers) or "tree" (its layout + the counter)."""
        if mode == "custom":
            pos, mask = buf["pos"], buf["mask"]
        else:
            start = self._write_position()
            if mode == "tree":
                pos = (start + buf["offsets"]).unsqueeze(0)                    # [1, T]
                col = self._slots - start                                      # [capacity]: column in the block
                t = buf["allowed"].shape[0]
                inside = buf["allowed"].gather(1, col.clamp(0, t - 1).expand(t, -1))
                allowed = (col < 0) | ((col < t) & inside)                     # [T, capacity]
            else:
                pos = (start + buf["steps"]).unsqueeze(0)                      # [1, T]
                allowed = self._slots.unsqueeze(0) <= pos[0].unsqueeze(1)      # [T, capacity]
            mask = torch.zeros(allowed.shape, dtype=self.lm.dtype, device=allowed.device)
            mask = mask.masked_fill(~allowed, float("-inf"))[None, None]
        kwargs: dict = {"input_ids": buf["ids"], "position_ids": pos, "attention_mask": mask,
                        cache_kwarg(self.model): self.cache, "use_cache": True}
        if last_only and self.lm.supports_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        out = self.model(**kwargs)
        logits = out.logits[:, -1:] if last_only else out.logits
        return logits.float(), (pick_states(out.hidden_states, hidden) if hidden else None)

    def _write_position(self) -> torch.Tensor:
        """The cache's write counter as a device tensor (data, so a graph reads its current value)."""
        counter = self.cache.layers[0].cumulative_length
        if isinstance(counter, torch.Tensor) and counter.device == self._slots.device:
            return counter.clone()
        return torch.tensor(int(counter), device=self._slots.device)

    def _run(self, key: tuple, fn: Callable[[], tuple], t: int) -> tuple:
        return self.graphs.run(key, fn, eager=t > MAX_GRAPH_T or not self._initialized())

    @property
    def captures(self) -> int:
        """Regions captured (tests and the benchmark report it)."""
        return self.graphs.captures

    @property
    def replays(self) -> int:
        return self.graphs.replays

    def grow_to(self, capacity: int) -> "StaticRunner":
        """A bigger runner holding this one's cached positions."""
        bigger = StaticRunner(self.lm, capacity)
        n = self.length
        for old, new in zip(self.cache.layers, bigger.cache.layers):
            if getattr(old, "is_initialized", False):
                new.lazy_initialization(old.keys[:, :, :1], old.values[:, :, :1])
                new.keys[:, :, :n].copy_(old.keys[:, :, :n])
                new.values[:, :, :n].copy_(old.values[:, :, :n])
        bigger.length = n
        bigger._set_counters(n)
        return bigger


def _sees_later_rows(mask: torch.Tensor, base: int) -> bool:
    """Whether a row of ``mask [1, 1, T, base + T]`` attends to a row after it (then it cannot be chunked)."""
    t = mask.shape[-2]
    later = torch.ones(t, t, dtype=torch.bool, device=mask.device).triu(1)
    return bool(((mask[0, 0, :, base:] == 0) & later).any())


# --------------------------------------------------------------------------- runner pool

_LOCK = threading.Lock()


def _pool(lm: Any) -> list[list]:
    """The model's runners, ``[runner, weak reference to its owner]``, kept on the loaded model (its state)."""
    return lm.state.fastpath_runners


def checkout(lm: Any, owner: Any, positions: int) -> Optional[StaticRunner]:
    """A runner for ``owner`` (a Session) with room for ``positions``; None if all are busy.

    Runners are reused across generations (their graphs stay captured) and are
    never shared by two live sessions: ownership is a weak reference, released
    when the session is garbage-collected.
    """
    capacity = capacity_for(positions)
    with _LOCK:
        pool = _pool(lm)
        free = [e for e in pool if e[1]() is None]
        for entry in free:
            if entry[0].capacity == capacity and entry[0].engine is (
                    compiled.engine(lm) if lm.device.type == "cpu" else None):
                entry[1] = weakref.ref(owner)
                entry[0].reset()
                return entry[0]
        return admit(pool, free, owner, lambda: StaticRunner(lm, capacity), MAX_RUNNERS)


def replace(lm: Any, old: StaticRunner, new: StaticRunner, owner: Any) -> None:
    with _LOCK:
        pool = _pool(lm)
        pool[:] = [e for e in pool if e[0] is not old]
        pool.append([new, weakref.ref(owner)])


def pool_stats(lm: Any) -> dict:
    with _LOCK:
        pool = _pool(lm)
        return {"runners": len(pool), "captures": sum(e[0].captures for e in pool),
                "replays": sum(e[0].replays for e in pool)}
