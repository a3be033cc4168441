"""Grouped-query attention over a custom mask without copying the KV cache (CPU).

transformers' ``sdpa`` attention hands SDPA its grouped keys and values only
when there is no mask. A forward over several new positions with a mask (a
token tree's verify forward, a lookahead window) instead expands every layer's
cached keys and values to one copy per query head (``repeat_kv``) before each
call. SmolLM2-135M has 9 query heads over 3 KV heads, so each layer copies its
cache three times over, every forward. A profile of the prophet on the CPU put
7 % of a run's time in that copy (BENCHMARKS.md, "Cheaper tree verification on
the CPU").

PyTorch's SDPA takes the grouped tensors with a mask directly
(``enable_gqa=True``). On the CPU its result is bit-identical to the expanded
call, so nothing a strategy commits can change; a test checks that on a tree
forward. This module registers that attention under :data:`NAME`, with the
``sdpa`` mask builder, and :func:`use_gqa_attention` switches a model whose
attention is ``sdpa`` to it. Every other case (no mask, one query position,
no grouping, a position bias, a softcap, any device but the CPU, where a masked
GQA call can fall back to a slower kernel) goes to transformers' own ``sdpa``
function unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from decoding.runtime import graphs
from decoding.runtime.kernels import EXACT_WIDTH
from decoding.runtime.omp_pool import threads

# PyTorch's CPU SDPA over several threads gives a row other bits at another batch size (measured on an AMD EPYC Zen 5,
# torch 2.13, 2 threads: 25 of 28 shapes; one thread: none), so the row-exact attention, whose rows are batch
# elements, runs its SDPA calls on one thread: a verify forward's rows and greedy's one-row forward then go through
# the same arithmetic.
SDPA_THREADS = 1

NAME = "sdpa_gqa_cpu"


def _grouped(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: Optional[torch.Tensor], kwargs: dict) -> bool:
    """Whether this call is the one transformers would serve by copying the keys and values."""
    return (query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1
            and getattr(module, "num_key_value_groups", 1) > 1 and key.shape[-1] == value.shape[-1]
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


def gqa_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                     is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, heads, T, d]``, ``key``/``value [B, kv, S, d]``
    -> ``([B, T, heads, d], None)``."""
    if _cuttable(query, attention_mask):
        # a static cache's blocked tail cut off: a row's sums must not depend on the cache's capacity (a race's
        # greedy and a drafting strategy hold caches of other sizes, and their prefills must agree to the bit)
        key, value, attention_mask = _seen_prefix(key, value, attention_mask, query.shape[2])
    if not _grouped(module, query, key, value, attention_mask, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


# --------------------------------------------------------------------------- row-exact attention

ROWS_NAME = "sdpa_rows_cpu"
KEY_BLOCK = 16     # the row-exact attention pads every key length to a multiple of this; PyTorch's CPU SDPA
                   # must then give a row the same bits at every such length (measured: key_blocks_exact)
_KEY_BLOCKS_OK: list = []


def key_blocks_exact() -> bool:
    """Whether this CPU's SDPA, on one thread, gives a row the same bits at every key length that is a multiple of
    :data:`KEY_BLOCK` past its visible keys (the masked tail zero-weighted), and in a batch of rows the bits it gives
    the row alone: what the row-exact attention rests on.

    Measured once per process, never assumed from the CPU: the kernel library's reductions differ by instruction
    set. On an Intel Xeon (AVX-512) a row's bits hold at *every* key length past its block; on an AMD EPYC Zen 3
    (AVX2) only at lengths that are multiples of 4, so a multiple of ``KEY_BLOCK`` works on both. Where it fails,
    the bfloat16-weight presets do not run (``models.runs_here``), since their exactness needs it."""
    if not _KEY_BLOCKS_OK:
        _KEY_BLOCKS_OK.append(_key_block_checks())
    return _KEY_BLOCKS_OK[0]


def _key_block_checks(sdpa: Any = None) -> bool:
    sdpa = sdpa or F.scaled_dot_product_attention
    with threads(SDPA_THREADS):
        return _key_blocks_hold(sdpa) and _batches_hold(sdpa)


def _batches_hold(sdpa: Any) -> bool:
    """Rows computed as one batch (keys broadcast, each its own visible prefix) get the bits of each row alone."""
    gen = torch.Generator().manual_seed(1)
    heads, kv, d = 9, 3, 64
    for padded, t in ((16, 9), (64, 5), (256, 16)):
        q = torch.randn(t, heads, 1, d, generator=gen)
        k, v = torch.randn(1, kv, padded, d, generator=gen), torch.randn(1, kv, padded, d, generator=gen)
        mask = torch.zeros(t, 1, 1, padded, dtype=torch.bool)
        for i in range(t):
            mask[i, ..., :padded - KEY_BLOCK + 1 + i % KEY_BLOCK] = True
        together = sdpa(q, k.expand(t, kv, padded, d), v.expand(t, kv, padded, d), attn_mask=mask, enable_gqa=True)
        if not all(torch.equal(together[i:i + 1], sdpa(q[i:i + 1], k, v, attn_mask=mask[i:i + 1], enable_gqa=True))
                   for i in range(t)):
            return False
    return True


def _key_blocks_hold(sdpa: Any) -> bool:
    gen = torch.Generator().manual_seed(0)
    for heads, kv, d, t in ((6, 2, 32, 1), (9, 3, 64, 3)):
        for visible in (1, 5, 16, 37, 130):
            total = -(-visible // KEY_BLOCK) * KEY_BLOCK + 4 * KEY_BLOCK
            q = torch.randn(1, heads, t, d, generator=gen)
            k, v = torch.randn(1, kv, total, d, generator=gen), torch.randn(1, kv, total, d, generator=gen)
            rows = []
            for length in range(-(-visible // KEY_BLOCK) * KEY_BLOCK, total + 1, KEY_BLOCK):
                mask = torch.zeros(1, 1, t, length, dtype=torch.bool)
                mask[..., :visible] = True
                rows.append(sdpa(q, k[:, :, :length], v[:, :, :length], attn_mask=mask, enable_gqa=True))
            if not all(torch.equal(row, rows[0]) for row in rows[1:]):
                return False
    return True


def _row_exact(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Optional[torch.Tensor], dropout: float, kwargs: dict) -> bool:
    return (query.device.type == "cpu" and query.shape[0] == 1 and query.shape[2] <= EXACT_WIDTH
            and query.shape[2] <= key.shape[2] and dropout == 0.0 and getattr(module, "is_causal", True)
            and key.shape[-1] == value.shape[-1]
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


def _blocking(mask: torch.Tensor) -> bool:
    """Whether a float mask only allows (0) or blocks (-inf), as ``attention.attention_mask`` builds them."""
    return bool(mask.is_floating_point() and ((mask == 0) | (mask == float("-inf"))).all())


def _longer(cached: torch.Tensor, length: int) -> torch.Tensor:
    """``cached [1, kv, S, d]`` seen as ``[1, kv, length, d]``: a longer view of its buffer where the buffer
    has room (a growing cache's zeroed headroom), else a zero-padded copy. The extra positions are masked."""
    extra = length - cached.shape[-2]
    if extra <= 0:
        return cached
    stride = cached.stride()
    last = cached.storage_offset() + sum((n - 1) * st for n, st in zip(cached.shape[:-2], stride[:-2])) \
        + (length - 1) * stride[-2] + (cached.shape[-1] - 1) * stride[-1]
    if last < cached.untyped_storage().nbytes() // cached.element_size():
        return cached.as_strided((*cached.shape[:-2], length, cached.shape[-1]), stride, cached.storage_offset())
    return F.pad(cached, (0, 0, 0, extra))


@dataclass(frozen=True)
class Layout:
    """How the rows of one forward are computed: groups of rows, each over one order of the new keys.

    ``groups``: ``(rows, path)`` pairs; ``path`` lists new-key indices (0 = the first position of this
    forward) in the order they are laid after the cached keys for that group, and each row of the group sees
    the cache and the first ``seen[row]`` keys of its group's path. A token tree has one group per
    root-to-leaf path: a node sees the cache and its ancestors, laid out as greedy would have cached them.
    """
    groups: tuple
    seen: tuple
    plain: bool          # one group whose path is the new keys in order (a causal chain): nothing to move


_MEMO = threading.local()      # the last mask's layout (every layer of a forward gets the same mask object)


def layout_of(allowed: Optional[torch.Tensor], t: int) -> Optional[Layout]:
    """The :class:`Layout` of a forward's rows from ``allowed [T, cached + T]`` (None: causal), or None when a
    row does not see the whole cache (a sliding window: no exact layout)."""
    if allowed is None:
        return Layout(((tuple(range(t)), tuple(range(t))),), tuple(range(1, t + 1)), True)
    base = allowed.shape[1] - t
    if base and not bool(allowed[:, :base].all()):
        return None
    paths = [tuple(j for j, ok in enumerate(row) if ok) for row in allowed[:, base:].tolist()]
    groups, covered = [], set()
    for row in sorted(range(t), key=lambda r: -len(paths[r])):
        if row in covered:
            continue
        path = paths[row]
        members = tuple(r for r in range(t) if r not in covered and paths[r] == path[:len(paths[r])])
        covered.update(members)
        groups.append((members, path))
    plain = len(groups) == 1 and groups[0][1] == tuple(range(t))
    return Layout(tuple(groups), tuple(len(p) for p in paths), plain)


_CAUSAL: dict = {}             # t -> the causal layout (immutable, shared by every thread)


def _layout(attention_mask: Optional[torch.Tensor], t: int, s: int) -> Optional[Layout]:
    if attention_mask is None:
        if t not in _CAUSAL:
            _CAUSAL[t] = layout_of(None, t)
        return _CAUSAL[t]
    if getattr(_MEMO, "mask", None) is attention_mask and getattr(_MEMO, "shape", None) == (t, s):
        return _MEMO.layout
    allowed = attention_mask[0, 0, -t:, :s]
    if allowed.dtype == torch.bool:
        found = layout_of(allowed, t)
    else:                     # a float mask: exact only when it just allows (0) or blocks (-inf)
        found = layout_of(allowed == 0, t) if _blocking(attention_mask) else None
    _MEMO.mask, _MEMO.shape, _MEMO.layout = attention_mask, (t, s), found
    return found


def _cuttable(query: torch.Tensor, mask: Optional[torch.Tensor]) -> bool:
    """Whether :func:`_seen_prefix` may look at the mask: on the CPU, one sequence, and not inside a region replayed
    as a graph (``graphs.emulating``; on CUDA the fast path's regions are captured, and a cut is a host read with a
    shape that varies: there the keys keep the capacity)."""
    return mask is not None and query.device.type == "cpu" and query.shape[0] == 1 and not graphs.emulating()


def _seen(part: torch.Tensor) -> torch.Tensor:
    """Which of a mask's entries a row may attend to (a boolean mask, or an additive one's finite entries)."""
    return part if part.dtype == torch.bool else part != float("-inf")


def _seen_prefix(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                 t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``key``/``value``/``mask`` cut to the slots up to the last one any of the ``t`` rows sees (views): unchanged
    for a growing cache, whose last key is a row's own; a static cache's blocked tail cut off."""
    s = key.shape[2]
    if mask.dim() != 4 or mask.shape[-1] != s or s <= t:
        return key, value, mask
    if bool(_seen(mask[:, :, -t:, -1]).any()):        # a growing cache's: some row sees the last key (``t`` values)
        return key, value, mask
    # a static cache's whole mask (not memoized: its buffer is rewritten in place between forwards)
    found = _seen(mask[:, :, -t:, :]).flatten(0, 2).any(0).nonzero()
    last = int(found.max()) + 1 if found.numel() else s
    if last >= s or last < t:
        return key, value, mask
    return key[:, :, :last], value[:, :, :last], mask[..., :last]


def _visible(layout: Layout, base: int, padded: int) -> Optional[torch.Tensor]:
    """Each row's keys: the cache and the first ``seen`` keys of its path, as a ``[T, 1, 1, S']`` mask (None when
    every row sees every key: a one-position forward over a key length that needs no padding). Built once per
    forward (every layer asks for the same)."""
    key = (base, padded)
    if getattr(_MEMO, "visible_layout", None) is layout and _MEMO.visible_key == key:
        return _MEMO.visible
    ends = torch.tensor(layout.seen) + base                                    # [T] keys each row sees
    visible = None if bool((ends == padded).all()) else \
        (torch.arange(padded) < ends[:, None]).view(len(layout.seen), 1, 1, padded)
    _MEMO.visible_layout, _MEMO.visible_key, _MEMO.visible = layout, key, visible
    return visible


def rows_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention whose every row gets the bits a one-position forward gives it, however many rows there are.

    For a reduced-weight model (``kernels.Bf16Linear``), which rounds each linear's input to bfloat16: there
    a last-bit difference from the attention's summation order can flip a rounding and grow into a different
    token, so a verify forward's rows must equal greedy's exactly. PyTorch's CPU SDPA on one thread
    (:data:`SDPA_THREADS`) computes each batch element alone and gives a row the same bits for every key length
    from its visible keys rounded up to :data:`KEY_BLOCK` on (the tail masked); both are measured
    (:func:`key_blocks_exact`). So each query row becomes its own batch element (keys and values
    broadcast, not copied) over a key length rounded up to :data:`KEY_BLOCK`, read from the cache's zeroed
    headroom, and sees the cache and then its own new keys in position order, as greedy cached them: a tree
    row's ancestors are moved next to the cache for its group (:func:`layout_of`), and the cache's new keys
    put back afterwards. Forwards wider than ``kernels.EXACT_WIDTH`` (prefills, shared by every strategy), a
    sliding window and every other case go to :func:`gqa_sdpa_forward`.
    ``query [1, heads, T, d]`` -> ``([1, T, heads, d], None)``."""
    exact = _row_exact(module, query, key, value, attention_mask, dropout, kwargs)
    if exact and _cuttable(query, attention_mask):
        # a static cache (the fast path's, eager) hands over every slot of its capacity, the rows' own keys right
        # after the ones they may see and the rest blocked: the keys end where the last seen one does, as a growing
        # cache's would (this row layout counts the new keys from the end)
        key, value, attention_mask = _seen_prefix(key, value, attention_mask, query.shape[2])
    layout = _layout(attention_mask, query.shape[2], key.shape[2]) if exact else None
    if layout is None:
        return gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)
    _, heads, t, d = query.shape
    kv, s = key.shape[1], key.shape[2]
    base, padded = s - t, -(-s // KEY_BLOCK) * KEY_BLOCK
    visible = _visible(layout, base, padded)                                   # [T, 1, 1, S'] a prefix each
    rows = query[0].transpose(0, 1).unsqueeze(2)                               # [T, heads, 1, d]
    keys, values = _longer(key, padded), _longer(value, padded)               # [1, kv, S', d]
    if layout.plain:
        with threads(SDPA_THREADS):
            out = F.scaled_dot_product_attention(rows, keys.expand(t, kv, padded, d),
                                                 values.expand(t, kv, padded, d),
                                                 attn_mask=visible, scale=scaling, enable_gqa=heads != kv)
        return out.squeeze(2).unsqueeze(0), None                              # [1, T, heads, d]
    new_k, new_v = keys[..., base:s, :].clone(), values[..., base:s, :].clone()   # [1, kv, T, d]
    out = torch.empty(t, heads, 1, d, dtype=query.dtype)
    try:
        for members, path in layout.groups:
            n, index = len(members), list(members)
            # 1. this group's keys after the cache, in path order  2. its rows, each over its prefix
            keys[..., base:base + len(path), :] = new_k[..., list(path), :]
            values[..., base:base + len(path), :] = new_v[..., list(path), :]
            with threads(SDPA_THREADS):
                out[index] = F.scaled_dot_product_attention(
                    rows[index], keys.expand(n, kv, padded, d), values.expand(n, kv, padded, d),
                    attn_mask=visible[index], scale=scaling, enable_gqa=heads != kv)
    finally:                                                                   # 3. the cache as it was
        keys[..., base:s, :] = new_k
        values[..., base:s, :] = new_v
    return out.squeeze(2).unsqueeze(0), None


def register() -> None:
    """Make :data:`NAME` and :data:`ROWS_NAME` known to transformers (idempotent); their masks are built as
    ``sdpa``'s."""
    for name, function in ((NAME, gqa_sdpa_forward), (ROWS_NAME, rows_sdpa_forward)):
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, function)
        if name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def use_gqa_attention(model: Any, row_exact: bool = False) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`NAME` (``row_exact``: :data:`ROWS_NAME`); whether it did (other
    implementations stay as they are)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME, ROWS_NAME) \
            or not hasattr(model, "set_attn_implementation"):
        return False
    register()
    name = ROWS_NAME if row_exact else NAME
    model.set_attn_implementation(name)
    return config._attn_implementation == name
