"""KV caches: a dynamic cache that grows in place, shrink one to a length, and compact one onto the rows a
tree verification accepted.

transformers' ``DynamicLayer`` appends each forward's keys and values with ``torch.cat``: every forward
copies the whole cache of every layer, which grows with the context (5-8 % of a one-position forward of
the bundled model after 256-4,096 tokens on a 2-vCPU Zen 5 EPYC; ``benchmarks/bench_kvcache.py``).
``GrowingLayer`` writes them into a buffer with headroom and hands attention a view of the filled part: the
same values, shapes and strides in the last two dimensions, so the logits are bit-identical (tested), and a
copy only when the buffer is outgrown. ``new_dynamic_cache`` makes a ``DynamicCache`` of such layers.

Shrinking and compaction work on transformers' dynamic caches through their public layers; the fast path's
static caches (``fastpath.StaticRunner``) do their own. ``session.Session`` is the only caller in the loops.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional, Sequence

import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.cache_utils import DynamicLayer

HEADROOM = 0.25        # a growing layer's buffer holds this share more than it needs when it is (re)allocated
MIN_HEADROOM = 64      # positions, at least
ALIGN = 256            # buffer capacities are multiples of this


def grown_capacity(need: int) -> int:
    """The buffer size for ``need`` positions: ``HEADROOM`` more (at least ``MIN_HEADROOM``), rounded up."""
    want = max(int(need * (1 + HEADROOM)), need + MIN_HEADROOM)
    return -(-want // ALIGN) * ALIGN


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into a preallocated buffer.

    ``update`` writes the new positions after the filled ones and returns views of the filled part; when
    the buffer is too small it is reallocated at ``grown_capacity`` and the filled part copied once. Anything
    that replaces ``keys`` with a tensor of its own (beam search's reorder, a batch repeat) is adopted at the
    next update. ``crop`` (a shorter view) and in-place writes to the views (``compact_cache``) keep the
    buffer. ``reallocations`` counts the copies.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kbuf: Optional[torch.Tensor] = None
        self._vbuf: Optional[torch.Tensor] = None
        self.reallocations = 0

    def _ours(self) -> bool:
        """Whether ``keys``/``values`` are still views of the start of this layer's buffers."""
        return (self._kbuf is not None and self.keys.data_ptr() == self._kbuf.data_ptr()
                and self.values.data_ptr() == self._vbuf.data_ptr())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        t = key_states.shape[-2]
        fits = self._kbuf is not None and n + t <= self._kbuf.shape[-2] \
            and self._kbuf.shape[:-2] == key_states.shape[:-2] and self._kbuf.dtype == key_states.dtype
        if not fits or (n and not self._ours()):
            cap = grown_capacity(n + t)
            # zeros, not garbage: the row-exact attention (gqa_attention.rows_sdpa_forward) reads masked
            # positions past the filled part, and a masked NaN would still poison its sums
            kbuf = key_states.new_zeros(*key_states.shape[:-2], cap, key_states.shape[-1])
            vbuf = value_states.new_zeros(*value_states.shape[:-2], cap, value_states.shape[-1])
            if n:
                kbuf[..., :n, :] = self.keys
                vbuf[..., :n, :] = self.values
                self.reallocations += 1
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[..., n:n + t, :] = key_states
        self._vbuf[..., n:n + t, :] = value_states
        self.keys = self._kbuf[..., :n + t, :]
        self.values = self._vbuf[..., :n + t, :]
        return self.keys, self.values


def new_dynamic_cache(encoder_decoder: bool = False) -> Any:
    """A ``DynamicCache`` (an ``EncoderDecoderCache`` of two for encoder-decoder models) whose layers are
    ``GrowingLayer``s."""
    def one() -> DynamicCache:
        cache = DynamicCache()
        cache.layer_class_to_replicate = GrowingLayer     # its layers are made at their first update
        return cache
    return EncoderDecoderCache(one(), one()) if encoder_decoder else one()


@functools.lru_cache(maxsize=None)
def _cache_name(forward: Any) -> str:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(model: Any) -> str:
    """The name a model's ``forward`` takes its KV cache under: ``cache`` in newer transformers 5 releases
    (``past_key_values`` warns there and goes in 5.40), ``past_key_values`` in older ones."""
    return _cache_name(type(model).forward)


def crop_cache(cache: Any, length: int) -> None:
    """Shrink a transformers cache to ``length`` positions (5.x ``crop`` takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def crop_each_layer(cache: Any, length: int) -> None:
    """Shrink every layer of a dynamic cache to ``length`` positions, each by its own count: after a draft that ran
    only some layers (``runtime/layers.layer_view``), those layers hold more positions than the others, and
    ``crop_cache`` (one count for all, from layer 0) would cut the others short."""
    for layer in _self_attention_layers(cache):
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


def _self_attention_layers(cache: Any) -> list:
    inner = getattr(cache, "self_attention_cache", cache)
    return list(inner.layers)


def compact_cache(cache: Any, base: int, rows: Sequence[int]) -> None:
    """Keep positions ``base + r`` (``r`` in ``rows``, ascending) at ``base, base + 1, ...``; drop the rest.

    Works on transformers' dynamic caches (the layers keep every position since
    the last crop) and on static caches (``fastpath.StaticRunner`` does its own).
    """
    rows = list(rows)
    if rows != sorted(set(rows)):
        raise ValueError("rows to keep must be ascending and distinct")
    m = len(rows)
    if rows != list(range(m)):
        _move_rows(cache, base, rows)
    crop_cache(cache, base + m)


@torch.inference_mode()
def _move_rows(cache: Any, base: int, rows: list[int]) -> None:
    m = len(rows)
    for layer in _self_attention_layers(cache):
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        offset = layer.get_seq_length() - layer.keys.shape[-2]     # positions no longer stored
        if base - offset < 0:
            raise RuntimeError("cannot compact: the cache no longer holds the positions before the tree")
        src = torch.tensor([base + r - offset for r in rows], device=layer.keys.device)
        dst = slice(base - offset, base - offset + m)
        layer.keys[..., dst, :] = layer.keys.index_select(-2, src)
        layer.values[..., dst, :] = layer.values.index_select(-2, src)


@torch.inference_mode()
def select_positions(cache: Any, keep: torch.Tensor) -> None:
    """Keep only the cached positions ``keep`` (ascending indices), in that order, in every layer of a
    transformers dynamic cache (a batch whose rows own different positions drops the ones no row owns)."""
    for layer in _self_attention_layers(cache):
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        index = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
