"""KV caches: shrink one to a length, and compact one onto the rows a tree verification accepted.

Both work on transformers' dynamic caches through their public layers; the fast path's static caches
(``fastpath.StaticRunner``) do their own. ``session.Session`` is the only caller in the loops.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Sequence

import torch


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
